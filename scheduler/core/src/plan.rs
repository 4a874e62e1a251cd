//! What a pass decides: jobs to start, reservations, and for every pending job its priority
//! and, when it waits, why and until when.

use wharf_api::JobId;

use crate::config::PreemptMode;
use crate::state::{Alloc, Time};
use crate::PendingReason;

/// The multifactor priority of one job, with each factor so it can be shown.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Priority {
    /// The weighted sum, minus nice, at least 0. Higher runs first (within a partition tier).
    pub value: u64,
    /// Age factor, [0, 1].
    pub age: f64,
    /// Fair-share factor, (0, 1].
    pub fairshare: f64,
    /// Job size factor, [0, 1].
    pub job_size: f64,
    /// Width factor, [0, 1]: the cube of the job's share of its partition.
    pub width: f64,
    /// Partition tier factor, [0, 1].
    pub partition: f64,
    /// QoS factor, [0, 1].
    pub qos: f64,
    /// Nice, as given.
    pub nice: i32,
    /// `value` is a priority an admin fixed ([`crate::PendingJob::priority`]).
    pub fixed: bool,
}

/// Start this job now on these nodes with these ids.
#[derive(Debug, Clone, PartialEq)]
pub struct Start {
    /// Job id.
    pub job: JobId,
    /// One entry per node, ids taken from the node's own lists, in rank order: the order of
    /// the nodes in the job's compressed host list, so rank 0 is on its first node.
    pub allocs: Vec<Alloc>,
    /// Its time limit, ms (after partition defaults).
    pub time_limit: Time,
    /// Its rendezvous port (`MASTER_PORT`): free on every one of its nodes; `None` when the
    /// configured range is used up there.
    pub port: Option<u16>,
}

/// A job that stays pending.
#[derive(Debug, Clone, PartialEq)]
pub struct Waiting {
    /// Job id.
    pub job: JobId,
    /// Why.
    pub reason: PendingReason,
    /// When the backfill plan expects it to start: where its reservation starts, or, for
    /// the first [`crate::Config::start_estimates`] waiting jobs past those, where the plan
    /// would place it next.
    pub estimated_start: Option<Time>,
}

/// Resources set aside for a blocked job: nothing that would delay it starts before it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reservation {
    /// Job id.
    pub job: JobId,
    /// Expected start.
    pub start: Time,
    /// Expected end (start + time limit).
    pub end: Time,
    /// Nodes set aside, by name.
    pub nodes: Vec<String>,
}

/// Stop this running job so that a waiting job of higher precedence can start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Preemption {
    /// The running job to stop.
    pub job: JobId,
    /// The pending job it makes room for.
    pub by: JobId,
    /// What becomes of it: requeued or cancelled (never [`PreemptMode::Off`]).
    pub mode: PreemptMode,
}

/// The result of one pass.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Plan {
    /// Jobs to start now, in the order they were decided.
    pub starts: Vec<Start>,
    /// Reservations, highest priority first.
    pub reservations: Vec<Reservation>,
    /// Every pending job not started: those that could run, in scheduling order (then any
    /// job on several nodes that found no free rendezvous port), then those held back by
    /// holds, begin times, dependencies or their partition, by job id.
    pub waiting: Vec<Waiting>,
    /// Every pending job's priority, by job id order.
    pub priorities: Vec<(JobId, Priority)>,
    /// Running jobs to stop for waiting jobs of higher precedence, in the order decided.
    /// Each waiting job they make room for waits with [`PendingReason::Preempting`] and
    /// holds a reservation on their nodes.
    pub preemptions: Vec<Preemption>,
}

impl Plan {
    /// The priority of `job`, if it was pending.
    pub fn priority(&self, job: JobId) -> Option<&Priority> {
        self.priorities
            .binary_search_by_key(&job, |(id, _)| *id)
            .ok()
            .map(|i| &self.priorities[i].1)
    }
}
