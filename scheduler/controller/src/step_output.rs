//! Steps' output on its way from their nodes to their callers: one bounded buffer per step,
//! filled by the nodes' agents and emptied by the caller's (see [`wharf_api::step_output`]).
//!
//! ```text
//!   push (node's agent): each stream taken from the offset it stands at, as far as the
//!     step's buffer and the total have room; the rest waits in the task's file
//!   read (caller's agent): drops what it acknowledges (`after`), gets the oldest chunks
//!   nobody reads for READER_GONE_MS while the buffer is full: dropped from then on, counted,
//!     and the count told to a reader that comes back
//! ```
//!
//! Nothing here is durable: a restarted controller starts empty, and each agent's next push
//! is told `rewind` and starts its streams again from what the caller was not passed, which
//! its files still hold (a task is drained only once its caller was passed all of it; a
//! reader sees a new buffer id and acknowledges nothing of the old one).

use std::collections::{BTreeMap, VecDeque};

use wharf_api::step::{StepKey, StepRecord};
use wharf_api::step_output::{OutputAck, OutputBatch, OutputChunk, PushChunk, Stream, StreamAck};

/// Bytes one step's buffer holds at most.
pub const STEP_BYTES: usize = 8 << 20;
/// Bytes one job's steps' buffers hold at most together: one job's many steps whose
/// callers read slowly cannot take the whole relay from every other job.
pub const JOB_BYTES: usize = 32 << 20;
/// Bytes all steps' buffers hold at most.
pub const TOTAL_BYTES: usize = 256 << 20;
/// Bytes one read answer carries at most (at least one chunk).
pub const READ_BYTES: usize = 1 << 20;
/// A full buffer nobody read for this long drops what comes (its caller is not coming back,
/// and the step's nodes must not wait on it to report their end).
pub const READER_GONE_MS: u64 = 150_000;
/// A buffer untouched this long is forgotten (its step ended and nobody read it).
pub const IDLE_MS: u64 = 600_000;

#[derive(Debug)]
struct Buffer {
    id: u64,
    chunks: VecDeque<OutputChunk>,
    bytes: usize,
    next_seq: u64,
    /// Per (rank, stream): the offset wanted next.
    offsets: BTreeMap<(u32, Stream), u64>,
    /// Per (rank, stream): the offset the reader has acknowledged up to.
    read_to: BTreeMap<(u32, Stream), u64>,
    last_read: u64,
    touched: u64,
    /// Nobody reads: what comes is dropped (and counted).
    discarding: bool,
    dropped: u64,
}

/// Every step's output buffer.
#[derive(Debug, Default)]
pub struct Relay {
    steps: BTreeMap<StepKey, Buffer>,
    total: usize,
    last_id: u64,
}

impl Relay {
    fn buffer(&mut self, key: StepKey, now: u64) -> &mut Buffer {
        let id = now.max(self.last_id + 1);
        let last_id = &mut self.last_id;
        self.steps.entry(key).or_insert_with(|| {
            *last_id = id;
            Buffer {
                id,
                chunks: VecDeque::new(),
                bytes: 0,
                next_seq: 1,
                offsets: BTreeMap::new(),
                read_to: BTreeMap::new(),
                last_read: now,
                touched: now,
                discarding: false,
                dropped: 0,
            }
        })
    }

    /// Takes what a node pushed for its tasks of `key`, whose first rank there is `base`,
    /// as far as there is room. `live`: the step runs and its caller waits (else everything
    /// is refused with `discard`). `buffer`: the buffer the node pushed to before; when that
    /// one is gone, nothing is taken and the answer says `rewind`. Idempotent: bytes before
    /// a stream's offset are skipped.
    pub fn push(
        &mut self,
        key: StepKey,
        base: u32,
        buffer: u64,
        chunks: Vec<PushChunk>,
        live: bool,
        now: u64,
    ) -> OutputAck {
        self.sweep(now);
        if !live {
            if let Some(b) = self.steps.get_mut(&key) {
                b.discarding = true;
            }
            return OutputAck {
                discard: true,
                ..Default::default()
            };
        }
        let mut total = self.total;
        let held: usize = (self.steps.range(StepKey::of_job(key.job)))
            .map(|(_, b)| b.bytes)
            .sum();
        let mut job_room = JOB_BYTES.saturating_sub(held);
        let b = self.buffer(key, now);
        b.touched = now;
        if b.discarding {
            b.dropped += chunks.iter().map(|c| c.data.len() as u64).sum::<u64>();
            return OutputAck {
                discard: true,
                buffer: b.id,
                ..Default::default()
            };
        }
        if buffer != 0 && buffer != b.id {
            return OutputAck {
                buffer: b.id,
                rewind: true,
                ..Default::default()
            };
        }
        let mut acks = Vec::new();
        let mut full = false;
        for c in chunks {
            let rank = base + c.task;
            let want = b.offsets.entry((rank, c.stream)).or_insert(c.offset);
            // Past what was taken (this controller restarted): go on from there.
            if c.offset > *want {
                *want = c.offset;
            }
            let end = c.offset + c.data.len() as u64;
            if end > *want {
                let skip = (*want - c.offset) as usize;
                let room = (STEP_BYTES - b.bytes)
                    .min(TOTAL_BYTES.saturating_sub(total))
                    .min(job_room);
                let take = (c.data.len() - skip).min(room);
                full |= take < c.data.len() - skip;
                if take > 0 {
                    b.chunks.push_back(OutputChunk {
                        seq: b.next_seq,
                        rank,
                        stream: c.stream,
                        offset: *want,
                        data: c.data[skip..skip + take].to_vec(),
                    });
                    b.next_seq += 1;
                    b.bytes += take;
                    total += take;
                    job_room -= take;
                    *want += take as u64;
                }
            }
            let next = *want;
            acks.push(StreamAck {
                task: c.task,
                stream: c.stream,
                next,
                read: b.read_to.get(&(rank, c.stream)).copied().unwrap_or(0),
            });
        }
        if full && now.saturating_sub(b.last_read) > READER_GONE_MS {
            tracing::warn!(
                job = key.job,
                step = key.step,
                "nobody reads the step's output; dropping it"
            );
            b.discarding = true;
        }
        let id = b.id;
        self.total = total;
        OutputAck {
            acks,
            buffer: id,
            ..Default::default()
        }
    }

    /// The oldest output of `key` not yet acknowledged, once what the reader acknowledges
    /// (`after` of `buffer`) is dropped. `step` is the step as it stands: once it ended and
    /// nothing is left, the answer carries it and the buffer is gone.
    pub fn read(
        &mut self,
        key: StepKey,
        buffer: u64,
        after: u64,
        step: StepRecord,
        now: u64,
    ) -> OutputBatch {
        self.sweep(now);
        let ended = step.exit.is_some();
        let Some(b) = self.steps.get_mut(&key) else {
            return OutputBatch {
                step: ended.then_some(step),
                ..Default::default()
            };
        };
        if buffer == b.id {
            while b.chunks.front().is_some_and(|c| c.seq <= after) {
                let c = b.chunks.pop_front().expect("front");
                b.bytes -= c.data.len();
                self.total -= c.data.len();
                let end = c.offset + c.data.len() as u64;
                let read = b.read_to.entry((c.rank, c.stream)).or_default();
                *read = (*read).max(end);
            }
        }
        b.last_read = now;
        b.touched = now;
        b.discarding = false;
        let dropped = std::mem::take(&mut b.dropped);
        let mut chunks = Vec::new();
        let mut size = 0;
        for c in &b.chunks {
            if !chunks.is_empty() && size + c.data.len() > READ_BYTES {
                break;
            }
            size += c.data.len();
            chunks.push(c.clone());
        }
        let more = chunks.len() < b.chunks.len();
        let id = b.id;
        let done = ended && chunks.is_empty();
        if done {
            self.steps.remove(&key);
        }
        OutputBatch {
            buffer: id,
            chunks,
            more,
            dropped,
            step: done.then_some(step),
        }
    }

    /// The step's caller went away: its output is dropped from now on.
    pub fn abandon(&mut self, key: StepKey, now: u64) {
        let b = self.buffer(key, now);
        let held = std::mem::take(&mut b.bytes);
        b.chunks.clear();
        b.discarding = true;
        self.total -= held;
    }

    /// Drops `key`'s buffer: a step of that key starts anew (a requeued job's steps are
    /// numbered from 0 again), and nothing of an earlier one's is its.
    pub fn forget(&mut self, key: StepKey) {
        if let Some(b) = self.steps.remove(&key) {
            self.total -= b.bytes;
        }
    }

    /// Bytes held, all steps together.
    pub fn held(&self) -> usize {
        self.total
    }

    fn sweep(&mut self, now: u64) {
        for k in idle_steps(&self.steps, now, |b| b.touched) {
            if let Some(b) = self.steps.remove(&k) {
                self.total -= b.bytes;
            }
        }
    }
}

/// The steps of `steps` whose buffer was last `touched` more than [`IDLE_MS`] before `now`.
pub(crate) fn idle_steps<B>(
    steps: &std::collections::BTreeMap<StepKey, B>,
    now: u64,
    touched: impl Fn(&B) -> u64,
) -> Vec<StepKey> {
    (steps.iter())
        .filter(|(_, b)| now.saturating_sub(touched(b)) > IDLE_MS)
        .map(|(k, _)| *k)
        .collect()
}

#[cfg(test)]
mod tests;
