//! Passing steps' standard input on, both ways of the controller (see
//! [`wharf_api::step_input`]):
//!
//! ```text
//!  caller's node:  wharf step ─InputLine─▶ [`Caller`]: one line at a time, pushed until the
//!                  controller took it (a full buffer: tried again every INPUT_RETRY, and the
//!                  caller's next line waits in the socket, its writes blocking behind it)
//!  task's node:    the pump, every PUMP_EVERY, backing off to PUMP_IDLE_MAX while no input
//!                  comes (at once again while input flows):
//!    shim made DIR/input/stdin ─▶ opened for writing, non-blocking ─▶ DIR/input/ready
//!    pending empty ─▶ pull from the offset written so far ─▶ written as the pipe takes it,
//!      each write counted in DIR/input/written
//!    the input's end ─▶ DIR/input/end, the shim woken ─▶ it lets go too: the task's end
//!    the task ended or closed its input (EPIPE) ─▶ the controller told: hold nothing for it
//! ```
//!
//! Memory holds, per caller, what it sent that not every task has yet (`Outbox`: at most
//! the controller's step buffer and one line), so that a restarted controller can ask for
//! it again; and one pull (at most the controller's `PULL_BYTES`, 256 KiB) per task. What
//! the tasks have not read yet waits in the controller's bounded buffer, and behind it in
//! the caller's socket and pipe. After the input's end the caller's agent asks, less often
//! the longer nothing moves, until every task has it, watching its caller's connection
//! meanwhile. **An agent that restarts** opens its tasks' pipes again (the shim holds a
//! writer of its own, so the task never saw an end) and goes on from `written`: a task
//! reads its input once and in order, unless the agent was killed between a write and its
//! count (that write's bytes then come twice). A caller's agent loses what it held (the
//! controller goes on past the gap).

use std::collections::BTreeMap;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use tokio::net::unix::OwnedReadHalf;
use tokio::sync::watch;
use wharf_api::step::{StepKey, StepRecord};
use wharf_api::step_input::{InputAck, InputBatch, InputLine, InputPull, InputPush, TaskInput};
use wharf_client::Client;
use wharf_runtime::{Backend, JobDir, JobStatus};

use std::os::unix::fs::FileExt;

use crate::AgentConfig;

/// How often the tasks' pipes are looked at when no input flowed.
const PUMP_EVERY: Duration = Duration::from_millis(50);
/// The longest the pump waits between rounds while no input comes.
const PUMP_IDLE_MAX: Duration = Duration::from_millis(400);
/// How soon a push the controller had no room for is tried again.
const INPUT_RETRY: Duration = Duration::from_millis(50);
/// The longest line a caller sends (64 KiB of input as base64, with room to spare): longer
/// is a broken caller, taken as gone.
pub const MAX_INPUT_LINE: u64 = 256 << 10;

/// The caller's side of a step's connection, read on a task of its own: its input lines
/// pushed to the controller; its end (it hung up) told to whoever waits.
#[derive(Debug)]
pub(crate) struct Caller {
    gone: watch::Receiver<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Caller {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Caller {
    /// Starts reading `rd` (the request already read from it) for `key`'s input.
    pub(crate) fn start(
        rd: BufReader<OwnedReadHalf>,
        node: &str,
        key: StepKey,
        client: &Client,
    ) -> Caller {
        let (tx, gone) = watch::channel(false);
        let (node, client) = (node.to_string(), client.clone());
        let task = tokio::spawn(async move {
            forward(rd, &node, key, &client).await;
            let _ = tx.send(true);
        });
        Caller { gone, task }
    }

    /// Waits `wait` for the caller; true when it hung up first, and its step is then
    /// stopped.
    pub(crate) async fn hung_up_within(
        &mut self,
        wait: Duration,
        key: StepKey,
        client: &Client,
    ) -> bool {
        tokio::select! {
            // The guard it gives is not held across the cancel below.
            _ = async { self.gone.wait_for(|g| *g).await.is_ok() } => {
                let _ = client.post::<_, StepRecord>("/v1/agent/steps/cancel", &key).await;
                true
            }
            () = tokio::time::sleep(wait) => false,
        }
    }
}

/// Reads the caller's input lines and pushes each to the controller; returns when the
/// caller hung up (or sent what no caller sends).
async fn forward(mut rd: BufReader<OwnedReadHalf>, node: &str, key: StepKey, client: &Client) {
    let mut line = Vec::new();
    let mut outbox = Outbox::default();
    loop {
        line.clear();
        match (&mut rd)
            .take(MAX_INPUT_LINE + 1)
            .read_until(b'\n', &mut line)
            .await
        {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        let Some(input) = line
            .ends_with(b"\n")
            .then(|| serde_json::from_slice::<InputLine>(&line).ok())
            .flatten()
            .filter(|i| i.end().is_some())
        else {
            tracing::warn!(
                job = key.job,
                step = key.step,
                "a step's caller sent a bad input line; taken as gone"
            );
            return;
        };
        outbox.add(input);
        if !push(node, key, client, &mut outbox, &rd).await {
            // Hung up while its tasks did not read (the controller's buffer full).
            return;
        }
        if outbox.eof {
            // Nothing comes after the end: until every task has it (a restarted controller
            // may ask for it again), the caller's connection is watched for its hang-up.
            tokio::select! {
                () = deliver(node, key, client, &mut outbox) => {}
                _ = rd.read_u8() => return,
            }
            // Then only the hang-up (or anything else) ends it.
            let _ = rd.read_u8().await;
            return;
        }
    }
}

/// One push of what `outbox` gives next; whether the controller moved anything on (a
/// refusal for good drops the input held, as taken).
async fn push_once(node: &str, key: StepKey, client: &Client, outbox: &mut Outbox) -> bool {
    let Some((input, retained_from)) = outbox.next() else {
        return false;
    };
    let sent = InputPush {
        node: node.to_string(),
        key,
        input,
        retained_from: Some(retained_from),
    };
    match client
        .post::<_, InputAck>("/v1/agent/steps/input", &sent)
        .await
    {
        Ok(ack) => outbox.acked(&sent.input, ack),
        Err(e) if e.agent_retries() => false,
        Err(e) => {
            tracing::debug!(job = key.job, step = key.step, error = %e, "step input refused; dropped");
            outbox.drop_all();
            true
        }
    }
}

/// Pushes what `outbox` holds until the controller has taken all of it; a full buffer (its
/// tasks have not read) or a controller away is tried again every INPUT_RETRY, the caller's
/// next line waiting meanwhile. False when the caller (`rd`) hung up meanwhile: a task that
/// never reads would otherwise keep its caller's agent pushing, and the step running, after
/// the caller is gone.
async fn push(
    node: &str,
    key: StepKey,
    client: &Client,
    outbox: &mut Outbox,
    rd: &BufReader<OwnedReadHalf>,
) -> bool {
    while !outbox.taken() {
        if !push_once(node, key, client, outbox).await {
            tokio::time::sleep(INPUT_RETRY).await;
            if hung_up(rd).await {
                return false;
            }
        }
    }
    true
}

/// Whether the caller closed its side of the connection, seen without reading (its next
/// line may be waiting there, which is left for later).
async fn hung_up(rd: &BufReader<OwnedReadHalf>) -> bool {
    let now = rd.get_ref().ready(tokio::io::Interest::READABLE);
    matches!(
        tokio::time::timeout(Duration::ZERO, now).await,
        Ok(Ok(r)) if r.is_read_closed()
    )
}

/// After the input's end: asks, less often the longer nothing moves (up to DELIVER_WAIT_MAX),
/// until every task has it all, pushing again what a restarted controller asks for.
async fn deliver(node: &str, key: StepKey, client: &Client, outbox: &mut Outbox) {
    let mut idle = 0u32;
    while !outbox.done() {
        if push_once(node, key, client, outbox).await {
            idle = 0;
            continue;
        }
        let wait = INPUT_RETRY.saturating_mul(1 << idle.min(8));
        tokio::time::sleep(wait.min(DELIVER_WAIT_MAX)).await;
        idle = idle.saturating_add(1);
    }
}

/// The longest the caller's agent waits between asks whether every task has the input's end.
const DELIVER_WAIT_MAX: Duration = Duration::from_secs(5);

/// Bytes of input one push carries at most (a caller's line holds up to 64 KiB).
const PUSH_BYTES: usize = 64 << 10;

/// What a caller's agent holds of its caller's input: everything from where the controller
/// last said every task has it (`from`) to what the caller sent last, so that a controller
/// that restarted, and lost what its buffer held, gets it again. Bounded by what the
/// controller holds for the step (it takes no more while its tasks do not read, and the
/// caller's next line waits) and one line.
#[derive(Debug, Default)]
struct Outbox {
    /// The offset of `data`'s first byte.
    from: u64,
    data: std::collections::VecDeque<u8>,
    /// The controller wants the bytes from here next.
    want: u64,
    /// The input ends after `data`.
    eof: bool,
    /// The controller took the end of the input.
    eof_taken: bool,
    /// Every task has the end of the input (or takes no more).
    delivered: bool,
}

impl Outbox {
    fn end(&self) -> u64 {
        self.from + self.data.len() as u64
    }

    /// The caller's next line, which follows the last one.
    fn add(&mut self, line: InputLine) {
        if self.data.is_empty() && line.offset != self.end() {
            // The first line, or one after a gap (the line before it was not all taken).
            self.from = line.offset;
            self.want = self.want.max(line.offset);
        }
        let skip = self.end().saturating_sub(line.offset) as usize;
        self.data.extend(line.data.get(skip..).unwrap_or_default());
        self.eof |= line.eof;
    }

    /// The controller has taken everything the caller sent (its end too, once sent).
    fn taken(&self) -> bool {
        self.want >= self.end() && (!self.eof || self.eof_taken)
    }

    /// The controller has taken everything and, after the input's end, every task has it
    /// all: nothing is left to push.
    fn done(&self) -> bool {
        self.taken() && (!self.eof || self.delivered)
    }

    /// The next push, with the offset this agent holds the input from; `None` once
    /// [`Outbox::done`].
    fn next(&self) -> Option<(InputLine, u64)> {
        if self.done() {
            return None;
        }
        // After the end was taken, an empty push at the end asks whether every task has it
        // (a restarted controller asks for what is held here instead).
        let end = self.end();
        let at = self.want.clamp(self.from, end);
        let skip = (at - self.from) as usize;
        let data: Vec<u8> = self.data.range(skip..).take(PUSH_BYTES).copied().collect();
        let eof = self.eof && at + data.len() as u64 == end;
        let line = InputLine {
            offset: at,
            data,
            eof,
        };
        Some((line, self.from))
    }

    /// What the controller answered `sent`; true when it moved anything on.
    fn acked(&mut self, sent: &InputLine, ack: InputAck) -> bool {
        let end = self.end();
        let before = (self.want, self.from, self.eof_taken, self.delivered);
        // What it asks for next: a controller that lost its buffer may go back, never
        // before what is held here (it then starts from there).
        self.want = ack.next.max(self.from);
        self.eof_taken = ack.next >= end && (sent.eof || self.eof_taken);
        // What may be forgotten: what every task has (one past the end: the end too), or,
        // from a controller that does not say, what it took (and the end, once taken).
        let held = match ack.held_from {
            Some(held) => held,
            None if self.eof_taken => end.saturating_add(1),
            None => ack.next,
        };
        self.delivered = self.eof_taken && held > end;
        let forget = held.clamp(self.from, end);
        self.data.drain(..(forget - self.from) as usize);
        self.from = forget;
        (self.want, self.from, self.eof_taken, self.delivered) != before
    }

    /// Forgets everything: the controller refused it for good.
    fn drop_all(&mut self) {
        self.from = self.end();
        self.data.clear();
        self.want = self.from;
        self.eof_taken = self.eof;
        self.delivered = self.eof;
    }
}

/// Where one task's input pipe stands.
#[derive(Debug)]
enum Pipe {
    /// The shim has not made or opened it yet; or, with `resume`, an agent before this one
    /// had it open and wrote that many bytes into it.
    Opening { resume: Option<u64> },
    /// Held open: bytes before `offset` are written into it (and counted in `written`),
    /// `pending` follows them; the input ends after `pending` when `eof`.
    Open {
        pipe: std::fs::File,
        written: std::fs::File,
        offset: u64,
        pending: Vec<u8>,
        eof: bool,
    },
    /// Closed (its end written, the task gone, or an agent before this one held it);
    /// `told`: the controller knows.
    Closed { offset: u64, told: bool },
}

#[derive(Debug)]
struct Task {
    dir: JobDir,
    key: StepKey,
    local: u32,
    pipe: Pipe,
}

/// Runs the pump for as long as the agent runs.
pub fn spawn(cfg: &AgentConfig, client: Client, launcher: Arc<dyn Backend>) {
    let jobs = cfg.state_dir.join("jobs");
    let node = cfg.node_name.clone();
    tokio::spawn(async move {
        // Every step task seen; `None` for those that take no input.
        let mut tasks: BTreeMap<PathBuf, Option<Task>> = BTreeMap::new();
        // Rounds in a row in which no input came: the pump waits longer after each (up to
        // PUMP_IDLE_MAX), so a step whose caller types nothing costs its controller little.
        let mut idle = 0u32;
        loop {
            let known = tasks.len();
            find_tasks(&jobs, &mut tasks);
            let mut live: Vec<&mut Task> = tasks.values_mut().flatten().collect();
            // Whether each task has ended, read once a round (a task that ends meanwhile is
            // seen at the next).
            let ended: Vec<bool> = live
                .iter()
                .map(|t| has_ended(t, launcher.as_ref()))
                .collect();
            for (t, &ended) in live.iter_mut().zip(&ended) {
                step(t, ended, launcher.as_ref());
            }
            let flowed = pull(&node, &client, &mut live).await;
            for (t, &ended) in live.iter_mut().zip(&ended) {
                step(t, ended, launcher.as_ref());
            }
            // A task waiting for its pipe to be opened holds its start back, and one whose
            // pipe is full has input to go on with: no backing off for either.
            let busy = live.iter().any(|t| match &t.pipe {
                Pipe::Opening { .. } => true,
                Pipe::Open { pending, .. } => !pending.is_empty(),
                Pipe::Closed { .. } => false,
            });
            if flowed || busy || tasks.len() != known {
                idle = 0;
            } else {
                idle = idle.saturating_add(1);
            }
            if !flowed {
                let wait = PUMP_EVERY.saturating_mul(1 << idle.min(3));
                tokio::time::sleep(wait.min(PUMP_IDLE_MAX)).await;
            }
        }
    });
}

/// Adds this node's step tasks not seen yet and forgets those whose directory went.
fn find_tasks(jobs: &std::path::Path, tasks: &mut BTreeMap<PathBuf, Option<Task>>) {
    for f in crate::step::new_tasks(jobs, tasks) {
        let task = f.spec.capture_stdin.then(|| {
            let dir = &f.dir;
            // Opened by an agent before this one: on from what it wrote, unless it had
            // written the end or the task took no more.
            let told = dir.stdin_closed().exists();
            let held = dir.stdin_held().exists();
            if !held && !told && dir.stdin_ready().exists() {
                // A shim from before holds no writer: its task read its end as the agent
                // went. A shim of now may still be taking one (it writes `held` after
                // `ready`, and the agent went between): told the end, it lets go at its first
                // look, rather than hold the pipe open with nobody to end it.
                let _ = JobDir::write_private(&dir.stdin_end(), b"");
            }
            let pipe = if !dir.stdin_ready().exists() {
                Pipe::Opening { resume: None }
            } else if told || !held || dir.stdin_end().exists() {
                Pipe::Closed {
                    offset: written_before(dir),
                    told,
                }
            } else {
                Pipe::Opening {
                    resume: Some(written_before(dir)),
                }
            };
            Task {
                dir: f.dir,
                key: f.key,
                local: f.local,
                pipe,
            }
        });
        tasks.insert(f.path, task);
    }
}

/// How many bytes of task `dir`'s input an agent before this one wrote into its pipe (0 when
/// it counted none).
fn written_before(dir: &JobDir) -> u64 {
    std::fs::read_to_string(dir.stdin_written())
        .ok()
        .and_then(|t| t.trim().parse().ok())
        .unwrap_or(0)
}

/// Whether task `t` has ended (a closed pipe needs no look at its task).
fn has_ended(t: &Task, launcher: &dyn Backend) -> bool {
    !matches!(t.pipe, Pipe::Closed { .. })
        && matches!(launcher.status(&t.dir), JobStatus::Exited(_))
}

/// Moves task `t`'s pipe on as far as it goes without waiting: opened once the shim's
/// reader is there, pending bytes written as the pipe takes them, closed at the end (the
/// shim told through `launcher`) or once the task is gone (`ended`).
fn step(t: &mut Task, ended: bool, launcher: &dyn Backend) {
    if matches!(t.pipe, Pipe::Closed { .. }) {
        return;
    }
    let close = |offset| Pipe::Closed {
        offset,
        told: false,
    };
    match &mut t.pipe {
        Pipe::Opening { resume } if ended => t.pipe = close(resume.unwrap_or(0)),
        Pipe::Opening { resume } => {
            let resume = *resume;
            match open_pipe(&t.dir, resume.is_none()) {
                Ok(Some((pipe, written))) => {
                    t.pipe = Pipe::Open {
                        pipe,
                        written,
                        offset: resume.unwrap_or(0),
                        pending: vec![],
                        eof: false,
                    }
                }
                // Reopened: nobody reads it any more (the task closed its input) or it is
                // gone.
                Ok(None) if resume.is_some() => t.pipe = close(resume.unwrap_or(0)),
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!(dir = %t.dir.path().display(), error = %e, "cannot open a step task's input");
                    // The task reads its end rather than waiting for what cannot come.
                    if let Err(e) = end_input(&t.dir, launcher) {
                        tracing::warn!(dir = %t.dir.path().display(), error = %e, "cannot end a step task's input");
                    }
                    t.pipe = close(resume.unwrap_or(0));
                }
            }
        }
        Pipe::Open { offset, .. } if ended => t.pipe = close(*offset),
        Pipe::Open {
            pipe,
            written,
            offset,
            pending,
            eof,
        } => {
            while !pending.is_empty() {
                match pipe.write(pending) {
                    Ok(n) => {
                        pending.drain(..n);
                        *offset += n as u64;
                        // Counted at once: an agent that restarts goes on from here.
                        if let Err(e) =
                            written.write_all_at(format!("{:020}", *offset).as_bytes(), 0)
                        {
                            tracing::warn!(dir = %t.dir.path().display(), error = %e, "cannot count a step task's input");
                        }
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    // EPIPE: the task closed its input (`head -1`) or is gone.
                    Err(_) => {
                        t.pipe = close(*offset);
                        return;
                    }
                }
            }
            if *eof {
                // The shim lets go of its writer once told; with ours dropped, the task reads
                // the end of its input. Until the shim can be told, ours stays (tried again
                // next round).
                if let Err(e) = end_input(&t.dir, launcher) {
                    tracing::warn!(dir = %t.dir.path().display(), error = %e, "cannot end a step task's input");
                    return;
                }
                t.pipe = close(*offset);
            }
        }
        Pipe::Closed { .. } => {}
    }
}

/// Tells task `dir`'s shim that its input has ended: it closes its own writer, and the task
/// reads its end once the agent's writer is closed too.
fn end_input(dir: &JobDir, launcher: &dyn Backend) -> std::io::Result<()> {
    JobDir::write_private(&dir.stdin_end(), b"")?;
    launcher.input_ended(dir);
    Ok(())
}

/// Opens task `dir`'s input pipe for writing, with the count of what is written into it, and
/// (`first`) tells the shim: `None` while the shim has not made it or nobody reads it.
fn open_pipe(dir: &JobDir, first: bool) -> std::io::Result<Option<(std::fs::File, std::fs::File)>> {
    let opened = std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(dir.stdin_pipe());
    let pipe = match opened {
        Ok(p) => p,
        // Not made yet, or its reader not there yet.
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT | libc::ENXIO)) => return Ok(None),
        Err(e) => return Err(e),
    };
    if !pipe.metadata()?.file_type().is_fifo() {
        return Err(std::io::Error::other("not a FIFO"));
    }
    // A pipe as large as the kernel allows a user (1 MiB by default): fewer wake-ups.
    // SAFETY: a plain system call on a descriptor we hold.
    unsafe { libc::fcntl(pipe.as_raw_fd(), libc::F_SETPIPE_SZ, 1 << 20) };
    // Not emptied on opening: an agent that restarts before its first write reads the count
    // an earlier one left. Root's directory, so no one else's link.
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(dir.stdin_written())?;
    if first {
        // This agent writes `end` at the input's end: the shim may hold a writer.
        JobDir::write_private(&dir.stdin_hold(), b"")?;
        JobDir::write_private(&dir.stdin_ready(), b"")?;
    }
    Ok(Some((pipe, written)))
}

/// One pull per step for its tasks here that have written all they had (or closed since
/// the last). Returns whether input came.
async fn pull(node: &str, client: &Client, tasks: &mut [&mut Task]) -> bool {
    let mut by_step: BTreeMap<StepKey, Vec<TaskInput>> = BTreeMap::new();
    for t in tasks.iter() {
        let asked = match &t.pipe {
            Pipe::Open {
                offset,
                pending,
                eof: false,
                ..
            } if pending.is_empty() => Some((*offset, false)),
            Pipe::Closed {
                offset,
                told: false,
            } => Some((*offset, true)),
            _ => None,
        };
        if let Some((offset, closed)) = asked {
            by_step.entry(t.key).or_default().push(TaskInput {
                task: t.local,
                offset,
                closed,
            });
        }
    }
    let mut flowed = false;
    for (key, asked) in by_step {
        let req = InputPull {
            node: node.to_string(),
            key,
            tasks: asked,
        };
        let batch = match client
            .post::<_, InputBatch>("/v1/agent/steps/input/pull", &req)
            .await
        {
            Ok(b) => b,
            Err(e) if e.agent_retries() => continue,
            Err(e) => {
                // The step is not known, or not this node's: its input is over.
                tracing::debug!(job = key.job, step = key.step, error = %e, "no input for a step");
                InputBatch {
                    chunks: req
                        .tasks
                        .iter()
                        .map(|t| wharf_api::step_input::TaskChunk {
                            task: t.task,
                            offset: t.offset,
                            data: vec![],
                            eof: true,
                        })
                        .collect(),
                }
            }
        };
        for t in tasks.iter_mut().filter(|t| t.key == key) {
            if let Pipe::Closed { told, .. } = &mut t.pipe {
                if !*told && req.tasks.iter().any(|a| a.task == t.local && a.closed) {
                    *told = true;
                    // Said at every poll from now on (see `step::report`).
                    if let Err(e) = JobDir::write_private(&t.dir.stdin_closed(), b"") {
                        tracing::warn!(error = %e, job = key.job, step = key.step, "cannot mark a task's input closed");
                    }
                }
                continue;
            }
            let Pipe::Open {
                offset,
                pending,
                eof,
                ..
            } = &mut t.pipe
            else {
                continue;
            };
            let Some(c) = batch.chunks.iter().find(|c| c.task == t.local) else {
                continue;
            };
            // Past our offset: bytes were lost on the way (a restart); on from there.
            *offset = (*offset).max(c.offset);
            let skip = (*offset - c.offset) as usize;
            pending.extend_from_slice(c.data.get(skip..).unwrap_or_default());
            *eof = c.eof;
            flowed |= !c.data.is_empty();
        }
    }
    flowed
}

#[cfg(test)]
mod tests;
