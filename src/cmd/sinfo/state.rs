//! A node's state in sinfo's words, and `-t`'s state filter.

use wharf_api::node::NodeState;
use wharf_api::NodeRecord;

/// A node's state as sinfo names it: from the controller's up/down/drain, what its jobs
/// hold, and whether it ever registered. Declared in the order a partition's lines are
/// listed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum State {
    /// Up, no CPU allocated.
    Idle,
    /// Up, some of its CPUs allocated.
    Mixed,
    /// Up, every CPU allocated.
    Allocated,
    /// Up, but still killing what it runs of jobs the controller is done with: it takes no
    /// job until then (the controller gives why as its reason).
    Completing,
    /// Drained, still running jobs.
    Draining,
    /// Drained, running nothing.
    Drained,
    /// Silent for longer than the node timeout.
    Down,
    /// Drained and silent.
    DrainedDown,
    /// Named by a partition, never registered.
    Unknown,
}

impl State {
    /// Every state, in listing order.
    pub const ALL: [State; 9] = [
        State::Idle,
        State::Mixed,
        State::Allocated,
        State::Completing,
        State::Draining,
        State::Drained,
        State::Down,
        State::DrainedDown,
        State::Unknown,
    ];

    /// The state of registered node `n`. CPUs decide idle, mixed and allocated, as the
    /// controller counts a partition's nodes for `sinfo -s`.
    pub fn of(n: &NodeRecord) -> State {
        let (used, have) = (n.allocated.cpus, n.info.capacity().cpus);
        match n.state {
            NodeState::Down if n.drained_since.is_some() => State::DrainedDown,
            NodeState::Down => State::Down,
            NodeState::Drain if used > 0 => State::Draining,
            NodeState::Drain => State::Drained,
            // An up node's reason is what it still has to kill (see `State::Completing`).
            NodeState::Up if n.reason.is_some() => State::Completing,
            NodeState::Up if used == 0 => State::Idle,
            NodeState::Up if used >= have => State::Allocated,
            NodeState::Up => State::Mixed,
        }
    }

    /// sinfo's short word (`%t`, the default listing); `*` marks a node that does not answer.
    pub fn short(self) -> &'static str {
        match self {
            State::Idle => "idle",
            State::Mixed => "mix",
            State::Allocated => "alloc",
            State::Completing => "comp",
            State::Draining => "drng",
            State::Drained => "drain",
            State::Down => "down*",
            State::DrainedDown => "drain*",
            State::Unknown => "unk*",
        }
    }

    /// sinfo's long word (`%T`, `-l`).
    pub fn long(self) -> &'static str {
        match self {
            State::Idle => "idle",
            State::Mixed => "mixed",
            State::Allocated => "allocated",
            State::Completing => "completing",
            State::Draining => "draining",
            State::Drained => "drained",
            State::Down => "down*",
            State::DrainedDown => "drained*",
            State::Unknown => "unknown*",
        }
    }

    /// The states `-t` word `word` names (Slurm's names, any case), `None` for a word it
    /// does not know: `drain` is drained and draining nodes, `down` and `no_respond` every
    /// node that does not answer, `all` every state.
    pub fn named(word: &str) -> Option<&'static [State]> {
        use State::*;
        Some(match word.trim().to_ascii_lowercase().as_str() {
            "idle" => &[Idle],
            "mix" | "mixed" => &[Mixed],
            "alloc" | "allocated" => &[Allocated],
            "comp" | "completing" => &[Completing],
            "drng" | "draining" => &[Draining],
            "drained" => &[Drained, DrainedDown],
            "drain" => &[Draining, Drained, DrainedDown],
            "down" | "no_respond" | "not_responding" => &[Down, DrainedDown, Unknown],
            "unk" | "unknown" => &[Unknown],
            "all" => &State::ALL,
            _ => return None,
        })
    }
}

/// The states `-t` keeps (every state when `words` is empty); an unknown word is refused,
/// naming the words there are.
pub fn picked(words: &[String]) -> anyhow::Result<Vec<State>> {
    if words.is_empty() {
        return Ok(State::ALL.to_vec());
    }
    let mut states = Vec::new();
    for w in words {
        let Some(named) = State::named(w) else {
            anyhow::bail!(
                "-t: unknown node state {:?}; use idle, mix, alloc, comp, drng, drain, \
                 drained, down, unk or all (comma-separated)",
                crate::output::clean(w)
            );
        };
        states.extend_from_slice(named);
    }
    states.sort();
    states.dedup();
    Ok(states)
}

#[cfg(test)]
pub(crate) mod tests {
    use wharf_api::node::{NodeInfo, NodeState};
    use wharf_api::resources::Resources;
    use wharf_api::NodeRecord;

    use super::State;

    /// Node `name` with 8 CPUs, `cpus` of them allocated.
    pub(crate) fn node(name: &str, state: NodeState, cpus: u32) -> NodeRecord {
        NodeRecord {
            info: NodeInfo::new(name, "10.0.0.1", 8, 16 << 30, vec![]),
            state,
            last_seen: 0,
            allocated: Resources {
                cpus,
                memory: 0,
                gpus: 0,
            },
            jobs: u32::from(cpus > 0),
            images: vec![],
            reason: None,
            drained_since: None,
        }
    }

    #[test]
    fn states_are_slurms_words_from_what_the_jobs_hold() {
        let of = |state, cpus| State::of(&node("n1", state, cpus));
        assert_eq!(of(NodeState::Up, 0).short(), "idle");
        assert_eq!(of(NodeState::Up, 3).short(), "mix");
        assert_eq!(of(NodeState::Up, 8).short(), "alloc");
        assert_eq!(of(NodeState::Drain, 2).short(), "drng");
        assert_eq!(of(NodeState::Drain, 0).short(), "drain");
        assert_eq!(of(NodeState::Down, 0).short(), "down*");
        assert_eq!(of(NodeState::Up, 3).long(), "mixed");
        assert_eq!(of(NodeState::Drain, 0).long(), "drained");
        let mut leftover = node("n1", NodeState::Up, 0);
        leftover.reason = Some("takes no job until ...".into());
        assert_eq!(State::of(&leftover).short(), "comp");
        let mut drained_down = node("n1", NodeState::Down, 0);
        drained_down.drained_since = Some(1);
        assert_eq!(State::of(&drained_down).short(), "drain*");
    }

    #[test]
    fn dash_t_takes_slurms_state_names_in_any_case() {
        let picked = |w: &[&str]| {
            let words: Vec<String> = w.iter().map(|s| s.to_string()).collect();
            super::picked(&words).map_err(|e| e.to_string())
        };
        assert_eq!(picked(&[]).unwrap(), State::ALL);
        assert_eq!(
            picked(&["DRAIN", "idle"]).unwrap(),
            [
                State::Idle,
                State::Draining,
                State::Drained,
                State::DrainedDown
            ]
        );
        assert_eq!(picked(&["mixed", "mix"]).unwrap(), [State::Mixed]);
        let e = picked(&["sleepy"]).unwrap_err();
        assert!(e.contains("unknown node state \"sleepy\""), "{e}");
    }
}
