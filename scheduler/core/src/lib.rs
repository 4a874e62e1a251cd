//! The scheduler's policy, as pure functions: no IO, no clock, no hash order.
//!
//! The caller builds a [`State`] (nodes with their own CPU and GPU ids, running jobs with
//! their start times and time limits, pending jobs, decayed usage), picks a [`Config`] (FCFS,
//! EASY or the multifactor policy, partitions, account tree, QoS, weights) and calls
//! [`schedule`] with the time. The [`Plan`] says which jobs start where with which ids, which
//! jobs hold reservations and when they are expected to start, and for every pending job its
//! priority factors and, when it waits, a typed [`PendingReason`].
//!
//! ```
//! use wharf_core::{schedule, Assoc, Config, Gpu, Node, PendingJob, Request, State};
//!
//! let gpus = vec![Gpu::new(0, "h100"), Gpu::new(1, "h100"), Gpu::new(3, "h100")];
//! let node = Node::new("n1", 8, 64 << 30, gpus);
//! let mut req = Request::per_node(2, 4 << 30, 2);
//! req.gpu_kind = Some("h100".into());
//! let job = PendingJob::new(1, Assoc::new("physics", "ann"), req, 0);
//! let state = State { nodes: vec![node], pending: vec![job], ..State::default() };
//! let plan = schedule(1_000, &state, &Config::default());
//! assert_eq!(plan.starts[0].allocs[0].gpu_ids, vec![0, 1]);
//! assert_eq!(plan.starts[0].allocs[0].cpu_ids, vec![0, 1]);
//! ```

mod accrual;
mod backfill;
mod config;
pub mod cycle;
pub mod fairshare;
mod incremental;
pub mod limits;
mod live;
mod partition;
mod placement;
mod plan;
mod ports;
mod preempt;
mod priority;
mod profile;
mod queue;
pub mod select;
mod state;
mod topology;
mod tres;

pub use config::{
    Account, Billing, Config, Partition, PartitionState, Policy, PreemptMode, Qos, UserShares,
    Weights,
};
pub use fairshare::UsageLedger;
pub use incremental::Scheduler;
pub use limits::{
    AssocLimits, BudgetPeriod, BudgetTres, BudgetUsage, LimitReason, Limits, QosLimits, TresKind,
    TresLimit, TresMins, TresMinutes,
};
pub use live::Live;
pub use partition::DEFAULT_PARTITION;
pub use plan::{Plan, Preemption, Priority, Reservation, Start, Waiting};
pub use select::Selection;
pub use state::{
    kept_reservations, Alloc, Assoc, Hold, KeptReservation, Node, NodeState, PendingJob,
    RunningJob, State, Time,
};
pub use tres::{Gpu, Request, GPU_SLOTS};
pub use wharf_api::pending::PendingReason;

use std::collections::BTreeSet;

use partition::Partitions;
use placement::Table;
use priority::Scale;
use wharf_api::JobId;

/// One scheduling pass at time `now` (ms). Pure: the same arguments give the same plan.
/// [`Scheduler`] gives the same plans faster when passes follow one another.
pub fn schedule(now: Time, state: &State, config: &Config) -> Plan {
    // Ties between nodes go by name, whatever order the caller keeps them in.
    if !state.nodes.is_sorted_by(|a, b| a.name <= b.name) {
        let mut sorted = state.clone();
        sorted.nodes.sort_by(|a, b| a.name.cmp(&b.name));
        return schedule(now, &sorted, config);
    }
    let parts = Partitions::resolve(config, &state.nodes);
    let mut table = Table::build(&state.nodes, &state.running, &state.stopping, &parts, now);
    let runs = queue::runs(&state.pending);
    let accruals = accrual::Accruals::of(&state.running, &parts);
    pass(now, state, config, &parts, &mut table, &runs, &accruals)
}

/// The fair-share tree at `now` as `wharf share` shows it: usage is `state.usage` plus what
/// `state.running` have used so far, and the users are those with pending jobs or usage (a
/// running job's use so far counts), so each user's factor is the one a pass at `now` would
/// give its jobs.
pub fn fair_share(now: Time, state: &State, config: &Config) -> Vec<wharf_api::share::ShareRow> {
    let parts = Partitions::resolve(config, &state.nodes);
    let usage = accrual::Accruals::of(&state.running, &parts).usage_now(
        now,
        config.half_life,
        &state.usage,
    );
    // Queues are long and their users few: each association is cloned once.
    let assocs: BTreeSet<&Assoc> = state.pending.iter().map(|j| &j.assoc).collect();
    fairshare::share_rows(config, assocs.into_iter().cloned(), &usage)
}

/// One pass over `state`, whose nodes are sorted by name, given its partitions, a table of
/// its nodes with what its running jobs hold, and its pending list cut into runs of alike
/// jobs (see [`queue::Runs`]; jobs in no run are not pending any more) and what its running jobs accrue (see [`accrual::Accruals`]).
pub(crate) fn pass(
    now: Time,
    state: &State,
    config: &Config,
    parts: &Partitions,
    table: &mut Table,
    runs: &queue::Runs,
    accruals: &accrual::Accruals,
) -> Plan {
    let usage = accruals.usage_now(now, config.half_life, &state.usage);
    let queue::Runs {
        runs,
        ids,
        any_after,
    } = runs;
    let any_after = *any_after;
    // Queues are long and their users few: each association is cloned once.
    let mut assocs: BTreeSet<&Assoc> = BTreeSet::new();
    let mut last: Option<&Assoc> = None;
    for run in runs {
        let assoc = &state.pending[run.start].assoc;
        if last != Some(assoc) {
            assocs.insert(assoc);
            last = Some(assoc);
        }
    }
    let fairshare = fairshare::factors(config, assocs.into_iter().cloned(), &usage);
    let scale = Scale {
        config,
        fairshare: &fairshare,
        max_tier: parts.max_tier,
        max_qos: config.qos.iter().map(|q| q.priority).max().unwrap_or(0),
    };
    // Only dependencies look at which jobs are still in the system.
    let active: Vec<JobId> = if any_after {
        // The runs' jobs: a kept list may still hold jobs that left it (see `Live`).
        let mut active: Vec<JobId> = runs
            .iter()
            .flat_map(|r| ids[r.clone()].iter().copied())
            .chain(state.running.iter().map(|j| j.id))
            .chain(state.outside.iter().copied())
            .collect();
        active.sort_unstable();
        active
    } else {
        Vec::new()
    };
    let waits_on = |job: &PendingJob| {
        job.after
            .iter()
            .find(|d| **d != job.id && active.binary_search(d).is_ok())
            .map(|&on| PendingReason::Dependency { on })
    };

    let mut plan = Plan::default();
    let mut blocked = Vec::new();
    let mut segments = Vec::new();
    let queued = runs.iter().map(|r| r.len()).sum();
    let mut prio: Vec<(JobId, Priority)> = Vec::with_capacity(queued);
    // Alike jobs are admitted, held back and ranked alike: the first of each run stands for
    // the rest (see `queue`).
    for run in runs.iter().cloned() {
        let head = &state.pending[run.start];
        let admitted = parts.admit(head, config);
        let part = admitted.as_ref().ok().map(|&(p, _)| &parts.parts[p]);
        let priority = scale.priority(head, part, now);
        prio.extend(ids[run.clone()].iter().map(|&id| (id, priority)));
        let reason = match (admitted, head.hold) {
            (_, Some(Hold::User)) => Err(PendingReason::JobHeldUser),
            (_, Some(Hold::Admin)) => Err(PendingReason::JobHeldAdmin),
            _ if head.begin.is_some_and(|b| b > now) => Err(PendingReason::BeginTime {
                at: head.begin.unwrap_or(0),
            }),
            (admitted, _) => admitted,
        };
        match reason {
            Err(reason) => blocked.extend(ids[run].iter().map(|&job| Waiting {
                job,
                reason: reason.clone(),
                estimated_start: None,
            })),
            Ok((p, limit)) => {
                let key = order_key(config.policy, parts.parts[p].tier, &priority, head);
                let prefix = (key.0, key.1, key.2);
                if head.after.is_empty() {
                    segments.push(queue::Segment {
                        prefix,
                        jobs: run,
                        part: p,
                        limit,
                    });
                    continue;
                }
                // A job never waits on itself, so alike jobs may differ here: one by one.
                for k in run {
                    match waits_on(&state.pending[k]) {
                        Some(reason) => blocked.push(Waiting {
                            job: state.pending[k].id,
                            reason,
                            estimated_start: None,
                        }),
                        None => segments.push(queue::Segment {
                            prefix,
                            jobs: k..k + 1,
                            part: p,
                            limit,
                        }),
                    }
                }
            }
        }
    }
    let mut ready = queue::order(&state.pending, ids, segments);
    if config.policy == Policy::Multifactor && !state.reserved.is_empty() {
        let keep_after = config.keep_reservations_after;
        let waited = |job: &PendingJob| {
            let since = job.begin.unwrap_or(0).max(job.submit);
            now.saturating_sub(since) >= keep_after
        };
        let places = config.keep_reservations;
        ready = queue::reserved_first(ready, &state.reserved, places, waited, |part| {
            parts.parts[part].tier
        });
    }
    let mut held = limits::Counters::new(config, &state.running, now, &state.budget);
    let victims = preempt::Victims::new(config, parts, &state.running);
    let out = backfill::pass(
        now,
        &state.nodes,
        config,
        parts,
        table,
        &ready,
        &mut held,
        &victims,
        queued,
    );
    plan.starts = out.starts;
    let no_port = ports::assign(&config.rendezvous_ports, &state.running, &mut plan.starts);
    plan.preemptions = out.preemptions;
    plan.reservations = out.reservations;
    plan.waiting = out.waiting;
    plan.waiting.extend(no_port);
    blocked.sort_by_key(|w| w.job);
    plan.waiting.extend(blocked);
    prio.sort_unstable_by_key(|(id, _)| *id);
    plan.priorities = prio;
    plan
}

/// Sort key: FCFS and EASY go by submit time; the multifactor policy by partition tier, then
/// priority, then submit time. Job id breaks ties.
fn order_key(policy: Policy, tier: u32, p: &Priority, job: &PendingJob) -> (u64, u64, Time, JobId) {
    match policy {
        Policy::Fcfs | Policy::Easy => (0, 0, job.submit, job.id),
        Policy::Multifactor => (
            u64::from(u32::MAX - tier),
            u64::MAX - p.value,
            job.submit,
            job.id,
        ),
    }
}
