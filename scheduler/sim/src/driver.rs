//! The one place the simulator meets `wharf-core`: tells a [`Live`] scheduler what changed
//! (jobs join on submit, move to running on start, leave on end; usage goes into a
//! [`UsageLedger`] on end), so that the core keeps its whole state between passes and a pass
//! costs what changed rather than a read of the whole queue, and turns the plan's starts into
//! the simulator's terms. No policy is decided here: FCFS, EASY and Wharf's policy
//! are the core's own [`Config`]s.
//!
//! A job becomes the core's pending and running job, and a plan becomes starts, through the
//! core's [`cycle`] module: the same code the controller's pass uses
//! (`scheduler/controller/src/cluster/sched.rs`), so the two cannot drift apart.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::time::{Duration, Instant};

use wharf_api::JobId;
use wharf_api::Resources;
use wharf_core::cycle::{self, JobFacts};
use wharf_core::{Account, Billing, Config, Live, Node, Partition, UsageLedger};

use crate::engine::{Placement, SimError, Start};
use crate::workload::{SimJob, Workload};

/// A scheduling policy, as a configuration of the core.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Policy {
    /// First come, first served: submit order, the first job that cannot start blocks the rest.
    Fcfs,
    /// EASY backfill: submit order, one reservation for the first blocked job.
    Easy,
    /// Wharf's configured policy: multifactor priority (Fair Tree fair share, age, size),
    /// reservations for the first N blocked jobs, backfill around them.
    Wharf,
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Policy::Fcfs => "fcfs",
            Policy::Easy => "easy",
            Policy::Wharf => "wharf",
        })
    }
}

/// Wharf's configured policy: the core configuration a controller would run with (the
/// `[scheduler]` section of its config file, see [`crate::config`]); `Default` is the core's
/// default, which is also the controller's when the section is absent. Accounts and partitions
/// come from the workload.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Knobs {
    /// The configuration (its partitions are replaced by the workload's).
    pub config: Config,
    /// Billing weights for every partition of the replay (the config file's default
    /// partition's); `None`: the core's default (CPUs only).
    pub billing: Option<Billing>,
}

/// The core's configuration for `policy` on `workload`: its accounts (with their shares) and
/// partitions, and for Wharf's policy the configured one.
pub fn config_for(policy: Policy, workload: &Workload, knobs: &Knobs) -> Config {
    let mut c = match policy {
        Policy::Fcfs => Config::with_policy(wharf_core::Policy::Fcfs),
        Policy::Easy => Config::with_policy(wharf_core::Policy::Easy),
        Policy::Wharf => knobs.config.clone(),
    };
    let billing = match policy {
        Policy::Wharf => knobs.billing,
        Policy::Fcfs | Policy::Easy => None,
    };
    c.accounts = workload
        .accounts
        .iter()
        .map(|a| Account {
            name: a.name.clone(),
            parent: None,
            shares: a.shares,
        })
        .collect();
    c.partitions = workload
        .partitions
        .iter()
        .map(|(name, nodes)| {
            let nodes: Vec<&str> = nodes.iter().map(String::as_str).collect();
            Partition::new(name, &nodes)
        })
        .collect();
    c.default_partition = None;
    if let Some(b) = billing {
        if c.partitions.is_empty() {
            c.partitions.push(Partition::new("default", &[]));
        }
        for p in &mut c.partitions {
            p.billing = b;
        }
    }
    c
}

/// Drives the core for one replay.
#[derive(Debug)]
pub struct Driver {
    config: Config,
    ledger: UsageLedger,
    node_index: BTreeMap<String, usize>,
    // Every job submitted and not yet ended, as the core's shared pass code takes it.
    facts: BTreeMap<JobId, JobFacts>,
    accounts: Vec<String>,
    partitions: Vec<String>,
    // Wall time spent inside the core's `Live::pass`, for the benchmark's breakdown; it never
    // feeds a decision.
    core_time: Duration,
    live: Live,
    // Jobs that held a reservation after the last pass, and how many times a job still pending
    // lost its reservation to another: a measure of how stable the backfill plan is.
    reserved: BTreeSet<JobId>,
    reservations_dropped: u64,
    // The first start each pending job was shown, and, for each job started since, how far
    // its start fell from that (ms, late positive): how good the plan's estimates are. They
    // never feed a decision.
    first_estimate: BTreeMap<JobId, u64>,
    estimate_errors: Vec<i64>,
}

impl Driver {
    /// A driver for `policy` on `workload`, with Wharf's policy at the core's defaults.
    pub fn new(policy: Policy, workload: &Workload) -> Result<Driver, SimError> {
        Driver::with_knobs(policy, workload, &Knobs::default())
    }

    /// A driver with Wharf's policy tuned by `knobs` (ignored for FCFS and EASY).
    pub fn with_knobs(
        policy: Policy,
        workload: &Workload,
        knobs: &Knobs,
    ) -> Result<Driver, SimError> {
        let config = config_for(policy, workload, knobs);
        let nodes: Vec<Node> = workload
            .nodes
            .iter()
            .map(|n| {
                Node::new(
                    &n.name,
                    n.capacity.cpus,
                    n.capacity.memory,
                    Node::numbered_gpus(n.capacity.gpus, "gpu"),
                )
            })
            .collect();
        Ok(Driver {
            ledger: UsageLedger::new(config.half_life),
            live: Live::new(nodes, config.clone()),
            config,
            node_index: workload
                .nodes
                .iter()
                .enumerate()
                .map(|(i, n)| (n.name.clone(), i))
                .collect(),
            facts: BTreeMap::new(),
            accounts: workload.accounts.iter().map(|a| a.name.clone()).collect(),
            partitions: workload.partitions.iter().map(|p| p.0.clone()).collect(),
            core_time: Duration::ZERO,
            reserved: BTreeSet::new(),
            reservations_dropped: 0,
            first_estimate: BTreeMap::new(),
            estimate_errors: Vec::new(),
        })
    }

    fn partition(&self, job: &SimJob) -> Option<String> {
        job.partition
            .and_then(|p| self.partitions.get(p as usize))
            .cloned()
    }

    /// A workload job in the terms of the core's shared pass code: user `u<n>`, charged to
    /// its account (`root` when the workload names none).
    fn facts(&self, job: &SimJob) -> JobFacts {
        let account = self
            .accounts
            .get(job.account as usize)
            .map(String::as_str)
            .unwrap_or("root");
        JobFacts {
            id: job.id,
            user: format!("u{}", job.user),
            account: Some(account.to_string()),
            partition: self.partition(job),
            resources: Resources {
                cpus: job.per_node.cpus,
                memory: job.per_node.memory,
                gpus: job.per_node.gpus,
            },
            nodes: job.nodes,
            time_limit: job.limit,
            submit: job.submit,
            ..JobFacts::default()
        }
    }

    /// A job was submitted: it joins the queue, or is refused as the controller refuses a
    /// job that could never run ([`cycle::admit`]: more nodes than its partition has).
    pub fn submitted(&mut self, job: &SimJob) -> Result<(), cycle::Refusal> {
        let facts = self.facts(job);
        cycle::admit(&self.config, &facts, self.node_index.len())?;
        self.live.submit(facts.pending(&self.config));
        self.facts.insert(job.id, facts);
        Ok(())
    }

    /// A start was applied: the job holds `allocs` from `now`.
    pub fn started(&mut self, job: &SimJob, start: &Start, nodes: &[String], now: u64) {
        let Some(facts) = self.facts.get(&job.id) else {
            return;
        };
        let allocs = start
            .placements
            .iter()
            .map(|p| (nodes[p.node].clone(), p.cpu_ids.clone(), p.gpu_ids.clone()));
        self.live
            .start(facts.running(&self.config, now, allocs, None));
    }

    /// A job ended: its usage goes into the fair-share ledger.
    pub fn ended(&mut self, job: &SimJob, start: u64, end: u64) {
        self.live.end(job.id);
        let Some(facts) = self.facts.remove(&job.id) else {
            return;
        };
        let billing = self.config.billing_for(facts.partition.as_deref());
        let n = job.nodes as u64;
        let rate = billing.rate(
            job.per_node.cpus as u64 * n,
            job.per_node.memory * n,
            job.per_node.gpus as u64 * n,
        );
        self.ledger
            .record_run(&facts.assoc(&self.config), rate, start, end);
    }

    /// How many times a job that held a reservation lost it while still pending (neither started
    /// nor gone): a high count means the plan churns and idle time held for one job goes to
    /// another.
    pub fn reservations_dropped(&self) -> u64 {
        self.reservations_dropped
    }

    /// How far the jobs started so far began from the first start they were shown.
    pub fn estimates(&self) -> Estimates {
        Estimates::of(&self.estimate_errors)
    }

    /// Wall time spent inside the core's `Live::pass` so far.
    pub fn core_time(&self) -> Duration {
        self.core_time
    }

    /// One scheduling pass at `now`: the core's plan, as starts.
    pub fn pass(&mut self, now: u64) -> Result<Vec<Start>, SimError> {
        self.live.set_usage(self.ledger.snapshot(now));
        let t = Instant::now();
        let plan = self.live.pass(now);
        self.live.keep_reservations(&plan);
        self.core_time += t.elapsed();
        let reserved: BTreeSet<JobId> = plan.reservations.iter().map(|r| r.job).collect();
        let started: BTreeSet<JobId> = plan.starts.iter().map(|s| s.job).collect();
        self.reservations_dropped += self
            .reserved
            .iter()
            .filter(|j| !reserved.contains(j) && !started.contains(j))
            .count() as u64;
        self.reserved = reserved;
        for w in &plan.waiting {
            if let Some(at) = w.estimated_start {
                self.first_estimate.entry(w.job).or_insert(at);
            }
        }
        for s in &plan.starts {
            if let Some(at) = self.first_estimate.remove(&s.job) {
                self.estimate_errors.push(now as i64 - at as i64);
            }
        }
        // Preemptions (`applied.stops`) are not replayed: the simulator has no requeue.
        let applied = cycle::apply(&plan, |id| self.facts.get(&id));
        applied
            .launches
            .into_iter()
            .map(|s| {
                let placements = s
                    .allocs
                    .into_iter()
                    .map(|a| match self.node_index.get(&a.node) {
                        Some(&node) => Ok(Placement {
                            node,
                            cpu_ids: a.cpu_ids,
                            gpu_ids: a.gpu_ids,
                        }),
                        None => Err(SimError::BadPlan {
                            now,
                            what: format!("job {} placed on unknown node {}", s.job, a.node),
                        }),
                    })
                    .collect::<Result<_, _>>()?;
                Ok(Start {
                    job: s.job,
                    placements,
                    time_limit: s.time_limit,
                })
            })
            .collect()
    }
}

/// How good the estimated starts of one replay were: for each job that was shown one before
/// it started, its real start against the first one it was shown.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct Estimates {
    /// Jobs shown an estimated start before they started.
    pub jobs: usize,
    /// Of those, the share that started no later than the first estimate (time limits are
    /// upper bounds, so jobs ahead mostly end early).
    pub on_time: f64,
    /// Median distance between the real start and the first estimate, seconds.
    pub median_error_s: f64,
    /// 90th percentile of that distance, seconds.
    pub p90_error_s: f64,
}

impl Estimates {
    /// The summary of `errors` (real start minus first estimate, ms).
    pub fn of(errors: &[i64]) -> Estimates {
        if errors.is_empty() {
            return Estimates::default();
        }
        let mut abs: Vec<u64> = errors.iter().map(|e| e.unsigned_abs()).collect();
        abs.sort_unstable();
        let at = |q: f64| abs[((abs.len() - 1) as f64 * q).round() as usize] as f64 / 1000.0;
        Estimates {
            jobs: errors.len(),
            on_time: errors.iter().filter(|&&e| e <= 0).count() as f64 / errors.len() as f64,
            median_error_s: at(0.5),
            p90_error_s: at(0.9),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Estimates;

    #[test]
    fn estimates_sum_up_early_and_late_starts() {
        assert_eq!(Estimates::of(&[]), Estimates::default());
        // Three early or on the dot, two late: distances 0, 1, 2, 3 and 10 s.
        let e = Estimates::of(&[0, -1_000, 2_000, -3_000, 10_000]);
        assert_eq!(e.jobs, 5);
        assert!((e.on_time - 0.6).abs() < 1e-9, "{e:?}");
        assert_eq!(e.median_error_s, 2.0);
        assert_eq!(e.p90_error_s, 10.0);
    }
}
