//! A scheduler that is told what changed, and keeps the whole state between passes.
//!
//! [`crate::Scheduler`] is given the whole [`State`] each pass and reads all of it: every node
//! and running job to find what changed, every pending job to cut the queue into runs of alike
//! jobs. With 100,000 pending jobs that reading is most of a pass. A [`Live`] is told the
//! changes instead (a job submitted, started, withdrawn, ended, asked to stop; new usage) and
//! keeps the state, its nodes' table and its pending list's runs up to date with them, so
//! that a pass costs what changed plus the runs, the jobs the pass looks at and the plan
//! itself (every pending job still gets its priority and, when it waits, its reason). Its
//! plans are exactly those of [`crate::schedule`] on [`Live::state`] at the same time, which
//! a property test checks pass after pass (`scheduler/core/tests/live.rs`).
//!
//! ```
//! use wharf_core::{Assoc, Config, Live, Node, PendingJob, Request};
//! let mut live = Live::new(vec![Node::new("n1", 8, 1 << 34, vec![])], Config::default());
//! let req = Request::per_node(2, 1 << 30, 0);
//! live.submit(PendingJob::new(1, Assoc::new("physics", "ann"), req, 0));
//! let plan = live.pass(1_000);
//! assert_eq!(plan.starts[0].job, 1);
//! let config = live.config().clone();
//! assert_eq!(plan, wharf_core::schedule(1_000, live.state(), &config));
//! ```

use std::collections::{BTreeMap, BTreeSet};

use wharf_api::JobId;

use crate::accrual::Accruals;
use crate::config::Config;
use crate::incremental::View;
use crate::limits::BudgetUsage;
use crate::plan::Plan;
use crate::queue::{retain_but, Runs};
use crate::state::{Assoc, Node, PendingJob, RunningJob, State, Time};

/// Keeps the scheduling core's whole state, told what changed between passes.
///
/// Every method but [`Live::pass`] only records: it costs about a lookup, and the work it
/// implies is done once for all changes at the next pass (or [`Live::state`]).
#[derive(Debug)]
pub struct Live {
    view: View,
    state: State,
    runs: Runs,
    /// What the running jobs accrue, in the running list's order.
    accruals: Accruals,
    /// Each listed job's place in the list as a number that only grows: positions move as
    /// the list is closed up, the order of these numbers does not.
    seq: Vec<u64>,
    place: BTreeMap<JobId, u64>,
    next_seq: u64,
    /// Pending jobs with dependencies.
    with_after: usize,
    /// By list position: the job left the queue. It stays listed, in no run, until enough
    /// have left that closing the list up is worth its cost.
    left: Vec<bool>,
    left_count: usize,
    /// Running jobs that ended since the list was last closed up.
    ended: BTreeSet<JobId>,
    /// Jobs the table has yet to give back (ended), and to hold (started), at the next pass.
    release: Vec<JobId>,
    hold: BTreeMap<JobId, RunningJob>,
}

impl Live {
    /// A cluster of `nodes` (any order; names unique) with no jobs, scheduled by `config`.
    pub fn new(mut nodes: Vec<Node>, config: Config) -> Live {
        // Ties between nodes go by name, as in `schedule`.
        nodes.sort_by(|a, b| a.name.cmp(&b.name));
        Live {
            view: View::new(&config, &nodes),
            state: State {
                nodes,
                ..State::default()
            },
            runs: Runs::default(),
            accruals: Accruals::default(),
            seq: Vec::new(),
            place: BTreeMap::new(),
            next_seq: 0,
            with_after: 0,
            left: Vec::new(),
            left_count: 0,
            ended: BTreeSet::new(),
            release: Vec::new(),
            hold: BTreeMap::new(),
        }
    }

    /// The configuration passes run with.
    pub fn config(&self) -> &Config {
        self.view.config()
    }

    /// The state as the next pass sees it (at the time it is given): nodes sorted by name,
    /// pending jobs in the order they were submitted, running jobs in the order they started.
    pub fn state(&mut self) -> &State {
        self.close_up();
        self.close_up_pending();
        &self.state
    }

    /// `job` joins the queue at its end (one pending under the same id is withdrawn first).
    pub fn submit(&mut self, job: PendingJob) {
        self.withdraw(job.id);
        self.runs.push(self.state.pending.last(), &job);
        self.with_after += usize::from(!job.after.is_empty());
        self.place.insert(job.id, self.next_seq);
        self.seq.push(self.next_seq);
        self.left.push(false);
        self.next_seq += 1;
        self.state.pending.push(job);
    }

    /// Pending job `id` leaves the queue without starting (cancelled, or no longer known);
    /// nothing when it is not pending.
    pub fn withdraw(&mut self, id: JobId) {
        let Some(s) = self.place.remove(&id) else {
            return;
        };
        let Ok(k) = self.seq.binary_search(&s) else {
            return;
        };
        self.left[k] = true;
        self.left_count += 1;
        self.with_after -= usize::from(!self.state.pending[k].after.is_empty());
        self.runs.cut(k);
        self.runs.any_after = self.with_after > 0;
    }

    /// `job` runs from now on, holding its allocations: it leaves the queue when pending, and
    /// a running job of the same id is taken to have ended first.
    pub fn start(&mut self, job: RunningJob) {
        self.withdraw(job.id);
        let ran = self.view.holds(job.id) || self.hold.contains_key(&job.id);
        if ran || self.ended.contains(&job.id) {
            self.end(job.id);
            self.close_up();
        }
        self.hold.insert(job.id, job.clone());
        self.accruals.push(&job, self.view.parts());
        self.state.running.push(job);
    }

    /// Running job `id` ended: what it held comes back, and it is no longer stopping.
    pub fn end(&mut self, id: JobId) {
        if self.hold.remove(&id).is_none() && self.view.holds(id) {
            self.release.push(id);
        }
        self.ended.insert(id);
        self.state.stopping.remove(&id);
    }

    /// A stop was sent to running job `id` (a cancel, a preemption, a requeue): its resources
    /// are taken to come back at once, and it is never chosen to be preempted again.
    pub fn stop(&mut self, id: JobId) {
        self.state.stopping.insert(id);
    }

    /// Past usage per association, already decayed to the next pass's time
    /// ([`State::usage`]).
    pub fn set_usage(&mut self, usage: BTreeMap<Assoc, f64>) {
        self.state.usage = usage;
    }

    /// The budget period and what ended runs used in it ([`State::budget`]).
    pub fn set_budget(&mut self, budget: BudgetUsage) {
        self.state.budget = budget;
    }

    /// New nodes or a new configuration: the table is built again from the running jobs.
    pub fn reset(&mut self, mut nodes: Vec<Node>, config: Config) {
        self.close_up();
        nodes.sort_by(|a, b| a.name.cmp(&b.name));
        self.view = View::new(&config, &nodes);
        self.state.nodes = nodes;
        self.release.clear();
        self.accruals = Accruals::of(&self.state.running, self.view.parts());
        self.hold = self
            .state
            .running
            .iter()
            .map(|j| (j.id, j.clone()))
            .collect();
    }

    /// Keeps the reservations of `plan` for the next pass (see [`State::keep_reservations`]).
    pub fn keep_reservations(&mut self, plan: &Plan) {
        self.state.keep_reservations(plan);
    }

    /// One scheduling pass at `now`: the plan [`crate::schedule`] would make from
    /// [`Live::state`] and [`Live::config`].
    pub fn pass(&mut self, now: Time) -> Plan {
        self.close_up();
        // Jobs that left stay listed (in no run) until they are as many as those pending:
        // the list is closed up once per that many leaving, not at every pass.
        if self.left_count > self.state.pending.len() - self.left_count {
            self.close_up_pending();
        }
        // As a kept view follows a whole state: gone jobs first, then late or stopping ones
        // moved, then new ones in id order.
        for id in std::mem::take(&mut self.release) {
            self.view.release(id);
        }
        self.view.refresh(now, &self.state.stopping);
        for (id, job) in std::mem::take(&mut self.hold) {
            self.view.hold(&job, self.state.stopping.contains(&id), now);
        }
        self.view.pass(now, &self.state, &self.runs, &self.accruals)
    }

    /// Takes the jobs that left the queue out of the pending list.
    fn close_up_pending(&mut self) {
        if self.left_count == 0 {
            return;
        }
        let gone: Vec<usize> = (self.left.iter().enumerate())
            .filter(|(_, &l)| l)
            .map(|(k, _)| k)
            .collect();
        retain_but(&mut self.state.pending, &gone);
        retain_but(&mut self.seq, &gone);
        retain_but(&mut self.left, &gone);
        self.left_count = 0;
        self.runs
            .close_up(&self.state.pending, &gone, self.with_after > 0);
    }

    /// Takes the jobs that ended out of the running list.
    fn close_up(&mut self) {
        if !self.ended.is_empty() {
            let ended = std::mem::take(&mut self.ended);
            let gone: Vec<usize> = (self.state.running.iter().enumerate())
                .filter(|(_, j)| ended.contains(&j.id))
                .map(|(k, _)| k)
                .collect();
            retain_but(&mut self.state.running, &gone);
            retain_but(&mut self.accruals.jobs, &gone);
        }
    }
}
