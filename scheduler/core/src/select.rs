//! Node selection: which nodes of its partition a job may use (the features its
//! `--constraint` asks for, the nodes of its `--nodelist`, none of its `--exclude`), and
//! whether it takes them whole (`--exclusive`).
//!
//! A job that no node of its partition could ever match waits with `BadConstraints`
//! ([`PendingReason::NoNodeMatches`]), saying what is missing; the controller refuses such a
//! job at submit with the same words ([`unmatched`]), and one that no node it may use could
//! ever hold too ([`never_holds`]).
//!
//! ```
//! use wharf_core::{schedule, Assoc, Node, PendingJob, Request, Selection, State};
//! use wharf_api::features::Constraint;
//!
//! let mut fast = Node::new("n2", 8, 64 << 30, vec![]);
//! fast.features = vec!["ib".into()];
//! let mut job = PendingJob::new(1, Assoc::new("lab", "ann"), Request::per_node(1, 1 << 30, 0), 0);
//! job.select.constraint = Some(Constraint::parse("ib").unwrap());
//! let nodes = vec![Node::new("n1", 8, 64 << 30, vec![]), fast];
//! let state = State { nodes, pending: vec![job], ..State::default() };
//! let plan = schedule(0, &state, &Default::default());
//! assert_eq!(plan.starts[0].allocs[0].node, "n2");
//! ```

use std::collections::BTreeSet;

use wharf_api::features::Constraint;
use wharf_api::hostlist::compress;

use crate::backfill::never_fits;
use crate::config::Config;
use crate::partition::{PartView, Partitions};
use crate::placement::{Fit, Table};
use crate::state::{Node, PendingJob};
use crate::PendingReason;

/// What a job asks of the nodes it runs on, beyond resources.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct Selection {
    /// Features each of its nodes must have; `None`: any.
    pub constraint: Option<Constraint>,
    /// The nodes it may run on; empty: any node of its partition.
    pub nodelist: BTreeSet<String>,
    /// Nodes it must not run on.
    pub exclude: BTreeSet<String>,
    /// It takes whole nodes: every CPU, all memory and every GPU, shared with no other job.
    pub exclusive: bool,
}

impl Selection {
    /// True when it narrows the nodes a job may use (exclusivity aside).
    pub fn filters(&self) -> bool {
        self.constraint.is_some() || !self.nodelist.is_empty() || !self.exclude.is_empty()
    }

    /// True when a job with this selection may run on `node` (its state aside).
    pub fn allows(&self, node: &Node) -> bool {
        (self.nodelist.is_empty() || self.nodelist.contains(&node.name))
            && !self.exclude.contains(&node.name)
            && self
                .constraint
                .as_ref()
                .is_none_or(|c| c.matches(&node.features))
    }

    /// Which of `nodes` it allows, by index; `None` when it allows every node.
    pub(crate) fn mask(&self, nodes: &[Node]) -> Option<Vec<bool>> {
        self.filters()
            .then(|| nodes.iter().map(|n| self.allows(n)).collect())
    }
}

/// Why no node of partition `part` could ever run a job with selection `sel`, in words for
/// [`PendingReason::NoNodeMatches`]; `None` when some node could (whatever its state).
pub(crate) fn why_none(sel: &Selection, part: &PartView, nodes: &[Node]) -> Option<String> {
    if !sel.filters() {
        return None;
    }
    // A name that is no node is a mistake, even beside names that are.
    let unknown: Vec<&str> = sel
        .nodelist
        .iter()
        .filter(|n| !nodes.iter().any(|m| m.name == **n))
        .map(String::as_str)
        .collect();
    if !unknown.is_empty() {
        return Some(format!(
            "its --nodelist names {}, which {} not a node of this cluster",
            compress(&unknown),
            if unknown.len() == 1 { "is" } else { "are" }
        ));
    }
    let members: Vec<&Node> = part.nodes.iter().map(|&i| &nodes[i]).collect();
    if members.iter().any(|n| sel.allows(n)) {
        return None;
    }
    let p = &part.name;
    if !sel.nodelist.is_empty() && !members.iter().any(|n| sel.nodelist.contains(&n.name)) {
        return Some(format!(
            "none of its --nodelist {} is in partition {p}",
            compress(&sel.nodelist.iter().collect::<Vec<_>>())
        ));
    }
    let named: Vec<&&Node> = members
        .iter()
        .filter(|n| sel.nodelist.is_empty() || sel.nodelist.contains(&n.name))
        .collect();
    let kept: Vec<&&Node> = named
        .iter()
        .copied()
        .filter(|n| !sel.exclude.contains(&n.name))
        .collect();
    if kept.is_empty() {
        return Some(format!(
            "its --exclude leaves no node of partition {p} it may use"
        ));
    }
    let Some(c) = &sel.constraint else {
        return None;
    };
    let mut have: BTreeSet<&str> = BTreeSet::new();
    let mut kinds: BTreeSet<&str> = BTreeSet::new();
    for n in &kept {
        have.extend(n.features.iter().map(String::as_str));
        kinds.extend(n.gpus.iter().map(|g| g.kind.as_str()));
    }
    let missing: Vec<&str> = c
        .names()
        .into_iter()
        .filter(|f| !have.contains(f))
        .collect();
    let offered = if have.is_empty() {
        "none".to_string()
    } else {
        have.into_iter().collect::<Vec<_>>().join(", ")
    };
    let mut why = format!(
        "no node of partition {p} it may use has the features {c} (features there: {offered})"
    );
    if let Some(kind) = missing.iter().find(|f| kinds.contains(*f)) {
        why.push_str(&format!(
            "; {kind} is a GPU type, not a feature: ask for it with --gpus {kind}:COUNT"
        ));
    }
    Some(why)
}

/// Why `job` could never run on `nodes` (every node its agent registered, up or down): the
/// controller refuses such a job at submit. Both are `None` when its partition is unknown
/// (that has its own refusal); the partitions are resolved once for both.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SubmitChecks {
    /// For its node selection alone (constraint, node list, excluded nodes), when it makes
    /// one: no node of its partition matches.
    pub unmatched: Option<PendingReason>,
    /// Too few of the nodes it may use in its partition could ever hold its shape: CPUs,
    /// memory, GPUs of its type, per node (`TooLarge`, `PartitionNodeLimit`). `None` too
    /// while some node its partition names has not registered yet (that node may hold it).
    pub never: Option<PendingReason>,
}

/// [`SubmitChecks`] of `job` on `nodes`.
pub fn submit_checks(config: &Config, nodes: &[Node], job: &PendingJob) -> SubmitChecks {
    let parts = Partitions::resolve(config, nodes);
    let Some(p) = parts.of(job) else {
        return SubmitChecks::default();
    };
    let unmatched = job
        .select
        .filters()
        .then(|| why_none(&job.select, &parts.parts[p], nodes))
        .flatten()
        .map(|what| PendingReason::NoNodeMatches { what });
    SubmitChecks {
        unmatched,
        never: never_holds(config, nodes, &parts, p, job),
    }
}

/// For an exclusive `job` (time limit `limit`, ms) in a cluster with limits: the limit it
/// is over on any whole nodes of its partition it may use, which it would be charged for
/// (see [`crate::limits::never_fits_whole`]). `None` for a job that is not exclusive, or
/// while its partition has fewer such nodes than it asks for (the shape checks answer that).
pub fn exclusive_never_fits(
    config: &Config,
    nodes: &[Node],
    job: &PendingJob,
    limit: crate::Time,
) -> Option<crate::LimitReason> {
    if !job.select.exclusive || config.limits.is_empty() {
        return None;
    }
    let parts = Partitions::resolve(config, nodes);
    let p = parts.of(job)?;
    let table = Table::empty(nodes, &parts);
    let allowed = job.select.mask(nodes);
    let fit = Fit {
        req: &job.request,
        allowed: allowed.as_deref(),
        exclusive: true,
    };
    let whole: Vec<_> = (parts.parts[p].nodes.iter())
        .filter(|&&i| fit.may_use(i))
        .filter_map(|&i| table.shapes(i, &job.request, true).into_iter().next())
        .collect();
    crate::limits::never_fits_whole(config, job, &whole, job.request.node_count(), limit)
}

fn never_holds(
    config: &Config,
    nodes: &[Node],
    parts: &Partitions,
    p: usize,
    job: &PendingJob,
) -> Option<PendingReason> {
    let named = config
        .partitions
        .iter()
        .find(|c| c.name == parts.parts[p].name)
        .map_or(0, |c| c.nodes.len());
    if parts.parts[p].nodes.is_empty() || parts.parts[p].nodes.len() < named {
        return None;
    }
    let table = Table::empty(nodes, parts);
    let allowed = job.select.mask(nodes);
    let fit = Fit {
        req: &job.request,
        allowed: allowed.as_deref(),
        exclusive: job.select.exclusive,
    };
    // Every node counted as up, whatever its state: a node that is down now may come back
    // (so the answer is never `ReqNodeNotAvail`).
    let mine = parts.parts[p].nodes.iter().filter(|&&i| fit.may_use(i));
    never_fits(&table, mine.map(|&i| (i, 1, 1)), &fit)
}
