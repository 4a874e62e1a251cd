//! A scheduler that keeps its view of the cluster between passes.
//!
//! [`crate::schedule`] rebuilds every node's free ids and time profile from the running jobs
//! on each call: at 10,000 nodes that is most of a pass. A [`Scheduler`] keeps that table and
//! brings it up to date with what changed since its last pass (jobs that started, ended, were
//! asked to stop, or ran past their limit), so a pass costs what changed plus the queue. The
//! decisions are the same as [`crate::schedule`]'s for the same arguments (a property test
//! holds it to that); the table is rebuilt whole when the nodes or the configuration change.
//!
//! ```
//! use wharf_core::{Config, Node, Scheduler, State};
//! let mut scheduler = Scheduler::default();
//! let state = State { nodes: vec![Node::new("n1", 8, 1 << 34, vec![])], ..State::default() };
//! let plan = scheduler.schedule(0, &state, &Config::default());
//! assert!(plan.starts.is_empty());
//! ```

use std::collections::{BTreeMap, BTreeSet};

use wharf_api::JobId;

use crate::accrual::Accruals;
use crate::config::Config;
use crate::partition::Partitions;
use crate::placement::{release_time, Table, Taken};
use crate::plan::Plan;
use crate::state::{Alloc, Node, RunningJob, State, Time};

/// Keeps the scheduling core's view of nodes and running jobs from one pass to the next.
#[derive(Debug, Default)]
pub struct Scheduler {
    view: Option<View>,
}

/// What the last pass was given and the table built from it.
#[derive(Debug)]
pub(crate) struct View {
    config: Config,
    nodes: Vec<Node>,
    by_name: BTreeMap<String, usize>,
    parts: Partitions,
    table: Table,
    jobs: BTreeMap<JobId, Placed>,
    /// The kept jobs by the end of their time limit: only those past it, and those being
    /// stopped, have their expected end moved by a later pass.
    by_limit: BTreeSet<(Time, JobId)>,
    /// The latest time the expected ends were brought up to.
    refreshed: Time,
}

/// A running job as the table holds it: what the table depends on, and what it took.
#[derive(Debug)]
struct Placed {
    start: Time,
    time_limit: Time,
    allocs: Vec<Alloc>,
    end: Time,
    stopping: bool,
    taken: Vec<Taken>,
}

impl Scheduler {
    /// One scheduling pass at `now`: the plan [`crate::schedule`] would make from the same
    /// arguments.
    pub fn schedule(&mut self, now: Time, state: &State, config: &Config) -> Plan {
        // The kept nodes were sorted: the same nodes need no second look.
        let same_nodes = self.view.as_ref().is_some_and(|v| v.nodes == state.nodes);
        if !same_nodes && !state.nodes.is_sorted_by(|a, b| a.name <= b.name) {
            let mut sorted = state.clone();
            sorted.nodes.sort_by(|a, b| a.name.cmp(&b.name));
            return self.schedule(now, &sorted, config);
        }
        let view = self.sync(now, state, config, same_nodes);
        let accruals = Accruals::of(&state.running, &view.parts);
        view.pass(now, state, &crate::queue::runs(&state.pending), &accruals)
    }

    /// Brings the kept view up to `state` at `now`; `same_nodes`: its nodes are the kept ones.
    fn sync(&mut self, now: Time, state: &State, config: &Config, same_nodes: bool) -> &mut View {
        let stale = self
            .view
            .as_ref()
            .is_none_or(|v| !same_nodes || v.config != *config);
        if stale {
            self.view = None;
        }
        let view = self
            .view
            .get_or_insert_with(|| View::new(config, &state.nodes));
        view.update(now, state);
        view
    }
}

impl View {
    /// Nodes sorted by name with nothing running on them.
    pub(crate) fn new(config: &Config, nodes: &[Node]) -> View {
        let parts = Partitions::resolve(config, nodes);
        View {
            config: config.clone(),
            nodes: nodes.to_vec(),
            by_name: nodes
                .iter()
                .enumerate()
                .map(|(i, n)| (n.name.clone(), i))
                .collect(),
            table: Table::empty(nodes, &parts),
            parts,
            jobs: BTreeMap::new(),
            by_limit: BTreeSet::new(),
            refreshed: 0,
        }
    }

    /// The kept configuration.
    pub(crate) fn config(&self) -> &Config {
        &self.config
    }

    /// The partitions resolved on the kept nodes.
    pub(crate) fn parts(&self) -> &Partitions {
        &self.parts
    }

    /// One pass over `state` (its nodes and running jobs are the view's), with its pending
    /// list cut into `runs` and its running jobs' `accruals`: every node it changes is put
    /// back afterwards.
    pub(crate) fn pass(
        &mut self,
        now: Time,
        state: &State,
        runs: &crate::queue::Runs,
        accruals: &Accruals,
    ) -> Plan {
        self.table.begin_pass();
        let (config, parts) = (&self.config, &self.parts);
        let plan = crate::pass(now, state, config, parts, &mut self.table, runs, accruals);
        self.table.end_pass();
        plan
    }

    /// Job `id` is held in the table.
    pub(crate) fn holds(&self, id: JobId) -> bool {
        self.jobs.contains_key(&id)
    }

    /// Job `id` no longer runs: what it held is given back.
    pub(crate) fn release(&mut self, id: JobId) {
        if let Some(placed) = self.jobs.remove(&id) {
            self.by_limit.remove(&(placed.limit_end(), id));
            for t in &placed.taken {
                self.table.unhold(id, t, placed.end);
            }
        }
    }

    /// Moves the expected ends of the kept jobs that are late or being stopped at `now`.
    /// Only those past their time limit, those in `stopping` and, when the clock went back,
    /// all are looked at: a job marked stopping must stay so until it is released.
    pub(crate) fn refresh(&mut self, now: Time, stopping: &BTreeSet<JobId>) {
        let look: Vec<JobId> = if now < self.refreshed {
            self.jobs.keys().copied().collect()
        } else {
            let late = self.by_limit.range(..=(now, JobId::MAX)).map(|&(_, id)| id);
            late.chain(stopping.iter().copied()).collect()
        };
        self.refreshed = now;
        for id in look {
            let Some(placed) = self.jobs.get_mut(&id) else {
                continue;
            };
            let stops = stopping.contains(&id);
            let end = if stops {
                now + 1
            } else {
                placed.start.saturating_add(placed.time_limit).max(now + 1)
            };
            if end != placed.end || stops != placed.stopping {
                for t in &placed.taken {
                    self.table.move_hold(t.node, id, placed.end, end, stops);
                }
                placed.end = end;
                placed.stopping = stops;
            }
        }
    }

    /// `job`, not held yet, runs; call in id order, as [`Table::build`] adds jobs.
    pub(crate) fn hold(&mut self, job: &RunningJob, stopping: bool, now: Time) {
        let end = release_time(job, stopping, now);
        let taken = job
            .allocs
            .iter()
            .filter_map(|a| {
                let i = *self.by_name.get(&a.node)?;
                Some(self.table.hold(i, job.id, a, end, stopping))
            })
            .collect();
        let placed = Placed {
            start: job.start,
            time_limit: job.time_limit,
            allocs: job.allocs.clone(),
            end,
            stopping,
            taken,
        };
        self.by_limit.insert((placed.limit_end(), job.id));
        self.jobs.insert(job.id, placed);
    }

    /// Gives back what jobs no longer running held, moves the expected ends of jobs that are
    /// late or being stopped, and takes what new running jobs hold.
    fn update(&mut self, now: Time, state: &State) {
        let mut ids: Vec<(JobId, usize)> = state
            .running
            .iter()
            .enumerate()
            .map(|(k, j)| (j.id, k))
            .collect();
        ids.sort_unstable();
        ids.dedup_by_key(|(id, _)| *id);

        let mut gone: Vec<JobId> = Vec::new();
        let mut moved: Vec<(JobId, Time, bool)> = Vec::new();
        let mut new: Vec<usize> = Vec::new();
        let mut next = ids.iter().peekable();
        for (&id, placed) in &self.jobs {
            while let Some(&&(nid, k)) = next.peek() {
                if nid >= id {
                    break;
                }
                new.push(k);
                next.next();
            }
            match next.peek() {
                Some(&&(nid, k)) if nid == id => {
                    next.next();
                    let job = &state.running[k];
                    if !placed.is(job) {
                        gone.push(id);
                        new.push(k);
                        continue;
                    }
                    let stopping = state.stopping.contains(&id);
                    let end = release_time(job, stopping, now);
                    if end != placed.end || stopping != placed.stopping {
                        moved.push((id, end, stopping));
                    }
                }
                _ => gone.push(id),
            }
        }
        new.extend(next.map(|&(_, k)| k));

        for id in gone {
            self.release(id);
        }
        for (id, end, stopping) in moved {
            if let Some(placed) = self.jobs.get_mut(&id) {
                for t in &placed.taken {
                    self.table.move_hold(t.node, id, placed.end, end, stopping);
                }
                placed.end = end;
                placed.stopping = stopping;
            }
        }
        // In id order, as `Table::build` adds them.
        new.sort_unstable_by_key(|&k| state.running[k].id);
        for k in new {
            let job = &state.running[k];
            self.hold(job, state.stopping.contains(&job.id), now);
        }
    }
}

impl Placed {
    /// The end of its time limit.
    fn limit_end(&self) -> Time {
        self.start.saturating_add(self.time_limit)
    }

    /// `job` holds what this was made from (its other fields do not touch the table).
    fn is(&self, job: &RunningJob) -> bool {
        self.start == job.start && self.time_limit == job.time_limit && self.allocs == job.allocs
    }
}
