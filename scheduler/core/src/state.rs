//! What the scheduler is told: nodes, running jobs, pending jobs and past usage.
//!
//! Times are milliseconds on the caller's clock (the controller uses the Unix epoch, a simulator
//! its own); durations (time limits) are milliseconds too.

use std::collections::{BTreeMap, BTreeSet};

use wharf_api::JobId;

use crate::select::Selection;
use crate::tres::{Gpu, Request};

/// A time, in milliseconds.
pub type Time = u64;

/// Whether a node takes new work.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub enum NodeState {
    /// Takes work.
    #[default]
    Up,
    /// Keeps its running jobs, takes no new ones.
    Drain,
    /// Unreachable: takes nothing.
    Down,
}

/// A node as its agent reported it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    /// Node name, unique.
    pub name: String,
    /// Whether it takes work.
    pub state: NodeState,
    /// The CPU ids jobs may use.
    pub cpu_ids: Vec<u32>,
    /// Memory jobs may use, bytes.
    pub memory: u64,
    /// GPUs with their own ids and types.
    pub gpus: Vec<Gpu>,
    /// NUMA node of each CPU in `cpu_ids` (same order); empty when unknown or one node.
    pub cpu_numa: Vec<u32>,
    /// Features its admin gave it, for jobs' constraints (GPU types are not features).
    pub features: Vec<String>,
}

impl Node {
    /// An up node with CPU ids `0..cpus` and these GPUs.
    pub fn new(name: &str, cpus: u32, memory: u64, gpus: Vec<Gpu>) -> Node {
        Node {
            name: name.into(),
            state: NodeState::Up,
            cpu_ids: (0..cpus).collect(),
            memory,
            gpus,
            cpu_numa: Vec::new(),
            features: Vec::new(),
        }
    }

    /// `n` GPUs with ids `0..n`, all of type `kind`: for agents that report only a count.
    pub fn numbered_gpus(n: u32, kind: &str) -> Vec<Gpu> {
        (0..n).map(|id| Gpu::new(id, kind)).collect()
    }
}

/// What a job holds on one node.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct Alloc {
    /// Node name.
    pub node: String,
    /// The node's CPU ids.
    pub cpu_ids: Vec<u32>,
    /// The node's GPU ids.
    pub gpu_ids: Vec<u32>,
    /// Memory, bytes.
    pub memory: u64,
}

/// Who a job runs for: its user and the account (in the account tree) it is charged to.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct Assoc {
    /// Account.
    pub account: String,
    /// User name.
    pub user: String,
}

impl Assoc {
    /// `user` in `account`.
    pub fn new(account: &str, user: &str) -> Assoc {
        Assoc {
            account: account.into(),
            user: user.into(),
        }
    }
}

/// A job that holds resources now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunningJob {
    /// Job id.
    pub id: JobId,
    /// Who it runs for (its accrued usage counts toward fair share).
    pub assoc: Assoc,
    /// Partition it runs in (for billing weights); `None` for the default.
    pub partition: Option<String>,
    /// QoS it runs in (counts toward that QoS's limits); `None` for none.
    pub qos: Option<String>,
    /// When it started.
    pub start: Time,
    /// Its time limit, ms: it is expected to end by `start + time_limit`.
    pub time_limit: Time,
    /// What it holds, one entry per node.
    pub allocs: Vec<Alloc>,
    /// Its rendezvous port, held on each of its nodes until it ends.
    pub port: Option<u16>,
}

/// Why a job is held.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Hold {
    /// By its owner.
    User,
    /// By an admin.
    Admin,
}

/// A job waiting to start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingJob {
    /// Job id.
    pub id: JobId,
    /// Who it runs for.
    pub assoc: Assoc,
    /// Partition it asked for; `None` takes the default partition.
    pub partition: Option<String>,
    /// QoS name; `None` for none (QoS priority 0).
    pub qos: Option<String>,
    /// What it needs per node.
    pub request: Request,
    /// Time limit, ms; `None` takes the partition's DefaultTime, else the config's.
    pub time_limit: Option<Time>,
    /// Submit time (age counts from here, or from `begin` when later).
    pub submit: Time,
    /// Not before this time.
    pub begin: Option<Time>,
    /// Held, and by whom.
    pub hold: Option<Hold>,
    /// Slurm's nice: subtracted from the priority.
    pub nice: i32,
    /// A priority an admin fixed: it replaces the computed one (nice included).
    pub priority: Option<u64>,
    /// Jobs that must leave the queue first (afterany): while any of them is pending or
    /// running, this one waits with reason `Dependency`.
    pub after: Vec<JobId>,
    /// Which nodes it may use and whether it takes them whole.
    pub select: Selection,
}

impl PendingJob {
    /// A job with defaults for everything but its id, owner, request and submit time.
    pub fn new(id: JobId, assoc: Assoc, request: Request, submit: Time) -> PendingJob {
        PendingJob {
            id,
            assoc,
            partition: None,
            qos: None,
            request,
            time_limit: None,
            submit,
            begin: None,
            hold: None,
            nice: 0,
            priority: None,
            after: Vec::new(),
            select: Selection::default(),
        }
    }
}

/// Everything one pass looks at.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct State {
    /// Nodes, any order (names unique).
    pub nodes: Vec<Node>,
    /// Jobs holding resources.
    pub running: Vec<RunningJob>,
    /// Jobs waiting, any order.
    pub pending: Vec<PendingJob>,
    /// Past usage per association, billing-weighted TRES-seconds already decayed to `now`
    /// (see [`crate::UsageLedger`]). Running jobs' usage so far is added by the pass.
    pub usage: BTreeMap<Assoc, f64>,
    /// Running jobs a stop was sent to (a cancel, a preemption, a requeue): their resources
    /// are taken to come back at once, and they are never chosen to be preempted again.
    pub stopping: BTreeSet<JobId>,
    /// The budget period and what ended runs used in it, for budgets (GrpTRESMins); unused
    /// when none is configured.
    pub budget: crate::limits::BudgetUsage,
    /// Pending jobs that held a reservation after the last pass (kept by
    /// [`State::keep_reservations`]). Under the multifactor policy, those that have waited
    /// [`crate::Config::keep_reservations_after`] come before every other job of their
    /// partition tier, in the order the reservations were made.
    pub reserved: BTreeMap<JobId, KeptReservation>,
    /// Jobs still in the system that the caller left out of `pending` and `running` (array
    /// tasks over their throttle, jobs waiting for a requeue to finish): a job that depends on
    /// one of them still waits for it.
    pub outside: BTreeSet<JobId>,
}

/// A reservation a pass made, kept for the next one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeptReservation {
    /// Its place among the pass's reservations, in the order they were made.
    pub place: u32,
    /// When it was to start.
    pub start: Time,
}

impl State {
    /// Keeps the reservations `plan` made for the next pass, in the order it made them. A job
    /// that got none in `plan` (it started, left, or can no longer get one) is dropped.
    pub fn keep_reservations(&mut self, plan: &crate::Plan) {
        self.reserved = kept_reservations(plan);
    }
}

/// What [`State::keep_reservations`] keeps of `plan`.
pub fn kept_reservations(plan: &crate::Plan) -> BTreeMap<JobId, KeptReservation> {
    (plan.reservations.iter().enumerate())
        .map(|(place, r)| {
            let kept = KeptReservation {
                place: place as u32,
                start: r.start,
            };
            (r.job, kept)
        })
        .collect()
}
