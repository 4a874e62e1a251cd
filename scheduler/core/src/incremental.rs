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

use std::collections::BTreeMap;

use wharf_api::JobId;

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
struct View {
    config: Config,
    nodes: Vec<Node>,
    by_name: BTreeMap<String, usize>,
    parts: Partitions,
    table: Table,
    jobs: BTreeMap<JobId, Placed>,
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
        view.table.begin_pass();
        let plan = crate::pass(now, state, config, &view.parts, &mut view.table);
        view.table.end_pass();
        plan
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
        let view = match &mut self.view {
            Some(view) => view,
            slot => {
                let parts = Partitions::resolve(config, &state.nodes);
                slot.insert(View {
                    config: config.clone(),
                    nodes: state.nodes.clone(),
                    by_name: state
                        .nodes
                        .iter()
                        .enumerate()
                        .map(|(i, n)| (n.name.clone(), i))
                        .collect(),
                    table: Table::empty(&state.nodes, &parts),
                    parts,
                    jobs: BTreeMap::new(),
                })
            }
        };
        view.update(now, state);
        view
    }
}

impl View {
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
            if let Some(placed) = self.jobs.remove(&id) {
                for t in &placed.taken {
                    self.table.unhold(id, t, placed.end);
                }
            }
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
            let stopping = state.stopping.contains(&job.id);
            let end = release_time(job, stopping, now);
            let taken = job
                .allocs
                .iter()
                .filter_map(|a| {
                    let i = *self.by_name.get(&a.node)?;
                    Some(self.table.hold(i, job.id, a, end, stopping))
                })
                .collect();
            self.jobs.insert(
                job.id,
                Placed {
                    start: job.start,
                    time_limit: job.time_limit,
                    allocs: job.allocs.clone(),
                    end,
                    stopping,
                    taken,
                },
            );
        }
    }
}

impl Placed {
    /// `job` holds what this was made from (its other fields do not touch the table).
    fn is(&self, job: &RunningJob) -> bool {
        self.start == job.start && self.time_limit == job.time_limit && self.allocs == job.allocs
    }
}
