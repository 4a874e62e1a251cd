//! The discrete-event loop: a simulated clock, submit and end events, and one scheduling pass
//! after each batch of events at the same instant.
//!
//! ```text
//!   events (time, kind, job) ──pop all at t──▶ ends free resources, submits queue jobs
//!                                                   │
//!                               driver::pass(t) ◀┘  (the real core decides)
//!                                                   │
//!                          apply_plan(starts, t) ◀──┘  (checks, holds resources, queues ends)
//! ```
//!
//! Ends are handled before submits at the same instant, as on a real cluster where the freed
//! node is seen by the pass that also sees the new job. Events are ordered by (time, kind, job
//! id), never by insertion or hash order, so a replay is a pure function of workload, policy
//! and seed.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};

use wharf_api::{JobId, Resources};

use crate::driver::{Driver, Estimates, Knobs, Policy};
use crate::metrics::Outcome;
use crate::workload::{Measure, SimJob, SimNodeSpec, Workload};

/// Why a replay stopped.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SimError {
    /// The core asked for something the cluster cannot do: a bug in the core or the driver.
    #[error("at t={now} ms the plan is not applicable: {what}")]
    BadPlan {
        /// Simulated time, ms.
        now: u64,
        /// What was wrong.
        what: String,
    },
    /// The policy cannot be built on this core.
    #[error("policy {policy}: {what}")]
    Unsupported {
        /// The policy.
        policy: Policy,
        /// Why.
        what: String,
    },
}

/// A node's state during the replay.
#[derive(Debug, Clone)]
pub struct NodeState {
    /// Name and capacity.
    pub spec: SimNodeSpec,
    /// CPU ids in use.
    pub used_cpus: BTreeSet<u32>,
    /// GPU ids in use.
    pub used_gpus: BTreeSet<u32>,
    /// Memory in use, bytes.
    pub used_memory: u64,
}

/// What one job gets on one node.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Placement {
    /// Index into the cluster's nodes.
    pub node: usize,
    /// CPU ids.
    pub cpu_ids: Vec<u32>,
    /// GPU ids.
    pub gpu_ids: Vec<u32>,
}

/// One start decision from the core, in the simulator's terms.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Start {
    /// Job.
    pub job: JobId,
    /// Where.
    pub placements: Vec<Placement>,
    /// Its time limit as the core set it, ms: it is killed there if still running.
    pub time_limit: u64,
}

/// A job that is running.
#[derive(Debug, Clone)]
pub struct Running {
    /// Index of the job in the workload.
    pub index: usize,
    /// Start time, ms.
    pub start: u64,
    /// Where it runs.
    pub placements: Vec<Placement>,
}

/// A decision as recorded for the determinism check: time, job, and node names with ids.
pub type DecisionLog = Vec<(u64, JobId, Vec<(String, Vec<u32>, Vec<u32>)>)>;

/// The result of a replay.
#[derive(Debug, Clone)]
pub struct Replay {
    /// Finished jobs, in end order.
    pub outcomes: Vec<Outcome>,
    /// Every start, in order.
    pub decisions: DecisionLog,
    /// Jobs still pending when no event was left (the core could never place them).
    pub never_started: Vec<JobId>,
    /// Jobs refused at submit, as the controller refuses them, with the reason.
    pub refused: Vec<(JobId, String)>,
    /// Scheduling passes run.
    pub passes: u64,
    /// Times a still-pending job lost its reservation ([`Driver::reservations_dropped`]).
    pub reservations_dropped: u64,
    /// How good the estimated starts were ([`Driver::estimates`]).
    pub estimates: Estimates,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    End = 0,
    Submit = 1,
}

/// Replays `workload` under `policy` (Wharf's at the core's default configuration).
pub fn replay(workload: &Workload, policy: Policy) -> Result<Replay, SimError> {
    replay_with(workload, policy, &Knobs::default())
}

/// Replays `workload` under `policy`, Wharf's tuned by `knobs`.
pub fn replay_with(workload: &Workload, policy: Policy, knobs: &Knobs) -> Result<Replay, SimError> {
    let mut driver = Driver::with_knobs(policy, workload, knobs)?;
    let mut sim = Sim::new(workload);
    while let Some(now) = sim.next_instant() {
        sim.handle_events(now, &mut driver);
        if sim.pending.is_empty() {
            continue;
        }
        let starts = driver.pass(now)?;
        sim.apply_plan(&starts, now, &mut driver)?;
        sim.passes += 1;
    }
    let mut replay = sim.finish();
    replay.reservations_dropped = driver.reservations_dropped();
    replay.estimates = driver.estimates();
    Ok(replay)
}

/// The simulator's state; public so that benchmarks can drive passes one by one.
#[derive(Debug)]
pub struct Sim<'w> {
    workload: &'w Workload,
    index: BTreeMap<JobId, usize>,
    events: BinaryHeap<Reverse<(u64, Kind, JobId)>>,
    nodes: Vec<NodeState>,
    node_names: Vec<String>,
    pending: BTreeMap<JobId, usize>,
    refused: Vec<(JobId, String)>,
    running: BTreeMap<JobId, Running>,
    outcomes: Vec<Outcome>,
    decisions: DecisionLog,
    passes: u64,
}

impl<'w> Sim<'w> {
    /// A cluster with every node empty and every job's submit queued.
    pub fn new(workload: &'w Workload) -> Sim<'w> {
        let index = workload
            .jobs
            .iter()
            .enumerate()
            .map(|(i, j)| (j.id, i))
            .collect();
        let events = workload
            .jobs
            .iter()
            .map(|j| Reverse((j.submit, Kind::Submit, j.id)))
            .collect();
        Sim {
            workload,
            index,
            events,
            nodes: workload
                .nodes
                .iter()
                .map(|spec| NodeState {
                    spec: spec.clone(),
                    used_cpus: BTreeSet::new(),
                    used_gpus: BTreeSet::new(),
                    used_memory: 0,
                })
                .collect(),
            node_names: workload.nodes.iter().map(|n| n.name.clone()).collect(),
            pending: BTreeMap::new(),
            refused: Vec::new(),
            running: BTreeMap::new(),
            outcomes: Vec::new(),
            decisions: Vec::new(),
            passes: 0,
        }
    }

    /// The time of the next event, if any.
    pub fn next_instant(&self) -> Option<u64> {
        self.events.peek().map(|Reverse((t, _, _))| *t)
    }

    /// Jobs pending now.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    /// Jobs running now.
    pub fn running(&self) -> usize {
        self.running.len()
    }

    /// Handles every event at `now`: ends free their resources, submits join the queue.
    pub fn handle_events(&mut self, now: u64, driver: &mut Driver) {
        while let Some(Reverse((t, kind, id))) = self.events.peek().copied() {
            if t != now {
                break;
            }
            self.events.pop();
            match kind {
                Kind::Submit => {
                    let index = self.index[&id];
                    match driver.submitted(&self.workload.jobs[index]) {
                        Ok(()) => {
                            self.pending.insert(id, index);
                        }
                        Err(r) => self.refused.push((id, r.message)),
                    }
                }
                Kind::End => {
                    if let Some(r) = self.running.remove(&id) {
                        for p in &r.placements {
                            let n = &mut self.nodes[p.node];
                            for c in &p.cpu_ids {
                                n.used_cpus.remove(c);
                            }
                            for g in &p.gpu_ids {
                                n.used_gpus.remove(g);
                            }
                            let job = &self.workload.jobs[r.index];
                            n.used_memory = n.used_memory.saturating_sub(job.per_node.memory);
                        }
                        let job = &self.workload.jobs[r.index];
                        driver.ended(job, r.start, now);
                        self.outcomes.push(Outcome {
                            id,
                            account: job.account,
                            submit: job.submit,
                            start: r.start,
                            end: now,
                            units: units(job, self.workload.measure),
                        });
                    }
                }
            }
        }
    }

    /// Carries out a plan's starts: checks each against the cluster (job pending, right number
    /// of nodes, ids in range and free, memory fits), holds the resources and queues the end.
    ///
    /// What each start is (job, allocations, time limit) was decided by the core's shared
    /// pass code (`wharf_core::cycle::apply`, called by [`Driver::pass`]), as in the
    /// controller (`scheduler/controller/src/cluster/sched.rs`); this step holds the
    /// simulated resources. It checks more than the controller does (which trusts the core),
    /// because a replay is where a core bug should surface. A start that fails a check is
    /// refused before anything is taken, and stops the replay: it would be an over-allocation
    /// in production.
    pub fn apply_plan(
        &mut self,
        starts: &[Start],
        now: u64,
        driver: &mut Driver,
    ) -> Result<(), SimError> {
        for s in starts {
            let bad = |what: String| SimError::BadPlan { now, what };
            let Some(&index) = self.pending.get(&s.job) else {
                return Err(bad(format!("job {} is not pending", s.job)));
            };
            let job = &self.workload.jobs[index];
            let distinct: BTreeSet<usize> = s.placements.iter().map(|p| p.node).collect();
            if distinct.len() != job.nodes as usize || s.placements.len() != job.nodes as usize {
                return Err(bad(format!(
                    "job {} needs {} distinct nodes, plan gives {:?}",
                    s.job, job.nodes, distinct
                )));
            }
            // Check every node before taking anything, so a refused start changes nothing.
            for p in &s.placements {
                let Some(n) = self.nodes.get(p.node) else {
                    return Err(bad(format!("job {}: no node #{}", s.job, p.node)));
                };
                check_ids(
                    &p.cpu_ids,
                    job.per_node.cpus,
                    n.spec.capacity.cpus,
                    &n.used_cpus,
                )
                .map_err(|e| bad(format!("job {} on {}: CPUs {e}", s.job, n.spec.name)))?;
                check_ids(
                    &p.gpu_ids,
                    job.per_node.gpus,
                    n.spec.capacity.gpus,
                    &n.used_gpus,
                )
                .map_err(|e| bad(format!("job {} on {}: GPUs {e}", s.job, n.spec.name)))?;
                if n.used_memory + job.per_node.memory > n.spec.capacity.memory {
                    return Err(bad(format!(
                        "job {} on {}: memory over capacity",
                        s.job, n.spec.name
                    )));
                }
            }
            self.pending.remove(&s.job);
            for p in &s.placements {
                let n = &mut self.nodes[p.node];
                n.used_cpus.extend(&p.cpu_ids);
                n.used_gpus.extend(&p.gpu_ids);
                n.used_memory += job.per_node.memory;
            }
            // The controller kills a job at its limit.
            let end = now + job.run.min(s.time_limit);
            self.events.push(Reverse((end, Kind::End, job.id)));
            driver.started(job, s, &self.node_names, now);
            self.decisions.push((
                now,
                s.job,
                s.placements
                    .iter()
                    .map(|p| {
                        (
                            self.nodes[p.node].spec.name.clone(),
                            p.cpu_ids.clone(),
                            p.gpu_ids.clone(),
                        )
                    })
                    .collect(),
            ));
            self.running.insert(
                s.job,
                Running {
                    index,
                    start: now,
                    placements: s.placements.clone(),
                },
            );
        }
        Ok(())
    }

    /// Ends the replay.
    pub fn finish(self) -> Replay {
        Replay {
            outcomes: self.outcomes,
            decisions: self.decisions,
            never_started: self.pending.keys().copied().collect(),
            refused: self.refused,
            passes: self.passes,
            reservations_dropped: 0,
            estimates: Estimates::default(),
        }
    }
}

fn units(job: &SimJob, measure: Measure) -> u64 {
    match measure {
        Measure::Cpus => job.total_cpus(),
        Measure::Gpus => job.total_gpus(),
    }
}

fn check_ids(ids: &[u32], want: u32, cap: u32, used: &BTreeSet<u32>) -> Result<(), String> {
    let distinct: BTreeSet<u32> = ids.iter().copied().collect();
    if distinct.len() != ids.len() || ids.len() != want as usize {
        return Err(format!("{ids:?} are not {want} distinct ids"));
    }
    if let Some(i) = ids.iter().find(|i| **i >= cap || used.contains(i)) {
        return Err(format!("id {i} is out of range or already taken"));
    }
    Ok(())
}

/// Free resources of a node.
pub fn free(n: &NodeState) -> Resources {
    Resources {
        cpus: n.spec.capacity.cpus - n.used_cpus.len() as u32,
        memory: n.spec.capacity.memory - n.used_memory,
        gpus: n.spec.capacity.gpus - n.used_gpus.len() as u32,
    }
}
