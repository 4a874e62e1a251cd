//! A step's standard input on its way from its caller to its tasks (`wharf step`, Slurm's
//! `srun --input`): the caller's agent pushes what the caller sends to the controller, which
//! holds a bounded buffer per step; the agent of each node with a task that takes input pulls
//! from there and writes it into the task's standard input (a pipe the shim made).
//!
//! ```text
//!  wharf step ─InputLine─▶ caller's agent ─POST /v1/agent/steps/input (offset)─▶ controller
//!                                          ◀──── the offset it wants next ─────  buffer
//!  task ◀─pipe─ node's agent ─POST /v1/agent/steps/input/pull (per task: offset)─▶ │
//!                            ◀──── the bytes from there, and whether that is the end ─┘
//! ```
//!
//! Every byte is named by its offset in the caller's input, so a push or pull sent twice
//! takes or gives nothing twice. The controller keeps a byte until every task that takes
//! input has pulled past it: a task that does not read holds its caller back, as a pipe
//! would, within the buffer's bound.

use serde::{Deserialize, Serialize};

use crate::step::StepKey;
use crate::step_output::b64;

/// Which of a step's tasks get the caller's standard input (`srun -i/--input`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StepInput {
    /// None: every task's standard input is `/dev/null` (what a caller from before input
    /// forwarding gets).
    #[default]
    None,
    /// Only the task with this rank (srun's default is rank 0); the others get `/dev/null`.
    Task(u32),
    /// Every task gets all of it.
    All,
}

impl StepInput {
    /// Whether the task with step rank `rank` takes the caller's input.
    pub fn takes(self, rank: u32) -> bool {
        match self {
            StepInput::None => false,
            StepInput::Task(r) => r == rank,
            StepInput::All => true,
        }
    }

    /// The ranks of a step of `ntasks` tasks that take input, ascending.
    pub fn ranks(self, ntasks: u32) -> Vec<u32> {
        (0..ntasks).filter(|&r| self.takes(r)).collect()
    }

    /// `srun -i`'s words: `all`, `none`, or a task's rank.
    ///
    /// Errors: anything else, with words for the caller.
    pub fn parse(text: &str) -> Result<StepInput, String> {
        match text {
            "all" => Ok(StepInput::All),
            "none" => Ok(StepInput::None),
            n => n.parse().map(StepInput::Task).map_err(|_| {
                format!(
                    "--input {n:?}: give `all`, `none` or a task's rank (a file name is not \
                     taken: redirect the file into this command instead)"
                )
            }),
        }
    }
}

/// The farthest a step's input may reach (4 EiB): a line past it is refused, so no offset
/// arithmetic can overflow.
pub const MAX_OFFSET: u64 = 1 << 62;

/// What `wharf step` sends its agent after the request, one JSON line each: the next bytes
/// of its standard input.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct InputLine {
    /// Where in the caller's input the bytes start.
    pub offset: u64,
    /// The bytes.
    #[serde(with = "b64")]
    pub data: Vec<u8>,
    /// The input ends after these bytes.
    #[serde(default)]
    pub eof: bool,
}

impl InputLine {
    /// Where the line's bytes end in the caller's input, when that is within [`MAX_OFFSET`].
    pub fn end(&self) -> Option<u64> {
        (self.offset.checked_add(self.data.len() as u64)).filter(|&e| e <= MAX_OFFSET)
    }
}

/// `POST /v1/agent/steps/input`: the caller's agent passes on what its caller sent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InputPush {
    /// The pushing agent's node (the caller's: it must hold part of the step's job).
    pub node: String,
    /// The step.
    pub key: StepKey,
    /// The bytes, their offset and whether the input ends after them.
    pub input: InputLine,
    /// The pushing agent still holds its caller's input from this offset (up to the push's
    /// end): a controller that lost its buffer (it restarted) asks for it again rather than
    /// go on past a gap. Absent from an agent from before it was sent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retained_from: Option<u64>,
}

/// The controller's answer to a push.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct InputAck {
    /// Everything before this offset is taken; push on from here (when it is short of the
    /// push's end, the buffer is full: try the rest again later; when it is before the
    /// push's offset, a controller that lost its buffer asks for what the pusher retained).
    pub next: u64,
    /// Every task that takes the input has everything before this offset (or takes no
    /// more): the pusher may forget it. One past the input's end: every task has its end
    /// too. Absent from a controller from before it was sent: the pusher then keeps nothing
    /// past `next`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held_from: Option<u64>,
}

/// One task's place in the input, as its node's agent has written it into the task.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskInput {
    /// The task's index on the pulling node (its local rank).
    pub task: u32,
    /// Everything before this offset was written into the task: the controller may drop it.
    pub offset: u64,
    /// The task takes no more (it closed its input or ended): hold nothing back for it.
    #[serde(default)]
    pub closed: bool,
}

/// `POST /v1/agent/steps/input/pull`: a node's agent asks for the input of its tasks of a
/// step.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InputPull {
    /// The pulling agent's node (one of the step's).
    pub node: String,
    /// The step.
    pub key: StepKey,
    /// Its tasks that take input.
    pub tasks: Vec<TaskInput>,
}

/// Input for one task of a pull.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskChunk {
    /// The task's index on the node.
    pub task: u32,
    /// Where the bytes start (past the pull's offset when input was lost, e.g. the
    /// controller restarted).
    pub offset: u64,
    /// The bytes.
    #[serde(with = "b64")]
    pub data: Vec<u8>,
    /// The input ends after these bytes: close the task's input.
    #[serde(default)]
    pub eof: bool,
}

/// The controller's answer to a pull.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct InputBatch {
    /// Per task with something to write (or whose input ended).
    pub chunks: Vec<TaskChunk>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn input_goes_to_rank_0_by_default_to_all_or_to_none() {
        assert_eq!(StepInput::parse("0"), Ok(StepInput::Task(0)));
        assert_eq!(StepInput::parse("all"), Ok(StepInput::All));
        assert_eq!(StepInput::parse("none"), Ok(StepInput::None));
        assert!(StepInput::parse("in.txt").unwrap_err().contains("redirect"));
        assert_eq!(StepInput::Task(1).ranks(3), [1]);
        assert_eq!(StepInput::All.ranks(3), [0, 1, 2]);
        assert!(StepInput::None.ranks(3).is_empty());
        // A caller from before input forwarding sends none: its tasks read /dev/null.
        assert_eq!(StepInput::default(), StepInput::None);
        let text = serde_json::to_string(&StepInput::Task(2)).unwrap();
        assert_eq!(text, r#"{"task":2}"#);
    }

    #[test]
    fn input_bytes_travel_as_they_are() {
        let l = InputLine {
            offset: 3,
            data: b"a\0\xff\n".to_vec(),
            eof: true,
        };
        let text = serde_json::to_string(&l).unwrap();
        assert_eq!(serde_json::from_str::<InputLine>(&text).unwrap(), l);
    }
}
