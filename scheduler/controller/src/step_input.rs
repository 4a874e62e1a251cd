//! Steps' standard input on its way from their callers to their tasks: one bounded buffer
//! per step, filled by the caller's agent and emptied as the agents of the tasks that take
//! input pull it (see [`wharf_api::step_input`]).
//!
//! ```text
//!   push (caller's agent): the bytes past what the buffer has, as far as the step's buffer
//!     and the total have room; the answer says where to go on (a short answer: full, the
//!     caller's agent waits and its caller's writes block behind it)
//!   pull (a task's agent, per task: the offset written into the task): the bytes from
//!     there; a byte is dropped once every task that takes input is past it (or closed)
//!   the step ended or is being stopped: pushes are dropped, pulls answered with the end
//! ```
//!
//! Nothing here is durable, and nothing needs to be: the caller's agent keeps what it
//! pushed until the answers say every task that takes input has it (`held_from`, the
//! buffer's start). A restarted controller starts empty; the first push it gets names what
//! its agent still holds (`retained_from`), and the buffer starts there and asks for it
//! again. Only a push from an agent that keeps nothing (one from before it was sent) past
//! the buffer's end goes on from its own offset, the bytes between lost; a pull before the
//! buffer's start gets what there is.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use wharf_api::step::StepKey;
use wharf_api::step_input::{InputAck, InputBatch, InputLine, TaskChunk, TaskInput};

/// Bytes one step's buffer holds at most: what a task that does not read lets its caller
/// get ahead of it here.
pub const STEP_BYTES: usize = 1 << 20;
/// Bytes one job's steps' buffers hold at most together: one job's many steps whose tasks
/// do not read cannot take the whole relay from every other job.
pub const JOB_BYTES: usize = 8 << 20;
/// Bytes all steps' buffers hold at most.
pub const TOTAL_BYTES: usize = 64 << 20;
/// Bytes one task gets from one pull at most.
pub const PULL_BYTES: usize = 256 << 10;
/// Bytes one pull's answer carries at most, all its tasks together.
pub const PULL_TOTAL: usize = 1 << 20;

#[derive(Debug)]
struct Buffer {
    /// The offset of `data`'s first byte in the caller's input.
    start: u64,
    data: VecDeque<u8>,
    /// The input ends at `start + data.len()`.
    eof: bool,
    /// Per rank that takes input and has not closed it: the offset written into it so far.
    readers: BTreeMap<u32, u64>,
    touched: u64,
}

impl Buffer {
    fn end(&self) -> u64 {
        self.start.saturating_add(self.data.len() as u64)
    }

    /// Empties the buffer and starts it at `at`, past which every reader then is; returns
    /// how many bytes it held.
    fn skip_to(&mut self, at: u64) -> usize {
        let dropped = self.data.len();
        self.data.clear();
        self.start = at;
        for r in self.readers.values_mut() {
            *r = (*r).max(at);
        }
        dropped
    }

    /// The answer to a push: on from the buffer's end, and what every task has.
    fn ack(&self) -> InputAck {
        InputAck {
            next: self.end(),
            held_from: Some(self.held_from()),
        }
    }

    /// What every task that takes input has: the buffer's start, or one past the input's
    /// end once every reader got the end (and closed) or none is left.
    fn held_from(&self) -> u64 {
        if self.eof && self.readers.is_empty() {
            self.end().saturating_add(1)
        } else {
            self.start
        }
    }

    /// Drops what every reader is past.
    fn trim(&mut self) -> usize {
        let low = self.readers.values().copied().min().unwrap_or(self.end());
        let drop = (low.clamp(self.start, self.end()) - self.start) as usize;
        self.data.drain(..drop);
        self.start += drop as u64;
        drop
    }
}

/// Every step's input buffer.
#[derive(Debug, Default)]
pub struct InputRelay {
    steps: BTreeMap<StepKey, Buffer>,
    total: usize,
    /// Per step, the ranks whose nodes report their input closed (in every poll, so that a
    /// restarted controller learns it too, before or after the step's buffer is made again),
    /// and when they last did.
    closed: BTreeMap<StepKey, (BTreeSet<u32>, u64)>,
}

impl InputRelay {
    fn buffer(&mut self, key: StepKey, ranks: &[u32], start: u64, now: u64) -> &mut Buffer {
        let closed = self.closed.get(&key).map(|(c, _)| c);
        self.steps.entry(key).or_insert_with(|| Buffer {
            start,
            data: VecDeque::new(),
            eof: false,
            readers: ranks
                .iter()
                .filter(|r| !closed.is_some_and(|c| c.contains(r)))
                .map(|&r| (r, start))
                .collect(),
            touched: now,
        })
    }

    /// Ranks `ranks` of `key` take no more input: their tasks closed it or ended, as their
    /// node reports at each poll. What only they held back is dropped.
    pub fn closed(&mut self, key: StepKey, ranks: &[u32], now: u64) {
        let (set, seen) = self.closed.entry(key).or_default();
        *seen = now;
        // Said at every poll: ranks known already are no reader of the step's buffer (it
        // was made without them, or they were dropped from it then).
        let mut new = false;
        for &r in ranks {
            new |= set.insert(r);
        }
        if !new {
            return;
        }
        self.sweep(now);
        if let Some(b) = self.steps.get_mut(&key) {
            for r in ranks {
                b.readers.remove(r);
            }
            let dropped = b.trim();
            self.total -= dropped;
        }
    }

    /// Takes what the caller of `key` sent (`line`), as far as there is room. `ranks`: the
    /// step's ranks that take input, ascending
    /// ([`wharf_api::step_input::StepInput::ranks`]); `retained`: the pushing agent still
    /// holds the input from there (a gap before `line` is asked for again from there);
    /// `live`: the step runs (else the bytes are dropped, all taken). Idempotent: bytes
    /// before the buffer's end are skipped.
    pub fn push(
        &mut self,
        key: StepKey,
        ranks: &[u32],
        line: InputLine,
        retained: Option<u64>,
        live: bool,
        now: u64,
    ) -> InputAck {
        self.sweep(now);
        // Nothing more is wanted: everything up to `at`, and its end, counts as had.
        let done = |at: u64| InputAck {
            next: at,
            held_from: Some(at.saturating_add(1)),
        };
        // Past MAX_OFFSET: what no caller sends (its agent refuses such a line); dropped.
        let Some(past) = line.end() else {
            self.forget(key);
            return done(u64::MAX);
        };
        if !live {
            self.forget(key);
            return done(past);
        }
        let retained = retained.filter(|&r| r <= line.offset);
        let job_held: usize = (self.steps.range(StepKey::of_job(key.job)))
            .map(|(_, b)| b.data.len())
            .sum();
        let room = TOTAL_BYTES
            .saturating_sub(self.total)
            .min(JOB_BYTES.saturating_sub(job_held));
        let b = self.buffer(key, ranks, retained.unwrap_or(line.offset), now);
        b.touched = now;
        let mut dropped = 0;
        if let Some(r) = retained.filter(|_| line.offset > b.end()) {
            if r > b.end() {
                // Its pusher holds nothing before `r`: what it was told every task has, or,
                // when a task's place is behind it, what that pusher lost (it restarted).
                if let Some(&low) = b.readers.values().min().filter(|&&low| low < r) {
                    tracing::warn!(
                        job = key.job,
                        step = key.step,
                        lost = r - low,
                        "part of a step's input may have been lost"
                    );
                }
                dropped = b.skip_to(r);
            }
            if line.offset > b.end() {
                // A gap its pusher can fill (this controller restarted): ask for it.
                let ack = b.ack();
                self.total -= dropped;
                return ack;
            }
        }
        if line.offset > b.end() {
            // Bytes lost on the way (the caller's agent restarted): on from this one.
            tracing::warn!(
                job = key.job,
                step = key.step,
                lost = line.offset - b.end(),
                "part of a step's input was lost"
            );
            dropped = b.skip_to(line.offset);
        }
        let skip = (b.end() - line.offset).min(line.data.len() as u64) as usize;
        let new = &line.data[skip..];
        let mut added = 0;
        let take = if b.readers.is_empty() {
            // Nobody takes input any more: it is dropped as it comes, as srun does.
            b.start += new.len() as u64;
            new.len()
        } else {
            let take = new
                .len()
                .min(STEP_BYTES.saturating_sub(b.data.len()))
                .min(room + dropped);
            b.data.extend(&new[..take]);
            added = take;
            take
        };
        if line.eof && take == new.len() {
            b.eof = true;
        }
        let ack = b.ack();
        self.total = self.total + added - dropped;
        ack
    }

    /// What the tasks `tasks` of the node whose first rank is `base` (with `per_node` tasks)
    /// get next of `key`'s input, each from the offset written into it so far. A task that is
    /// not the node's or takes no input (`ranks`) gets nothing; one that closed is forgotten.
    /// `live`: the step runs; else every task is told its input ended.
    #[allow(clippy::too_many_arguments)]
    pub fn pull(
        &mut self,
        key: StepKey,
        ranks: &[u32],
        base: u32,
        per_node: u32,
        tasks: Vec<TaskInput>,
        live: bool,
        now: u64,
    ) -> InputBatch {
        self.sweep(now);
        let mine: Vec<TaskInput> = tasks
            .into_iter()
            .filter(|t| t.task < per_node && ranks.binary_search(&(base + t.task)).is_ok())
            .collect();
        if !live {
            self.forget(key);
            let chunks = mine
                .iter()
                .filter(|t| !t.closed)
                .map(|t| TaskChunk {
                    task: t.task,
                    offset: t.offset,
                    data: vec![],
                    eof: true,
                })
                .collect();
            return InputBatch { chunks };
        }
        // A task that closed is recorded as its node's polls record it, so that a buffer
        // made again does not count it as a reader either.
        let closing: Vec<u32> = mine
            .iter()
            .filter(|t| t.closed)
            .map(|t| base + t.task)
            .collect();
        if !closing.is_empty() {
            self.closed(key, &closing, now);
        }
        let b = self.buffer(key, ranks, 0, now);
        b.touched = now;
        let mut chunks = Vec::new();
        let mut budget = PULL_TOTAL;
        for t in mine.iter().filter(|t| !t.closed) {
            let rank = base + t.task;
            let Some(at) = b.readers.get_mut(&rank) else {
                // Closed before (an agent that restarted lost its pipe): nothing more.
                continue;
            };
            *at = (*at).max(t.offset).max(b.start);
            let from = *at;
            let end = b.end();
            // Past the end (this controller restarted after the bytes were written): none.
            let len = (end.saturating_sub(from) as usize)
                .min(PULL_BYTES)
                .min(budget);
            budget -= len;
            let skip = from.saturating_sub(b.start) as usize;
            let data: Vec<u8> = match len {
                0 => vec![],
                _ => b.data.range(skip..skip + len).copied().collect(),
            };
            let eof = b.eof && from + len as u64 == end;
            if !data.is_empty() || eof {
                chunks.push(TaskChunk {
                    task: t.task,
                    offset: from,
                    data,
                    eof,
                });
            }
        }
        let dropped = b.trim();
        self.total -= dropped;
        InputBatch { chunks }
    }

    /// Drops `key`'s buffer (its caller went away, the step ended).
    pub fn forget(&mut self, key: StepKey) {
        if let Some(b) = self.steps.remove(&key) {
            self.total -= b.data.len();
        }
        self.closed.remove(&key);
    }

    /// Whether ranks of `key` are known to have closed their input.
    #[cfg(test)]
    pub fn knows_closed(&self, key: StepKey) -> bool {
        self.closed.contains_key(&key)
    }

    /// Bytes held, all steps together (what the tests check the bounds by).
    #[cfg(test)]
    pub fn held(&self) -> usize {
        self.total
    }

    fn sweep(&mut self, now: u64) {
        for k in crate::step_output::idle_steps(&self.steps, now, |b| b.touched) {
            self.forget(k);
        }
        for k in crate::step_output::idle_steps(&self.closed, now, |c| c.1) {
            self.closed.remove(&k);
        }
    }
}

#[cfg(test)]
mod tests;
