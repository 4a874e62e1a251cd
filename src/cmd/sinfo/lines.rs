//! sinfo's lines: the nodes of each partition grouped by state (the default listing), one
//! line per node and partition (`-N`), one per partition (`-s`), or one per reason a node
//! takes no work (`-R`). Pure: the controller's node and partition lists in, lines out.
//!
//! Nodes in no partition are left out of the partition listings, as Slurm leaves them out;
//! `-N` and `-R`, which are about nodes, list them with `n/a` for a partition, so that a
//! node an admin left out of every partition is still seen, down or drained.

use std::collections::{BTreeMap, BTreeSet};

use wharf_api::wire::{PartitionList, PartitionSummary};
use wharf_api::NodeRecord;

use super::state::State;

/// A node as sinfo shows it: its name, its state and, once it registered, its record.
#[derive(Debug, Clone, Copy)]
pub struct Node<'a> {
    /// Name.
    pub name: &'a str,
    /// State.
    pub state: State,
    /// `None` for a node a partition names that never registered.
    pub record: Option<&'a NodeRecord>,
}

/// Where a node counts in sinfo's A/I/O/T counts (`%F`, `%C`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Count {
    /// Runs jobs (mixed, allocated, draining with jobs).
    Allocated,
    /// Takes jobs and runs none.
    Idle,
    /// Down, drained, never registered.
    Other,
}

impl<'a> Node<'a> {
    /// Where it counts: a node still clearing an ended job's processes by what it holds, as
    /// the controller counts it (`-s --json`) and Slurm counts `mix+comp` as allocated.
    pub fn counted_as(&self) -> Count {
        match self.state {
            State::Mixed | State::Allocated | State::Draining => Count::Allocated,
            State::Idle => Count::Idle,
            State::Completing if self.record.is_some_and(|r| r.allocated.cpus > 0) => {
                Count::Allocated
            }
            State::Completing => Count::Idle,
            _ => Count::Other,
        }
    }

    /// Why the node takes no work, who said so and since when (ms since the Unix epoch),
    /// as `-R` lists it; `None` for a node that takes work.
    pub fn reason(&self) -> Option<Reason> {
        let Some(n) = self.record else {
            return Some(Reason::by_wharf("Never registered", None));
        };
        match &n.reason {
            // An admin's drain ends in who drained (see the controller's `set_node_state`).
            Some(r) => Some(
                match r.strip_suffix(']').and_then(|r| r.rsplit_once(" [by ")) {
                    Some((text, user)) => Reason {
                        text: text.to_string(),
                        user: user.to_string(),
                        since: n.drained_since,
                    },
                    None => Reason::by_wharf(r, n.drained_since),
                },
            ),
            None if self.state == State::Down => {
                Some(Reason::by_wharf("Not responding", Some(n.last_seen)))
            }
            None => None,
        }
    }
}

/// Why nodes take no work.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Reason {
    /// What the admin or the controller wrote.
    pub text: String,
    /// Who: the admin, or `wharf` for the controller itself (Slurm's `slurm`).
    pub user: String,
    /// Since when, ms since the Unix epoch; for a silent node, when it was last heard from.
    pub since: Option<u64>,
}

impl Reason {
    fn by_wharf(text: &str, since: Option<u64>) -> Reason {
        Reason {
            text: text.to_string(),
            user: "wharf".into(),
            since,
        }
    }
}

/// One line of a listing: nodes of one partition (`None`: of no partition, or `-R`'s).
#[derive(Debug, Clone)]
pub struct Line<'a> {
    /// The partition.
    pub partition: Option<&'a PartitionSummary>,
    /// Its nodes, by name.
    pub nodes: Vec<Node<'a>>,
    /// `-R`'s reason.
    pub reason: Option<Reason>,
}

/// What the listing keeps: partitions by name (all when empty), node states, node names
/// (all when `None`).
pub struct Filter<'f> {
    /// `-p`.
    pub partitions: &'f [String],
    /// `-t`.
    pub states: &'f [State],
    /// `-n`.
    pub nodes: Option<&'f BTreeSet<String>>,
}

#[cfg(test)]
impl Filter<'static> {
    /// Every line: no `-p`, `-t` or `-n`.
    pub const ALL: Filter<'static> = Filter {
        partitions: &[],
        states: &State::ALL,
        nodes: None,
    };
}

impl Filter<'_> {
    /// Whether partition `p` is one of those asked for (all when none are).
    pub(super) fn keeps_partition(&self, p: &PartitionSummary) -> bool {
        self.partitions.is_empty() || self.partitions.contains(&p.name)
    }

    fn keeps(&self, n: &Node) -> bool {
        self.states.contains(&n.state) && self.nodes.is_none_or(|k| k.contains(n.name))
    }

    /// Whether it leaves some nodes out by their state or name: a partition none of whose
    /// nodes it keeps is then left out, not listed as empty.
    fn picks_nodes(&self) -> bool {
        self.states.len() < State::ALL.len() || self.nodes.is_some()
    }
}

/// The cluster as sinfo lists it.
pub struct Cluster<'a> {
    parts: &'a PartitionList,
    /// Every node, registered or named by a partition, by name.
    nodes: BTreeMap<&'a str, Node<'a>>,
    /// The partitions each node is in, in the list's order, by node name (one pass over the
    /// partitions' names, not one per node).
    within: BTreeMap<&'a str, Vec<&'a PartitionSummary>>,
}

impl<'a> Cluster<'a> {
    /// The partitions and the registered nodes; every partition must name its nodes (a
    /// controller older than `node_names` does not, and the caller says so first).
    pub fn new(parts: &'a PartitionList, records: &'a [NodeRecord]) -> Cluster<'a> {
        let mut nodes: BTreeMap<&str, Node> = (records.iter())
            .map(|n| {
                let node = Node {
                    name: &n.info.name,
                    state: State::of(n),
                    record: Some(n),
                };
                (node.name, node)
            })
            .collect();
        let mut within: BTreeMap<&str, Vec<&PartitionSummary>> = BTreeMap::new();
        for p in &parts.partitions {
            for name in names(p) {
                nodes.entry(name).or_insert(Node {
                    name,
                    state: State::Unknown,
                    record: None,
                });
                within.entry(name).or_default().push(p);
            }
        }
        Cluster {
            parts,
            nodes,
            within,
        }
    }

    fn members(&self, p: &'a PartitionSummary, f: &Filter) -> Vec<Node<'a>> {
        let named = names(p).filter_map(|n| self.nodes.get(n).copied());
        named.filter(|n| f.keeps(n)).collect()
    }

    /// The default listing: each partition's nodes grouped by state, in [`State`]'s order;
    /// a partition with no node at all is one line of none.
    pub fn by_state(&self, f: &Filter) -> Vec<Line<'a>> {
        let mut lines = Vec::new();
        for p in self
            .parts
            .partitions
            .iter()
            .filter(|p| f.keeps_partition(p))
        {
            let members = self.members(p, f);
            if members.is_empty() && !f.picks_nodes() {
                lines.push(line(Some(p), vec![]));
            }
            let mut by_state: BTreeMap<State, Vec<Node>> = BTreeMap::new();
            for n in members {
                by_state.entry(n.state).or_default().push(n);
            }
            lines.extend(by_state.into_values().map(|nodes| line(Some(p), nodes)));
        }
        lines
    }

    /// `-s`: one line per partition.
    pub fn by_partition(&self, f: &Filter) -> Vec<Line<'a>> {
        let parts = self
            .parts
            .partitions
            .iter()
            .filter(|p| f.keeps_partition(p));
        let lines = parts.map(|p| line(Some(p), self.members(p, f)));
        lines
            .filter(|l| !l.nodes.is_empty() || !f.picks_nodes())
            .collect()
    }

    /// `-N`: one line per node and partition it is in, by name; a node in no partition once,
    /// with none (unless partitions are named).
    pub fn by_node(&self, f: &Filter) -> Vec<Line<'a>> {
        let mut lines = Vec::new();
        for n in self.nodes.values().filter(|n| f.keeps(n)) {
            let within = self.within.get(n.name).map_or(&[][..], Vec::as_slice);
            if within.is_empty() && f.partitions.is_empty() {
                lines.push(line(None, vec![*n]));
            }
            for p in within.iter().copied().filter(|p| f.keeps_partition(p)) {
                lines.push(line(Some(p), vec![*n]));
            }
        }
        lines
    }

    /// `-R`: the nodes that take no work, grouped by reason, who gave it and since when
    /// (partitions named keep their nodes only).
    pub fn by_reason(&self, f: &Filter) -> Vec<Line<'a>> {
        let in_picked = |n: &Node| {
            let mut within = self.within.get(n.name).into_iter().flatten();
            f.partitions.is_empty() || within.any(|p| f.keeps_partition(p))
        };
        let mut by_reason: BTreeMap<Reason, Vec<Node>> = BTreeMap::new();
        for n in self.nodes.values().filter(|n| f.keeps(n) && in_picked(n)) {
            if let Some(r) = n.reason() {
                by_reason.entry(r).or_default().push(*n);
            }
        }
        (by_reason.into_iter())
            .map(|(r, nodes)| Line {
                reason: Some(r),
                ..line(None, nodes)
            })
            .collect()
    }
}

/// The states of `nodes`, each once, in [`State`]'s order.
pub fn states(nodes: &[Node]) -> Vec<State> {
    let states: BTreeSet<State> = nodes.iter().map(|n| n.state).collect();
    states.into_iter().collect()
}

fn line<'a>(partition: Option<&'a PartitionSummary>, nodes: Vec<Node<'a>>) -> Line<'a> {
    Line {
        partition,
        nodes,
        reason: None,
    }
}

/// The names of partition `p`'s nodes.
fn names(p: &PartitionSummary) -> impl Iterator<Item = &str> {
    p.node_names.iter().flatten().map(String::as_str)
}

#[cfg(test)]
pub(crate) mod tests {
    use wharf_api::node::NodeState;
    use wharf_api::wire::{NodeCounts, PartitionList, PartitionSummary};
    use wharf_api::NodeRecord;

    use super::{Cluster, Filter};
    use crate::cmd::sinfo::state::tests::node;
    use crate::cmd::sinfo::state::State;

    /// Partition `name` over `nodes`.
    pub(crate) fn part(name: &str, default: bool, nodes: &[&str]) -> PartitionSummary {
        PartitionSummary {
            name: name.into(),
            state: "UP".into(),
            default,
            tier: 0,
            max_time_s: None,
            nodes: NodeCounts::default(),
            cpus: (0, 0),
            gpus: (0, 0),
            running: 0,
            pending: 0,
            node_names: Some(nodes.iter().map(|n| n.to_string()).collect()),
        }
    }

    /// gpu01..gpu04 and gpu07 (gpu02 mixed, gpu03 drained by root, gpu04 down) and cpu1
    /// (in no partition, drained by the controller); `gpu` over the gpu nodes and gpu09,
    /// which never registered; `debug` over gpu01 and gpu02; `empty` over none.
    pub(crate) fn cluster() -> (PartitionList, Vec<NodeRecord>) {
        let mut nodes = vec![
            node("gpu01", NodeState::Up, 0),
            node("gpu02", NodeState::Up, 3),
            node("gpu03", NodeState::Drain, 0),
            node("gpu04", NodeState::Down, 0),
            node("gpu07", NodeState::Up, 0),
            node("cpu1", NodeState::Drain, 0),
        ];
        nodes[2].reason = Some("bad fan [by root]".into());
        nodes[2].drained_since = Some(86_400_000);
        nodes[3].last_seen = 3_600_000;
        nodes[5].reason = Some("launch of job 7 failed".into());
        let gpu = ["gpu01", "gpu02", "gpu03", "gpu04", "gpu07", "gpu09"];
        let parts = PartitionList {
            partitions: vec![
                part("gpu", true, &gpu),
                part("debug", false, &["gpu01", "gpu02"]),
                part("empty", false, &[]),
            ],
        };
        (parts, nodes)
    }

    /// Each line's partition, node names and states, as one string.
    fn shown(lines: &[super::Line]) -> Vec<String> {
        let each = lines.iter().map(|l| {
            let nodes: Vec<String> = (l.nodes.iter())
                .map(|n| format!("{}:{}", n.name, n.state.short()))
                .collect();
            format!(
                "{} {}",
                l.partition.map_or("n/a", |p| &p.name),
                nodes.join(",")
            )
        });
        each.collect()
    }

    #[test]
    fn a_partitions_nodes_are_grouped_by_state_in_order_and_filters_keep_some() {
        let (parts, nodes) = cluster();
        let c = Cluster::new(&parts, &nodes);
        let all = Filter::ALL;
        assert_eq!(
            shown(&c.by_state(&all)),
            [
                "gpu gpu01:idle,gpu07:idle",
                "gpu gpu02:mix",
                "gpu gpu03:drain",
                "gpu gpu04:down*",
                "gpu gpu09:unk*",
                "debug gpu01:idle",
                "debug gpu02:mix",
                "empty ",
            ]
        );
        let idle = [State::Idle];
        let picked = Filter {
            partitions: &["debug".to_string(), "empty".to_string()],
            states: &idle,
            nodes: None,
        };
        assert_eq!(shown(&c.by_state(&picked)), ["debug gpu01:idle"]);
        assert_eq!(shown(&c.by_partition(&picked)), ["debug gpu01:idle"]);
        // One line per node and partition; cpu1, in none, once with none.
        let by_node = shown(&c.by_node(&all));
        assert_eq!(by_node[0], "n/a cpu1:drain");
        assert_eq!(&by_node[1..3], ["gpu gpu01:idle", "debug gpu01:idle"]);
        assert_eq!(by_node.len(), 9);
        let named = Filter {
            partitions: &["debug".to_string()],
            ..all
        };
        assert_eq!(shown(&c.by_node(&named)).len(), 2);
    }

    #[test]
    fn reasons_name_who_drained_and_cover_silent_and_unregistered_nodes() {
        let (parts, nodes) = cluster();
        let c = Cluster::new(&parts, &nodes);
        let all = Filter::ALL;
        let lines = c.by_reason(&all);
        let got: Vec<(String, String, Option<u64>, String)> = (lines.iter())
            .map(|l| {
                let r = l.reason.clone().unwrap();
                (
                    r.text,
                    r.user,
                    r.since,
                    shown(std::slice::from_ref(l))[0].clone(),
                )
            })
            .collect();
        assert_eq!(
            got,
            [
                (
                    "Never registered".into(),
                    "wharf".into(),
                    None,
                    "n/a gpu09:unk*".into()
                ),
                (
                    "Not responding".into(),
                    "wharf".into(),
                    Some(3_600_000),
                    "n/a gpu04:down*".into()
                ),
                (
                    "bad fan".into(),
                    "root".into(),
                    Some(86_400_000),
                    "n/a gpu03:drain".into()
                ),
                (
                    "launch of job 7 failed".into(),
                    "wharf".into(),
                    None,
                    "n/a cpu1:drain".into()
                ),
            ]
        );
        // A partition named keeps its nodes' reasons only.
        let gpu = Filter {
            partitions: &["gpu".to_string()],
            ..all
        };
        assert_eq!(c.by_reason(&gpu).len(), 3);
    }
}
