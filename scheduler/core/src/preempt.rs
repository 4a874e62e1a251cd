//! Preemption: which running jobs a waiting job may stop, and the fewest of them that make
//! room for it.
//!
//! A waiting job may preempt a running job when its partition's priority tier is higher and
//! the running job's partition has a `preempt_mode` other than off (Slurm's
//! `PreemptType=preempt/partition_prio`: the running job's partition decides the mode), or
//! when its QoS lists the running job's QoS in `preempt` and that QoS's mode is not off
//! (requeue when not set). Only a job that passed every other check and could not start now
//! for want of resources preempts.
//!
//! The choice, per node of the job's partition: jobs already being stopped count first (they
//! cost nothing), then preemptible jobs in order of preference (lowest partition tier, then
//! lowest QoS priority, then the most recently started), each taken only if it gives back
//! something still missing, until the job's shape (GPUs by type) fits from just after now
//! for its whole time limit beside every reservation; then every job not needed after all is
//! dropped again, the most valuable first. The nodes whose victims are of the lowest tier and
//! QoS win, then those with the fewest victims, then the most recently started. The victims' resources are then taken to come back at once and are reserved
//! for the waiting job, so that nothing behind it starts on them.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet};

use wharf_api::JobId;

use crate::config::{Config, PreemptMode};
use crate::partition::Partitions;
use crate::placement::{Fit, Table};
use crate::profile::Profile;
use crate::state::{RunningJob, Time};
use crate::tres::Tres;

/// How a running job stands against preemptors.
#[derive(Debug, Clone)]
struct Standing {
    tier: u32,
    part_mode: PreemptMode,
    qos: Option<String>,
    qos_priority: u32,
    qos_mode: PreemptMode,
    start: Time,
    id: JobId,
}

/// Order of preference among victims: lower first.
type Cost = (u32, u32, Reverse<Time>, Reverse<JobId>);

/// The running jobs of a pass as possible victims.
pub(crate) struct Victims<'a> {
    /// Each QoS's `preempt` list less the QoS that can preempt it back, directly or through
    /// others (itself included): jobs of such QoS would stop each other without end.
    preempts: BTreeMap<&'a str, Vec<&'a str>>,
    jobs: Vec<Standing>,
    /// The lowest tier of a partition whose jobs may be preempted; `None`: none may.
    lowest_tier: Option<u32>,
}

impl<'a> Victims<'a> {
    /// Looks at every running job's partition and QoS.
    pub fn new(config: &'a Config, parts: &Partitions, running: &[RunningJob]) -> Victims<'a> {
        let lowest_tier = parts
            .parts
            .iter()
            .filter(|p| p.preempt_mode != PreemptMode::Off)
            .map(|p| p.tier)
            .min();
        let preempts = acyclic_preempts(config);
        if lowest_tier.is_none() && preempts.is_empty() {
            return Victims {
                preempts,
                jobs: Vec::new(),
                lowest_tier,
            };
        }
        let mut jobs: Vec<Standing> = running
            .iter()
            .map(|r| {
                let part = parts.named(r.partition.as_deref());
                let qos = r.qos.as_deref();
                Standing {
                    tier: part.map_or(0, |p| p.tier),
                    part_mode: part.map_or(PreemptMode::Off, |p| p.preempt_mode),
                    qos: r.qos.clone(),
                    qos_priority: qos
                        .and_then(|q| config.qos.iter().find(|d| d.name == q))
                        .map_or(0, |d| d.priority),
                    qos_mode: qos
                        .and_then(|q| config.limits.qos.get(q))
                        .and_then(|l| l.preempt_mode)
                        .unwrap_or(PreemptMode::Requeue),
                    start: r.start,
                    id: r.id,
                }
            })
            .collect();
        jobs.sort_unstable_by_key(|s| s.id);
        Victims {
            preempts,
            jobs,
            lowest_tier,
        }
    }

    /// Whether a job of partition tier `tier` and QoS `qos` could preempt anything at all.
    pub fn any_for(&self, tier: u32, qos: Option<&str>) -> bool {
        self.lowest_tier.is_some_and(|t| tier > t) || !self.preempts(qos).is_empty()
    }

    fn preempts(&self, qos: Option<&str>) -> &[&'a str] {
        qos.and_then(|q| self.preempts.get(q))
            .map_or(&[], |l| l.as_slice())
    }

    fn standing(&self, id: JobId) -> Option<&Standing> {
        let at = self.jobs.binary_search_by_key(&id, |s| s.id).ok()?;
        self.jobs.get(at)
    }

    /// The mode under which a job of tier `tier` and QoS `qos` may preempt running job `id`,
    /// if it may.
    pub fn mode(&self, tier: u32, qos: Option<&str>, id: JobId) -> Option<PreemptMode> {
        let v = self.standing(id)?;
        if tier > v.tier && v.part_mode != PreemptMode::Off {
            return Some(v.part_mode);
        }
        let listed = v
            .qos
            .as_ref()
            .is_some_and(|vq| self.preempts(qos).contains(&vq.as_str()));
        (listed && v.qos_mode != PreemptMode::Off).then_some(v.qos_mode)
    }

    fn cost(&self, id: JobId) -> Option<Cost> {
        let v = self.standing(id)?;
        Some((v.tier, v.qos_priority, Reverse(v.start), Reverse(v.id)))
    }
}

/// Every QoS's `preempt` list without the QoS it could be preempted by in turn: `a` may
/// preempt `b` only if `b` cannot reach `a` through the lists. The controller refuses such
/// lists when they are set; this keeps a cycle that came in another way (a config file and
/// a database that disagree) from making jobs requeue each other for ever. QoS with nothing
/// left are left out.
fn acyclic_preempts(config: &Config) -> BTreeMap<&str, Vec<&str>> {
    let lists = &config.limits.qos;
    // Whether `to` is reached from `from` by one or more steps.
    let reaches = |from: &str, to: &str| {
        let mut seen: BTreeSet<&str> = BTreeSet::new();
        let mut stack = vec![from];
        while let Some(q) = stack.pop() {
            for next in lists.get(q).map_or(&[][..], |l| l.preempt.as_slice()) {
                if next == to {
                    return true;
                }
                if seen.insert(next) {
                    stack.push(next);
                }
            }
        }
        false
    };
    lists
        .iter()
        .filter_map(|(q, l)| {
            let keep: Vec<&str> = (l.preempt.iter())
                .map(String::as_str)
                .filter(|v| *v != q && !reaches(v, q))
                .collect();
            (!keep.is_empty()).then_some((q.as_str(), keep))
        })
        .collect()
}

/// Who is asking: the waiting job's partition, tier, QoS, shape and time limit.
pub(crate) struct Asker<'a> {
    pub part: usize,
    pub tier: u32,
    pub qos: Option<&'a str>,
    /// Its request and the nodes it may use.
    pub fit: Fit<'a>,
    pub limit: Time,
}

/// What preemption decided for one waiting job.
pub(crate) struct Choice {
    /// Its nodes and the shape it takes on each.
    pub picks: Vec<(usize, Tres)>,
    /// Every job it waits for: those already being stopped, then its new victims.
    pub waits_for: Vec<JobId>,
    /// Its new victims, with their modes.
    pub victims: Vec<(JobId, PreemptMode)>,
    /// When it is expected to start.
    pub start: Time,
}

/// One node's answer: the shape, the jobs to be gone (holding indices, stopping ones
/// included) and its cost.
struct NodePlan {
    node: usize,
    need: Tres,
    gone: Vec<usize>,
    /// The worst victim's tier and QoS priority, how many, the worst victim, the node.
    key: (Option<(u32, u32)>, usize, Option<Cost>, usize),
}

/// Finds the fewest, least valuable running jobs whose end lets `a` start just after `now`,
/// and commits the choice to `table`: their resources come back at once and are reserved for
/// `a`. `None` (and `table` unchanged) when no such set exists.
pub(crate) fn choose(
    table: &mut Table,
    parts: &Partitions,
    victims: &Victims<'_>,
    a: &Asker<'_>,
    now: Time,
) -> Option<Choice> {
    let want = a.fit.req.node_count() as usize;
    let start = now + 1;
    let end = start.saturating_add(a.limit);
    let mut plans: Vec<NodePlan> = parts.parts[a.part]
        .nodes
        .iter()
        .filter(|&&i| table.nodes[i].up && a.fit.may_use(i))
        .filter_map(|&i| node_plan(table, victims, a, i, start, end))
        .collect();
    if plans.len() < want {
        return None;
    }
    plans.sort_by_key(|p| p.key);
    plans.truncate(want);
    if plans.iter().all(|p| p.gone.is_empty()) {
        return None;
    }
    let mut choice = Choice {
        picks: Vec::with_capacity(want),
        waits_for: Vec::new(),
        victims: Vec::new(),
        start,
    };
    for p in plans {
        let n = table.node_mut(p.node);
        for &h in &p.gone {
            let held = &mut n.jobs[h];
            choice.waits_for.push(held.id);
            if !held.stopping {
                // A gang's job holds a share of several nodes: one victim, however many.
                let mode = victims.mode(a.tier, a.qos, held.id);
                if let Some(mode) = mode.filter(|_| !choice.victims.iter().any(|v| v.0 == held.id))
                {
                    choice.victims.push((held.id, mode));
                }
                n.profile.move_release(&held.tres, held.end, start);
                held.end = start;
                held.stopping = true;
            }
        }
        n.profile.reserve(&p.need, start, end);
        choice.picks.push((p.node, p.need));
    }
    choice.waits_for.sort_unstable();
    choice.waits_for.dedup();
    Some(choice)
}

/// The best way to make room for `a` on node `i`, if there is one.
fn node_plan(
    table: &Table,
    victims: &Victims<'_>,
    a: &Asker<'_>,
    i: usize,
    start: Time,
    end: Time,
) -> Option<NodePlan> {
    let n = &table.nodes[i];
    // Jobs already being stopped first, at no cost; then preemptible ones, cheapest first.
    let mut cands: Vec<(Option<Cost>, usize)> = n
        .jobs
        .iter()
        .enumerate()
        .filter_map(|(h, held)| {
            if held.stopping {
                Some((None, h))
            } else {
                victims
                    .mode(a.tier, a.qos, held.id)
                    .and_then(|_| victims.cost(held.id))
                    .map(|c| (Some(c), h))
            }
        })
        .collect();
    if cands.is_empty() {
        // Nothing here ends early, but the node may hold the job as it is: a gang then
        // takes it at no cost beside the nodes it must empty.
        return (table.shapes(i, a.fit.req, a.fit.exclusive).into_iter())
            .find(|need| n.profile.fits(need, start, end))
            .map(|need| NodePlan {
                node: i,
                need,
                gone: Vec::new(),
                key: (None, 0, None, i),
            });
    }
    cands.sort();
    // Stopping jobs are not counted on until chosen.
    let mut base = n.profile.clone();
    for held in n.jobs.iter().filter(|h| h.stopping) {
        base.move_release(&held.tres, held.end, Time::MAX);
    }
    table
        .shapes(i, a.fit.req, a.fit.exclusive)
        .into_iter()
        .filter_map(|need| {
            let gone = cover(&base, n, &cands, &need, start, end)?;
            let new: Vec<Cost> = gone
                .iter()
                .filter_map(|&h| cands.iter().find(|c| c.1 == h).and_then(|c| c.0))
                .collect();
            let worst = new.iter().max().copied();
            let key = (worst.map(|c| (c.0, c.1)), new.len(), worst, i);
            Some(NodePlan {
                node: i,
                need,
                gone,
                key,
            })
        })
        .min_by_key(|p| p.key)
}

/// The smallest prefix-then-pruned set of `cands` (holding indices, in order of preference)
/// whose release at `start` lets `need` fit on `[start, end)`.
fn cover(
    base: &Profile,
    n: &crate::placement::NodeRt,
    cands: &[(Option<Cost>, usize)],
    need: &Tres,
    start: Time,
    end: Time,
) -> Option<Vec<usize>> {
    let with = |gone: &[usize]| {
        let mut p = base.clone();
        for &h in gone {
            let held = &n.jobs[h];
            let from = if held.stopping { Time::MAX } else { held.end };
            p.move_release(&held.tres, from, start);
        }
        p
    };
    let mut gone: Vec<usize> = Vec::new();
    let mut short = base.shortfall(need, start, end);
    for &(_, h) in cands {
        if short == Tres::default() {
            break;
        }
        if helps(&n.jobs[h].tres, &short) {
            gone.push(h);
            short = with(&gone).shortfall(need, start, end);
        }
    }
    if short != Tres::default() {
        return None;
    }
    // Drop what is not needed after all, the most valuable first.
    for k in (0..gone.len()).rev() {
        let mut fewer = gone.clone();
        fewer.remove(k);
        if with(&fewer).fits(need, start, end) {
            gone = fewer;
        }
    }
    Some(gone)
}

/// `held` gives back some of what is `short`.
fn helps(held: &Tres, short: &Tres) -> bool {
    (short.cpus > 0 && held.cpus > 0)
        || (short.memory > 0 && held.memory > 0)
        || short
            .gpus
            .iter()
            .zip(held.gpus)
            .any(|(s, h)| *s > 0 && h > 0)
}
