//! A step's output on its way to its caller (`wharf step`, Slurm's `srun`): each node's agent
//! reads what its tasks wrote and pushes it to the controller, which holds a bounded buffer
//! per step; the caller's agent reads it from there and passes it on to the caller.
//!
//! ```text
//!  task ─▶ DIR/stdout ─▶ agent ─POST /v1/agent/steps/output (offsets)─▶ controller buffer
//!                               ◀── per stream: the next offset it wants ──
//!  wharf step ◀─Output lines─ caller's agent ─POST /v1/agent/steps/output/read (ack)─▶
//! ```
//!
//! Every stream is sent by offset: a push the controller cannot take (its buffer is full)
//! is taken again later from the file, where it waits, so neither side holds more than its
//! bound; an agent that restarts pushes from 0 and is told where to go on.

use serde::{Deserialize, Serialize};

use crate::step::{StepKey, StepRecord};

/// Which of a task's output streams.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Stream {
    /// Standard output.
    Stdout,
    /// Standard error.
    Stderr,
}

/// Bytes as base64 in JSON (output is the user's own bytes, control characters included).
pub(crate) mod b64 {
    use base64::Engine;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&base64::engine::general_purpose::STANDARD.encode(v))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let text = String::deserialize(d)?;
        base64::engine::general_purpose::STANDARD
            .decode(text)
            .map_err(serde::de::Error::custom)
    }
}

/// Bytes one task wrote to one stream, starting at `offset` of what it wrote there.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PushChunk {
    /// The task's index on the pushing node (its local rank).
    pub task: u32,
    /// Which stream.
    pub stream: Stream,
    /// Where in the stream the bytes start.
    pub offset: u64,
    /// The bytes.
    #[serde(with = "b64")]
    pub data: Vec<u8>,
}

/// `POST /v1/agent/steps/output`: a node's agent passes on what its tasks of a step wrote.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutputPush {
    /// The pushing agent's node.
    pub node: String,
    /// The step.
    pub key: StepKey,
    /// The controller's buffer the agent pushed to before (an earlier answer's `buffer`;
    /// 0 for none): when it is gone (the controller restarted), the answer says `rewind`.
    #[serde(default)]
    pub buffer: u64,
    /// What its tasks wrote, each stream in order.
    pub chunks: Vec<PushChunk>,
}

/// Where one stream goes on: the offset the controller wants next.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamAck {
    /// The task's index on the node.
    pub task: u32,
    /// Which stream.
    pub stream: Stream,
    /// Everything before this offset is taken; push on from here.
    pub next: u64,
    /// Everything before this offset was passed on to the caller: the agent may forget it
    /// (and an ended task, once this reaches its stream's end, is drained).
    #[serde(default)]
    pub read: u64,
}

/// The controller's answer to a push.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutputAck {
    /// Per stream pushed: where to go on.
    pub acks: Vec<StreamAck>,
    /// Nobody will read the step's output (it ended, its caller went away): push no more.
    #[serde(default)]
    pub discard: bool,
    /// The step's buffer, to name in the next push.
    #[serde(default)]
    pub buffer: u64,
    /// The buffer pushed to before is gone, and nothing was taken: push again from the
    /// first byte the caller has not been passed (its duplicates are dropped by offset).
    #[serde(default)]
    pub rewind: bool,
}

/// `POST /v1/agent/steps/output/read`: the caller's agent fetches the step's output and
/// acknowledges what it passed on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutputRead {
    /// The reading agent's node (it must hold part of the step's job).
    pub node: String,
    /// The step.
    pub key: StepKey,
    /// The buffer the reader has read from (an earlier answer's `buffer`; 0 for none).
    #[serde(default)]
    pub buffer: u64,
    /// The last chunk the reader passed on (`seq`): it and those before it are dropped.
    #[serde(default)]
    pub after: u64,
}

/// Bytes one task of the step wrote, as the caller gets them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutputChunk {
    /// Its place in the buffer (increasing).
    pub seq: u64,
    /// The task's rank in the step.
    pub rank: u32,
    /// Which stream.
    pub stream: Stream,
    /// Where in the stream the bytes start (the caller drops what it has already: a
    /// restart may send some again).
    #[serde(default)]
    pub offset: u64,
    /// The bytes.
    #[serde(with = "b64")]
    pub data: Vec<u8>,
}

/// The controller's answer to a read.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutputBatch {
    /// The buffer read from (changes when the controller restarted).
    pub buffer: u64,
    /// Output not yet acknowledged, oldest first.
    pub chunks: Vec<OutputChunk>,
    /// More is waiting than one answer carries.
    #[serde(default)]
    pub more: bool,
    /// Bytes dropped since the last read (nobody read for too long).
    #[serde(default)]
    pub dropped: u64,
    /// The step, once it ended and all its output was read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<StepRecord>,
}

/// What a step's caller asks for its tasks' output.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepOutput {
    /// Standard output goes to the caller (else to `output`, or the job's file beside).
    #[serde(default)]
    pub stream: bool,
    /// File pattern for standard output (`%t` the rank, `%s` the step, `%j` the job, `%N`
    /// the node; relative to the caller's directory); standard error follows it unless
    /// `error` is given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<String>,
    /// File pattern for standard error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl StepOutput {
    /// Whether each stream, (stdout, stderr), goes to the caller.
    pub fn captured(&self) -> (bool, bool) {
        if !self.stream {
            return (false, false);
        }
        (
            self.output.is_none(),
            self.error.is_none() && self.output.is_none(),
        )
    }
}

/// Expands a step's file pattern for its tasks on `node`: `%s` the step, `%j` the job, `%J`
/// both, `%N` the node's short name. `%t` and `%%` are left for the task's rank
/// ([`crate::alloc::rank_path`]: without `%t`, ranks past 0 get `.rankR` after the name, as a
/// job's ranks do), the job's other letters for its node ([`crate::pattern`]).
pub fn expand_for_node(pattern: &str, job: u64, step: u32, node: &str) -> String {
    use crate::pattern::Value;
    crate::pattern::expand(pattern, |c| match c {
        's' => Some(Value::Num(step.into())),
        'j' => Some(Value::Num(job)),
        'J' => Some(Value::Text(format!("{job}.{step}"))),
        'N' => Some(Value::Text(crate::pattern::short_name(node).into())),
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_bytes_travel_as_they_are() {
        let c = PushChunk {
            task: 1,
            stream: Stream::Stderr,
            offset: 7,
            data: b"\x1b[31mred\r\n\0\xff".to_vec(),
        };
        let text = serde_json::to_string(&c).unwrap();
        assert!(text.contains("\"stream\":\"stderr\""), "{text}");
        assert_eq!(serde_json::from_str::<PushChunk>(&text).unwrap(), c);
    }

    #[test]
    fn a_files_pattern_names_rank_step_job_and_node() {
        let p = expand_for_node("out-%j.%s.%N.%t", 12, 3, "n1");
        assert_eq!(p, "out-12.3.n1.%t");
        assert_eq!(crate::alloc::rank_path(&p, 4), "out-12.3.n1.4");
        assert_eq!(crate::alloc::rank_path("/o/x", 2), "/o/x.rank2");
        assert_eq!(crate::alloc::rank_path("/o/x", 0), "/o/x");
    }

    #[test]
    fn a_stream_goes_to_the_caller_unless_a_file_takes_it() {
        let s = |stream, output: Option<&str>, error: Option<&str>| StepOutput {
            stream,
            output: output.map(String::from),
            error: error.map(String::from),
        };
        assert_eq!(s(true, None, None).captured(), (true, true));
        assert_eq!(s(true, Some("o"), None).captured(), (false, false));
        assert_eq!(s(true, None, Some("e")).captured(), (true, false));
        assert_eq!(s(false, None, None).captured(), (false, false));
    }
}
