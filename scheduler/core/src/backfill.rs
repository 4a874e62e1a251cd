//! The pass: jobs in scheduling order start where they fit now; the first blocked jobs get
//! reservations at the earliest time their shape fits; later jobs start now only when they
//! delay no reservation (they fit beside it or end before it). FCFS makes no reservation and
//! stops at the first blocked job; EASY makes one; the multifactor policy makes
//! [`crate::Config::reservations`], one more for the first blocked job of each association
//! that holds none (up to [`crate::Config::assoc_reservations`]), and one for every job that
//! keeps the reservation it held (see [`crate::queue::reserved_first`]).
//!
//! Cost: a job is tried against the free-capacity index of its partition, not every node; a
//! shape that failed to start makes every larger-or-equal, longer-or-equal job of the same
//! partition fail at once (starts and reservations only ever take capacity away within a
//! pass); only reserved jobs look at every node's time profile.

use std::collections::{BTreeMap, BTreeSet};

use wharf_api::JobId;

use crate::config::{Config, Policy};
use crate::limits::Counters;
use crate::partition::Partitions;
use crate::placement::{in_rank_order, Fit, Table};
use crate::plan::{Preemption, Reservation, Start, Waiting};
use crate::preempt::{self, Asker, Victims};
use crate::select::{why_none, Selection};
use crate::state::{Assoc, Node, PendingJob, Time};
use crate::tres::Tres;
use crate::PendingReason;

/// A job that passed every check but resources: its partition and time limit.
#[derive(Clone, Copy)]
pub(crate) struct Ready<'a> {
    pub job: &'a PendingJob,
    /// Its id (kept here so that a job decided without a look at it is not read at all).
    pub id: JobId,
    pub part: usize,
    pub limit: Time,
    /// The ready job just before it is alike (see [`crate::queue::alike`]).
    pub alike_prev: bool,
    /// It keeps the reservation it held after the last pass, which started there, if so
    /// (see [`crate::queue::reserved_first`]).
    pub kept: Option<Time>,
}

/// What the pass decided for the ready jobs.
#[derive(Default)]
pub(crate) struct Outcome {
    pub starts: Vec<Start>,
    pub reservations: Vec<Reservation>,
    pub waiting: Vec<Waiting>,
    pub preemptions: Vec<Preemption>,
}

/// A shape that could not start now in one partition.
struct Failed {
    select: Selection,
    kind: Option<String>,
    nodes: u32,
    cpus: u32,
    memory: u64,
    gpus: u32,
    limit: Time,
}

impl Failed {
    fn of(job: &PendingJob, limit: Time) -> Failed {
        let r = &job.request;
        Failed {
            select: job.select.clone(),
            kind: r.gpu_kind.clone(),
            nodes: r.node_count(),
            cpus: r.cpus,
            memory: effective_memory(r),
            gpus: r.gpus,
            limit,
        }
    }

    fn dominated_by(&self, job: &PendingJob, limit: Time) -> bool {
        let r = &job.request;
        self.select == job.select
            && self.kind == r.gpu_kind
            && r.node_count() >= self.nodes
            && r.cpus >= self.cpus
            && effective_memory(r) >= self.memory
            && r.gpus >= self.gpus
            && limit >= self.limit
    }
}

/// The memory a request needs on a node, for comparing requests: all of any node's for one
/// that takes each node's whole memory.
fn effective_memory(r: &crate::Request) -> u64 {
    if r.whole_memory {
        u64::MAX
    } else {
        r.memory
    }
}

/// The nodes a selection allows in one partition (by node index; `None`: all), and why none
/// ever could, if so.
type Allowed = (Option<Vec<bool>>, Option<String>);

/// Most nodes one pass looks at for estimated starts past the reservations (each estimate
/// looks at every node of its job's partition): a partition of 10,000 nodes gets 2, and the
/// default 32 are all made on partitions of up to 625.
const ESTIMATE_LOOKS: usize = 20_000;

/// How many failed shapes each partition remembers.
const FAILED_KEPT: usize = 16;
/// How many node checks a multi-node reservation may spend on candidate start times before
/// it falls back to the time after which nothing changes (at least 32 times are tried). Below
/// the budget the earliest common start is exact.
const MULTI_NODE_BUDGET: usize = 200_000;

/// Runs the pass over `ready`, already in scheduling order. A job that cannot start now
/// preempts `victims` when it may (see [`crate::preempt`]). `queue_len`: how many jobs are
/// pending in all, ready or not.
#[allow(clippy::too_many_arguments)]
pub(crate) fn pass(
    now: Time,
    nodes: &[Node],
    config: &Config,
    parts: &Partitions,
    table: &mut Table,
    ready: &[Ready<'_>],
    held: &mut Counters,
    victims: &Victims<'_>,
    queue_len: usize,
) -> Outcome {
    // Every ready job but those that start waits, and the caller adds the held-back ones:
    // room for the whole queue at once, not a copy at each doubling.
    let mut out = Outcome {
        waiting: Vec::with_capacity(queue_len),
        ..Outcome::default()
    };
    let max_res = config.reservation_limit();
    let max_extra = config.assoc_reservation_limit();
    // Associations holding a reservation in this pass, and how many reservations past the
    // first `max_res` were made (for an association's first blocked job, or kept).
    let mut reserved_for: BTreeSet<&Assoc> = BTreeSet::new();
    let mut extra = 0usize;
    let mut failed: Vec<Vec<Failed>> = (0..parts.parts.len()).map(|_| Vec::new()).collect();
    // Jobs often share a selection (the tasks of an array, one user's jobs): the nodes it
    // allows, and why none could ever do, are worked out once per partition and selection.
    let mut selections: BTreeMap<(usize, &Selection), Allowed> = BTreeMap::new();
    // Partitions with a blocked job so far, and those sharing a node with one: behind it,
    // FCFS starts nothing there (as Slurm's builtin scheduler skips a partition once a job
    // in it could not start; a partition over the same nodes could otherwise take them for
    // ever, FCFS keeping no reservation), and a job that waits there waits for priority.
    // Partitions of other nodes are not held up.
    let mut blocked = vec![false; parts.parts.len()];
    let block = |blocked: &mut Vec<bool>, p: usize| {
        if blocked[p] {
            return;
        }
        let mine: BTreeSet<usize> = parts.parts[p].nodes.iter().copied().collect();
        for (q, part) in parts.parts.iter().enumerate() {
            if q == p || part.nodes.iter().any(|i| mine.contains(i)) {
                blocked[q] = true;
            }
        }
    };
    // Why the job just before waited, when it got neither a reservation nor a preemption:
    // nothing changed since, so an alike job waits for the same reason (behind it, a job
    // that waited for resources now waits for priority).
    let mut last_wait: Option<PendingReason> = None;
    // Waiting jobs that may still get an estimated start once the decisions are made: where
    // each is in `out.waiting` and in `ready`.
    let mut to_estimate: Vec<(usize, usize)> = Vec::new();
    let mut may_estimate = |out: &Outcome, n: usize| {
        if to_estimate.len() < config.start_estimates {
            to_estimate.push((out.waiting.len() - 1, n));
        }
    };
    for (n, r) in ready.iter().enumerate() {
        let req = &r.job.request;
        let sel = &r.job.select;
        let wait = |reason: PendingReason, at: Option<Time>| Waiting {
            job: r.id,
            reason,
            estimated_start: at,
        };
        if n >= config.max_job_test {
            out.waiting.push(wait(PendingReason::Priority, None));
            continue;
        }
        if let (true, Some(last)) = (r.alike_prev, &last_wait) {
            let reason = match last {
                PendingReason::Resources | PendingReason::Priority => PendingReason::Priority,
                other => other.clone(),
            };
            let estimable = reason == PendingReason::Priority;
            last_wait = Some(reason.clone());
            out.waiting.push(wait(reason, None));
            if estimable {
                may_estimate(&out, n);
            }
            continue;
        }
        last_wait = None;
        let (allowed, none) = selections
            .entry((r.part, sel))
            .or_insert_with(|| (sel.mask(nodes), why_none(sel, &parts.parts[r.part], nodes)));
        if let Some(what) = none {
            let reason = PendingReason::NoNodeMatches { what: what.clone() };
            last_wait = Some(reason.clone());
            out.waiting.push(wait(reason, None));
            continue;
        }
        let fit = Fit {
            req,
            allowed: allowed.as_deref(),
            exclusive: sel.exclusive,
        };
        // A job that can never run here says so whatever is ahead of it, and blocks nobody.
        let never = match fit.allowed {
            None => never_fits(table, table.classes[r.part].iter().copied(), &fit),
            Some(_) => {
                let mine = parts.parts[r.part]
                    .nodes
                    .iter()
                    .filter(|&&i| fit.may_use(i));
                let each = mine.map(|&i| (i, 1, usize::from(table.nodes[i].up)));
                never_fits(table, each, &fit)
            }
        };
        if let Some(reason) = never {
            last_wait = Some(reason.clone());
            out.waiting.push(wait(reason, None));
            continue;
        }
        // Over a QoS or association limit now: waits without a reservation and, as in Slurm,
        // holds back no job behind it.
        if let Err(reason) = held.fits(config, r.job, r.limit) {
            let reason = PendingReason::Limit(reason);
            last_wait = Some(reason.clone());
            out.waiting.push(wait(reason, None));
            continue;
        }
        if blocked[r.part] && config.policy == Policy::Fcfs {
            last_wait = Some(PendingReason::Priority);
            out.waiting.push(wait(PendingReason::Priority, None));
            may_estimate(&out, n);
            continue;
        }
        let known_fail = failed[r.part]
            .iter()
            .any(|f| f.dominated_by(r.job, r.limit));
        if !known_fail {
            if let Some(picks) = table.fit_now(r.part, &fit, now, r.limit) {
                // Whole nodes (or their whole memory) are what an exclusive job (or one
                // that asked for `--mem=0`) is charged: within its limits on its request,
                // it may still be over them on its nodes.
                let whole = (fit.exclusive || req.whole_memory).then(|| {
                    held.fits_taken(config, r.job, picks.iter().map(|(_, need)| need), r.limit)
                });
                if let Some(Err(reason)) = whole {
                    let reason = PendingReason::Limit(reason);
                    last_wait = Some(reason.clone());
                    out.waiting.push(wait(reason, None));
                    continue;
                }
                let end = now.saturating_add(r.limit);
                let mut allocs: Vec<_> = picks
                    .iter()
                    .map(|(i, need)| table.allocate(*i, need, end, &nodes[*i].name))
                    .collect();
                in_rank_order(&mut allocs);
                held.add(config, r.job, &allocs, r.limit);
                out.starts.push(Start {
                    job: r.job.id,
                    allocs,
                    time_limit: r.limit,
                    port: None,
                });
                continue;
            }
            let list = &mut failed[r.part];
            if list.len() == FAILED_KEPT {
                list.remove(0);
            }
            list.push(Failed::of(r.job, r.limit));
        }
        // It cannot start now. An exclusive job is charged whole nodes: over the limits on
        // even the smallest nodes it may use, it waits on the limit, and stops or holds
        // nothing for itself, else it would preempt jobs for nodes it may then not take,
        // pass after pass. (One that starts now is checked on the nodes it gets, above.)
        if fit.exclusive && held.active() {
            let mut whole: Vec<Tres> = (parts.parts[r.part].nodes.iter())
                .filter(|&&i| table.nodes[i].up && fit.may_use(i))
                .filter_map(|&i| table.shapes(i, req, true).into_iter().next())
                .collect();
            whole.sort_by_key(|t| (t.gpu_total(), t.cpus, t.memory));
            whole.truncate(req.node_count() as usize);
            if let Err(reason) = held.fits_taken(config, r.job, whole.iter(), r.limit) {
                let reason = PendingReason::Limit(reason);
                last_wait = Some(reason.clone());
                out.waiting.push(wait(reason, None));
                continue;
            }
        }
        let tier = parts.parts[r.part].tier;
        let qos = r.job.qos.as_deref();
        if victims.any_for(tier, qos) {
            let asker = Asker {
                part: r.part,
                tier,
                qos,
                fit,
                limit: r.limit,
            };
            if let Some(c) = preempt::choose(table, parts, victims, &asker, now) {
                out.preemptions
                    .extend(c.victims.iter().map(|&(job, mode)| Preemption {
                        job,
                        by: r.job.id,
                        mode,
                    }));
                let reason = PendingReason::Preempting {
                    victims: c.waits_for,
                };
                out.waiting.push(wait(reason, Some(c.start)));
                reserved_for.insert(&r.job.assoc);
                out.reservations.push(Reservation {
                    job: r.job.id,
                    start: c.start,
                    end: c.start.saturating_add(r.limit),
                    nodes: c
                        .picks
                        .iter()
                        .map(|(i, _)| nodes[*i].name.clone())
                        .collect(),
                });
                block(&mut blocked, r.part);
                continue;
            }
        }
        // Past the first `max_res`, an association's first blocked job still gets one, so
        // that its own later jobs cannot backfill ahead of it forever; a kept one always does
        // (they come first, and were no more than the last pass made).
        let in_depth = out.reservations.len() < max_res;
        let first_of_its_own = extra < max_extra && !reserved_for.contains(&r.job.assoc);
        if in_depth || first_of_its_own || r.kept.is_some() {
            // Past the depth the try itself counts, found or not: each is a search over the
            // partition's nodes, and an association gets one a pass however its jobs fare.
            if !in_depth {
                extra += 1;
                reserved_for.insert(&r.job.assoc);
            }
            let (part, limit, id) = (r.part, r.limit, r.job.id);
            if let Some(res) = reserve(table, parts, part, &fit, now, limit, nodes, id, r.kept) {
                reserved_for.insert(&r.job.assoc);
                out.waiting
                    .push(wait(PendingReason::Resources, Some(res.start)));
                out.reservations.push(res);
                block(&mut blocked, r.part);
                continue;
            }
        }
        let reason = if blocked[r.part] {
            PendingReason::Priority
        } else {
            PendingReason::Resources
        };
        last_wait = Some(reason.clone());
        out.waiting.push(wait(reason, None));
        may_estimate(&out, n);
        block(&mut blocked, r.part);
    }
    // Every decision is made. The next waiting jobs get an estimated start too, each placed
    // at the earliest time its shape fits after every reservation and every estimate before
    // it, in scheduling order (as a conservative backfill would place them). Nothing is held
    // back for these places: a later pass may backfill into them or give them to a job of
    // higher priority. FCFS starts no job before one ahead of it, so there none is placed
    // before the one ahead.
    let mut floor = now;
    let mut looks = 0usize;
    for (w, n) in to_estimate {
        let r = &ready[n];
        // Each estimate looks at every node of its partition: on large partitions the
        // budget, not `start_estimates`, says how many there are.
        if looks >= ESTIMATE_LOOKS {
            break;
        }
        looks += parts.parts[r.part].nodes.len();
        let sel = &r.job.select;
        let Some((allowed, None)) = selections.get(&(r.part, sel)) else {
            continue;
        };
        let fit = Fit {
            req: &r.job.request,
            allowed: allowed.as_deref(),
            exclusive: sel.exclusive,
        };
        if let Some(res) = reserve(
            table, parts, r.part, &fit, floor, r.limit, nodes, r.id, None,
        ) {
            out.waiting[w].estimated_start = Some(res.start);
            if config.policy == Policy::Fcfs {
                floor = res.start;
            }
        }
    }
    out
}

/// Why the job can never start on the nodes it may use in its partition (node shapes and
/// states alone), if so. `groups` are (a node, how many like it, how many of those are up).
pub(crate) fn never_fits(
    table: &Table,
    groups: impl Iterator<Item = (usize, usize, usize)>,
    fit: &Fit<'_>,
) -> Option<PendingReason> {
    let req = fit.req;
    let want = req.node_count() as usize;
    let (mut could, mut up, mut any) = (0usize, 0usize, false);
    for (i, count, up_count) in groups {
        any = true;
        let node = &table.nodes[i];
        if table
            .shapes(i, req, fit.exclusive)
            .iter()
            .any(|need| node.capacity.covers(need))
        {
            could += count;
            up += up_count;
        }
    }
    if up >= want {
        None
    } else if !any {
        Some(PendingReason::NoNodes)
    } else if could == 0 {
        Some(PendingReason::TooLarge {
            cpus: req.cpus,
            memory: req.memory,
            gpus: req.gpus,
            gpu_kind: req.gpu_kind.clone(),
        })
    } else if could < want {
        Some(PendingReason::PartitionNodeLimit {
            nodes: req.node_count(),
            max: could as u32,
        })
    } else {
        Some(PendingReason::ReqNodeNotAvail)
    }
}

/// Finds the earliest time the job fits on up nodes of `p` it may use for `limit`, and sets
/// the resources aside there.
#[allow(clippy::too_many_arguments)]
fn reserve(
    table: &mut Table,
    parts: &Partitions,
    p: usize,
    fit: &Fit<'_>,
    now: Time,
    limit: Time,
    nodes: &[Node],
    job: JobId,
    hint: Option<Time>,
) -> Option<Reservation> {
    let req = fit.req;
    let want = req.node_count() as usize;
    let mut cands: Vec<(Time, usize, Tres)> = Vec::new();
    // One node: the earliest of them all is enough, no list to sort.
    let mut first: Option<(Time, usize, Tres)> = None;
    for &i in &parts.parts[p].nodes {
        let node = &table.nodes[i];
        if !node.up || !fit.may_use(i) {
            continue;
        }
        // For one node, a time later than the best so far cannot win: stop looking there.
        let until = match first {
            Some((t, _, _)) if want == 1 => t,
            _ => Time::MAX,
        };
        let best = table
            .shapes(i, req, fit.exclusive)
            .into_iter()
            .filter_map(|need| {
                node.profile
                    .earliest(&need, &node.capacity, now, limit, until)
                    .map(|t| (t, i, need))
            })
            .min();
        if want == 1 {
            first = match (first, best) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
        } else {
            cands.extend(best);
        }
    }
    let picks: Vec<(usize, Tres)>;
    let start: Time;
    if want == 1 {
        let (t, i, need) = first?;
        start = t;
        picks = vec![(i, need)];
    } else {
        if cands.len() < want {
            return None;
        }
        cands.sort();
        // A common start can only be where some candidate node's availability rises: one of
        // their earliest times, releases or reservation ends, no sooner than the `want`-th
        // earliest.
        let floor = cands[want - 1].0;
        let mut times: Vec<Time> = cands.iter().map(|c| c.0).collect();
        for c in &cands {
            let prof = &table.nodes[c.1].profile;
            times.extend(prof.releases().iter().map(|(t, _)| *t));
            times.extend(prof.reserved.iter().map(|(_, e, _)| *e));
        }
        times.retain(|&t| t >= floor);
        times.sort_unstable();
        times.dedup();
        times.truncate((MULTI_NODE_BUDGET / cands.len()).max(32));
        let last = cands
            .iter()
            .map(|c| table.nodes[c.1].profile.last_event(now))
            .max()
            .unwrap_or(now);
        times.push(last);
        // A kept reservation's last start is tried too, in its place among the others,
        // however many times the budget cut: what was free for it then still is, unless a
        // node went away.
        if let Some(h) = hint.filter(|&h| h >= floor && h < last) {
            if let Err(at) = times.binary_search(&h) {
                times.insert(at, h);
            }
        }
        let found = times.into_iter().find_map(|t| {
            let end = t.saturating_add(limit);
            let fit: Vec<(usize, Tres)> = cands
                .iter()
                .filter(|c| c.0 <= t)
                .filter_map(|c| {
                    let prof = &table.nodes[c.1].profile;
                    table
                        .shapes(c.1, req, fit.exclusive)
                        .into_iter()
                        .find(|need| prof.fits(need, t, end))
                        .map(|need| (c.1, need))
                })
                .take(want)
                .collect();
            (fit.len() == want).then_some((t, fit))
        })?;
        (start, picks) = found;
    }
    let end = start.saturating_add(limit);
    for (i, need) in &picks {
        table.node_mut(*i).profile.reserve(need, start, end);
    }
    Some(Reservation {
        job,
        start,
        end,
        nodes: picks.iter().map(|(i, _)| nodes[*i].name.clone()).collect(),
    })
}
