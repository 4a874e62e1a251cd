//! Passing steps' output on: this node's step tasks whose caller takes their output write it
//! to files in their own directories (the shim makes them, as root); this pump reads what is
//! new there and pushes it to the controller, which holds it for the caller's agent (see
//! [`wharf_api::step_output`]), which passes it on to the caller ([`pass_on_to_caller`]).
//!
//! ```text
//!   every PUMP_EVERY (at once again while there is more): each captured stream read from
//!     where the controller last said to go on, PUSH_BYTES at most per push
//!   task ended and every stream read out and passed on to the caller (the controller's
//!     `read`) ─▶ `drained` written: only now does the step's report here carry its end
//!     ([`is_held_back`]), so the caller never sees the end before the output, and until
//!     then the file still holds what the controller's buffer holds (a controller that
//!     restarts loses nothing)
//!   the controller says discard (the step's caller went away, the step is over) ─▶ drained
//!   the controller says rewind (it restarted and lost its buffer) ─▶ again from the first
//!     byte not punched out
//!   the controller refuses a push as too large (413) ─▶ pushes half as large from then on;
//!     at MIN_PUSH_BYTES still refused ─▶ the step's tasks here stopped, with the reason
//! ```
//!
//! Memory holds one push at a time; what the controller has no room for waits in the file,
//! and what the caller was passed is punched out of the file. A stream whose unread part
//! grows past [`BACKLOG_BYTES`] (a task writing faster than its caller reads, a caller that
//! stopped reading) stops its task, and so does a discard while the task runs: the files are
//! root's, on the node's state disk, and one task must not fill it. A restarted agent, or a
//! restarted controller, goes on from the first byte not punched out: the controller skips
//! what it already has, the caller what it already wrote (by offset).

use std::collections::BTreeMap;
use std::io::{Read, Seek, SeekFrom};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use tokio::sync::Notify;
use wharf_api::step::StepKey;
use wharf_api::step::StepReply;
use wharf_api::step_output::{OutputAck, OutputBatch, OutputPush, OutputRead, PushChunk, Stream};
use wharf_client::{Client, ClientError};
use wharf_runtime::{Backend, JobDir, JobStatus};

use crate::AgentConfig;

/// How often the captured files are looked at when nothing was waiting.
const PUMP_EVERY: Duration = Duration::from_millis(100);
/// Bytes one push carries at most (well under the controller's agent request limit once
/// base64 has grown them by a third).
pub const PUSH_BYTES: usize = 512 << 10;
/// Bytes of output a push carries at the least: a controller that refuses even this much
/// (its `[limits] max_agent_request_size` is smaller) cannot be passed the output at all.
pub const MIN_PUSH_BYTES: usize = 4 << 10;

/// The push size to try after the controller refused one of `bytes` as too large (413), or
/// None when `bytes` was already the least ([`MIN_PUSH_BYTES`]). One stream gives one push
/// at most the whole push size (tasks take turns going first, so one busy task does not
/// starve the rest).
fn smaller_push(bytes: usize) -> Option<usize> {
    (bytes > MIN_PUSH_BYTES).then(|| (bytes / 2).max(MIN_PUSH_BYTES))
}

/// Why a step task is stopped when the controller refuses even the smallest push.
fn too_large_words(node: &str, refusal: &ClientError) -> String {
    format!(
        "the controller refuses its output from node {node} even {MIN_PUSH_BYTES} bytes at a \
         time ({refusal})"
    )
}

/// Why a step task is stopped when nobody will read its output.
const DISCARDED_WORDS: &str =
    "its caller stopped taking its output (gone, or not reading for minutes)";

/// Bytes of one captured stream not yet passed to the caller (the file's size past what was
/// punched out) beyond which the task is stopped. The files are root's, on the agent's state
/// disk: a task writing faster than its caller reads, a caller that stopped reading, or a
/// task that writes far ahead of its end (`pwrite`) must not fill that disk for every job of
/// the node.
pub const BACKLOG_BYTES: u64 = 256 << 20;

/// Why a step task is stopped when its captured output grew past [`BACKLOG_BYTES`] unread.
fn backlog_words(node: &str) -> String {
    format!(
        "its output on node {node} grew more than {} MiB past what its caller read; \
         write large output to a file (wharf step -o) instead",
        BACKLOG_BYTES >> 20
    )
}

/// Disk a captured stream may hold past its unread bytes before its task is stopped: above
/// what a filesystem allocates ahead by itself (XFS's speculative preallocation grows to a
/// few GiB), far below what a task could take with `fallocate`.
pub const EXCESS_BLOCKS: u64 = 16 << 30;

/// Whether a captured stream, punched out up to `punched`, holds more than [`BACKLOG_BYTES`]
/// unread bytes by its length, or disk blocks more than `excess`
/// ([`EXCESS_BLOCKS`]) past those. The task holds the file as its own stdout or stderr, so
/// it may allocate blocks that its length does not show (`fallocate` with
/// `FALLOC_FL_KEEP_SIZE`); those are root's, past every user quota. (Where holes cannot be
/// punched, the punched offset stays 0 and the length counts all of it.)
fn over_backlog(meta: &std::fs::Metadata, punched: u64, excess: u64) -> bool {
    use std::os::unix::fs::MetadataExt;
    let unread = meta.len().saturating_sub(punched);
    let allocated = meta.blocks().saturating_mul(512);
    unread > BACKLOG_BYTES || allocated > unread.saturating_add(excess)
}

/// Stops step task `t` with `reason`, unless it has ended or is being stopped.
fn stop_task(launcher: &dyn Backend, t: &Task, reason: &str) {
    if crate::step::stop_task(launcher, &t.dir, reason) {
        tracing::warn!(job = t.key.job, step = t.key.step, task = t.local, %reason, "stopped a step task");
    }
}

/// Told whenever a task's output is all passed on: its step's end may now be reported.
pub static DRAINED: LazyLock<Notify> = LazyLock::new(Notify::new);

/// The mark of a step task whose output is all passed on (or that nobody will read).
fn drained(dir: &JobDir) -> PathBuf {
    dir.path().join("drained")
}

/// Whether a step task's end must not be reported yet: its captured output is still on
/// its way to the controller.
pub fn is_held_back(dir: &JobDir) -> bool {
    (dir.captured(false).exists() || dir.captured(true).exists()) && !drained(dir).exists()
}

#[derive(Debug)]
struct Task {
    dir: JobDir,
    key: StepKey,
    local: u32,
    /// Captured streams: the offset each goes on from, and the one before which it was
    /// punched out (its caller has it).
    streams: Vec<(Stream, u64, u64)>,
    done: bool,
}

/// Runs the pump for as long as the agent runs.
pub fn spawn(cfg: &AgentConfig, client: Client, launcher: Arc<dyn Backend>) {
    let jobs = cfg.state_dir.join("jobs");
    let node = cfg.node_name.clone();
    tokio::spawn(async move {
        let mut tasks: BTreeMap<PathBuf, Task> = BTreeMap::new();
        // Per step: the controller's buffer last pushed to.
        let mut buffers: BTreeMap<StepKey, u64> = BTreeMap::new();
        let mut turn = 0usize;
        // The most output one push carries: smaller once the controller refused a push as
        // too large (its request limit is the same for every step).
        let mut push_bytes = PUSH_BYTES;
        loop {
            turn = turn.wrapping_add(1);
            find_tasks(&jobs, &mut tasks);
            buffers.retain(|k, _| tasks.values().any(|t| t.key == *k));
            let pumped = pass(
                &node,
                &client,
                launcher.as_ref(),
                &mut tasks,
                &mut buffers,
                &mut push_bytes,
                turn,
            );
            let more = pumped.await;
            if !more {
                tokio::time::sleep(PUMP_EVERY).await;
            }
        }
    });
}

/// Adds this node's step tasks not seen yet (those with a captured stream, and the others
/// as done) and forgets those whose directory went.
fn find_tasks(jobs: &std::path::Path, tasks: &mut BTreeMap<PathBuf, Task>) {
    for f in crate::step::new_tasks(jobs, tasks) {
        let (dir, spec) = (f.dir, f.spec);
        // Where each stream goes on from: after what an agent before this one had passed on
        // and punched out (the controller skips the rest it has).
        let mut streams = vec![];
        for (stream, captured) in [
            (Stream::Stdout, spec.capture_stdout),
            (Stream::Stderr, spec.capture_stderr),
        ] {
            if captured {
                let at = data_start(&dir.captured(stream == Stream::Stderr));
                streams.push((stream, at, at));
            }
        }
        let done = streams.is_empty() || drained(&dir).exists();
        tasks.insert(
            f.path,
            Task {
                dir,
                key: f.key,
                local: f.local,
                streams,
                done,
            },
        );
    }
}

/// Reads up to `max` bytes of `path` from `offset` (nothing when it does not exist).
fn read_from(path: &std::path::Path, offset: u64, max: usize) -> Vec<u8> {
    let Ok(mut f) = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
    else {
        return vec![];
    };
    let mut buf = Vec::new();
    if f.seek(SeekFrom::Start(offset)).is_ok() {
        let _ = f.by_ref().take(max as u64).read_to_end(&mut buf);
    }
    buf
}

/// The first offset of `path` that is not a punched hole: everything before it was taken
/// by the controller. 0 when the file does not exist or the filesystem keeps no holes.
fn data_start(path: &std::path::Path) -> u64 {
    let Ok(f) = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
    else {
        return 0;
    };
    // SAFETY: a plain system call on a descriptor we hold.
    let at = unsafe { libc::lseek(f.as_raw_fd(), 0, libc::SEEK_DATA) };
    match u64::try_from(at) {
        Ok(at) => at,
        // No data at all: every byte was taken (or none was ever written).
        Err(_) if std::io::Error::last_os_error().raw_os_error() == Some(libc::ENXIO) => {
            f.metadata().map_or(0, |m| m.len())
        }
        Err(_) => 0,
    }
}

/// Frees the disk blocks of `path` before `offset` (taken by the controller); the file keeps
/// its size, so offsets stay as they were. Best effort: a filesystem without holes keeps them.
fn punch(path: &std::path::Path, offset: u64) {
    let block = offset & !0xfff;
    if block == 0 {
        return;
    }
    if let Ok(f) = std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
    {
        // SAFETY: a plain system call on a descriptor we hold.
        unsafe {
            libc::fallocate(
                f.as_raw_fd(),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                0,
                block as libc::off_t,
            );
        }
    }
}

/// One look at every task still passing output on: one push per step, of `push_bytes` at
/// most (halved when the controller refuses one as too large). Returns whether some stream
/// had more than one push could take, and the controller took it all.
async fn pass(
    node: &str,
    client: &Client,
    launcher: &dyn Backend,
    tasks: &mut BTreeMap<PathBuf, Task>,
    buffers: &mut BTreeMap<StepKey, u64>,
    push_bytes: &mut usize,
    turn: usize,
) -> bool {
    let mut by_step: BTreeMap<StepKey, Vec<PathBuf>> = BTreeMap::new();
    for (p, t) in tasks.iter().filter(|(_, t)| !t.done) {
        by_step.entry(t.key).or_default().push(p.clone());
    }
    let mut more = false;
    let mut full = false;
    for (key, mut paths) in by_step {
        // Who goes first turns, so one task writing on and on does not starve the others.
        let n = paths.len();
        paths.rotate_left(turn % n);
        let mut chunks = Vec::new();
        // Tasks whose end was seen before their files were read out: drained once all of it
        // was passed on to the caller.
        let mut ended = Vec::new();
        let mut budget = *push_bytes;
        for p in &paths {
            let t = &tasks[p];
            let backlog = t.streams.iter().any(|&(stream, _, punched)| {
                std::fs::symlink_metadata(t.dir.captured(stream == Stream::Stderr))
                    .is_ok_and(|m| over_backlog(&m, punched, EXCESS_BLOCKS))
            });
            if backlog {
                stop_task(launcher, t, &backlog_words(node));
            }
            let was_over = matches!(launcher.status(&t.dir), JobStatus::Exited(_));
            let mut read_out = true;
            for &(stream, offset, _) in &t.streams {
                let max = budget;
                let data = read_from(&t.dir.captured(stream == Stream::Stderr), offset, max);
                read_out &= data.len() < max;
                budget -= data.len();
                // An ended task's streams are pushed even with nothing new: the answer says
                // how far its caller was passed them, which its `drained` waits for.
                if !data.is_empty() || was_over {
                    chunks.push(PushChunk {
                        task: t.local,
                        stream,
                        offset,
                        data,
                    });
                }
            }
            more |= !read_out;
            if was_over && read_out {
                ended.push(p.clone());
            }
        }
        // Why the step's tasks here are stopped, when they are: nobody will read their output.
        let mut stop_why = None;
        let ack = if chunks.is_empty() {
            OutputAck::default()
        } else {
            let push = OutputPush {
                node: node.to_string(),
                key,
                buffer: buffers.get(&key).copied().unwrap_or(0),
                chunks: chunks.clone(),
            };
            match client
                .post::<_, OutputAck>("/v1/agent/steps/output", &push)
                .await
            {
                Ok(a) => a,
                // Over the controller's request limit: smaller pushes from now on, and this
                // one again at once; refused even at the least, the output cannot go on.
                Err(e @ ClientError::Api { status: 413, .. }) => match smaller_push(*push_bytes) {
                    Some(smaller) => {
                        tracing::warn!(job = key.job, step = key.step, error = %e, bytes = smaller, "the controller refused a push of step output as too large; pushing less");
                        *push_bytes = smaller;
                        more = true;
                        continue;
                    }
                    None => {
                        stop_why = Some(too_large_words(node, &e));
                        OutputAck {
                            discard: true,
                            ..Default::default()
                        }
                    }
                },
                Err(e) => {
                    tracing::debug!(job = key.job, step = key.step, error = %e, "cannot pass step output on; trying again");
                    continue;
                }
            }
        };
        if ack.rewind {
            // The controller lost what it held (it restarted): again from what the caller
            // has not been passed, which is still in the files.
            for p in &paths {
                let t = tasks.get_mut(p).expect("listed");
                for (stream, offset, _) in t.streams.iter_mut() {
                    *offset = data_start(&t.dir.captured(*stream == Stream::Stderr));
                }
            }
            buffers.insert(key, ack.buffer);
            // A controller that restarted may take larger pushes now (its limit raised).
            *push_bytes = PUSH_BYTES;
            more = true;
            continue;
        }
        if ack.buffer != 0 {
            buffers.insert(key, ack.buffer);
        }
        for p in &paths {
            let t = tasks.get_mut(p).expect("listed");
            for (stream, offset, punched) in t.streams.iter_mut() {
                let sent = chunks
                    .iter()
                    .find(|c| c.task == t.local && c.stream == *stream);
                let Some(a) = ack
                    .acks
                    .iter()
                    .find(|a| a.task == t.local && a.stream == *stream)
                else {
                    continue;
                };
                let end = sent.map_or(*offset, |c| c.offset + c.data.len() as u64);
                // The controller is full: wait for its reader rather than push again now.
                full |= a.next < end;
                // Only what reached the caller: the rest may be needed again.
                if a.read > *punched {
                    punch(&t.dir.captured(*stream == Stream::Stderr), a.read);
                    *punched = a.read;
                }
                *offset = a.next;
            }
        }
        if ack.discard && stop_why.is_none() {
            stop_why = Some(DISCARDED_WORDS.to_string());
        }
        let finished: Vec<&PathBuf> = if ack.discard {
            paths.iter().collect()
        } else {
            // Read out after its end was seen, and all of it passed on to the caller: not
            // merely taken, for what the controller holds is lost when it restarts.
            ended
                .iter()
                .filter(|p| {
                    let t = &tasks[*p];
                    t.streams
                        .iter()
                        .all(|(s, _, _)| passed_on(&chunks, &ack, t.local, *s))
                })
                .collect()
        };
        for p in finished {
            let t = tasks.get_mut(p).expect("listed");
            if let Some(why) = &stop_why {
                // Nobody will read what it writes from here: it is stopped rather than left
                // writing into a file nothing empties.
                stop_task(launcher, t, why);
            }
            if let Err(e) = JobDir::write_private(&drained(&t.dir), b"") {
                tracing::warn!(dir = %p.display(), error = %e, "cannot mark a step task's output passed on");
                continue;
            }
            t.done = true;
            DRAINED.notify_one();
        }
    }
    more && !full
}

/// Whether stream `stream` of task `task`, pushed as `chunks` (an ended task's streams all
/// are, read to their end), was passed on to the caller up to its end, as `ack` says.
fn passed_on(chunks: &[PushChunk], ack: &OutputAck, task: u32, stream: Stream) -> bool {
    let Some(c) = chunks.iter().find(|c| c.task == task && c.stream == stream) else {
        return false;
    };
    ack.acks
        .iter()
        .find(|a| a.task == task && a.stream == stream)
        .is_some_and(|a| a.read >= c.offset + c.data.len() as u64)
}

/// Serves a caller that takes its step's output: passes it on as the controller has it,
/// then the step's end once all of it was read. Writing to a caller that reads slowly
/// waits, and so does the controller's buffer behind it (bounded), and the tasks' files
/// behind that. The caller hanging up stops the step.
pub(crate) async fn pass_on_to_caller(
    mut stream: tokio::net::unix::OwnedWriteHalf,
    caller: &mut crate::step_input::Caller,
    node: &str,
    key: StepKey,
    client: &Client,
) {
    let mut read = OutputRead {
        node: node.to_string(),
        key,
        buffer: 0,
        after: 0,
    };
    let mut wait = Duration::ZERO;
    loop {
        if caller.hung_up_within(wait, key, client).await {
            return;
        }
        let batch = match client
            .post::<_, OutputBatch>("/v1/agent/steps/output/read", &read)
            .await
        {
            Ok(b) => b,
            Err(e) if e.agent_retries() => {
                wait = crate::step::STATUS_EVERY;
                continue;
            }
            Err(e) => {
                return crate::step::reply(
                    &mut stream,
                    &StepReply::Error(crate::step::api_words(&e)),
                )
                .await
            }
        };
        if batch.dropped > 0 {
            let why = format!(
                "{} bytes of the step's output were dropped: nobody read them for too long",
                batch.dropped
            );
            crate::step::reply(&mut stream, &StepReply::Notice(why)).await;
        }
        if batch.buffer != read.buffer {
            read.after = 0;
        }
        read.buffer = batch.buffer;
        // While output flows, the next read goes at once; the wait is for a quiet step.
        let flowing = !batch.chunks.is_empty();
        for c in batch.chunks {
            read.after = c.seq;
            crate::step::reply(&mut stream, &StepReply::Output(c)).await;
        }
        if let Some(step) = batch.step {
            return crate::step::reply(&mut stream, &StepReply::Ended(step)).await;
        }
        wait = if flowing {
            Duration::ZERO
        } else {
            crate::step::STATUS_EVERY
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn a_stream_far_past_what_its_caller_read_is_over_the_backlog() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("stdout");
        let f = std::fs::File::create(&path).unwrap();
        let meta = || std::fs::symlink_metadata(&path).unwrap();
        assert!(!over_backlog(&meta(), 0, EXCESS_BLOCKS));
        // A task that wrote (or seeked) past the backlog with nothing read yet.
        f.set_len(BACKLOG_BYTES + 1).unwrap();
        let len = meta().len();
        assert!(over_backlog(&meta(), 0, EXCESS_BLOCKS));
        // The same once its caller read all but the backlog.
        assert!(!over_backlog(&meta(), 1, EXCESS_BLOCKS));
        assert!(!over_backlog(&meta(), len, EXCESS_BLOCKS));
        // Blocks allocated past its length count too (here 2 MiB against 1 MiB allowed
        // over what is unread): its length alone says nothing is held.
        let kept = dir.path().join("stderr");
        let g = std::fs::File::create(&kept).unwrap();
        let r = unsafe {
            libc::fallocate(
                std::os::fd::AsRawFd::as_raw_fd(&g),
                libc::FALLOC_FL_KEEP_SIZE,
                0,
                2 << 20,
            )
        };
        assert_eq!(r, 0, "{}", std::io::Error::last_os_error());
        let m = std::fs::symlink_metadata(&kept).unwrap();
        assert_eq!(m.len(), 0);
        assert!(over_backlog(&m, 0, 1 << 20));
        assert!(!over_backlog(&m, 0, 4 << 20));
        assert!(
            backlog_words("n1").contains("256 MiB"),
            "{}",
            backlog_words("n1")
        );
    }

    #[test]
    fn what_was_taken_is_punched_out_and_a_restart_goes_on_after_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("stdout");
        assert_eq!(data_start(&path), 0, "no file yet");
        let mut f = std::fs::File::create(&path).unwrap();
        f.write_all(&vec![b'a'; 3 * 4096 + 10]).unwrap();
        assert_eq!(data_start(&path), 0);
        assert_eq!(read_from(&path, 4096 * 3, 100), b"a".repeat(10));
        punch(&path, 2 * 4096 + 5);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 3 * 4096 + 10);
        // Where the filesystem keeps holes, a restart skips the blocks punched out.
        let start = data_start(&path);
        assert!(start == 0 || start == 2 * 4096, "{start}");
        assert_eq!(read_from(&path, 2 * 4096 + 5, 5), b"aaaaa");
    }

    #[test]
    fn a_push_refused_as_too_large_is_halved_down_to_the_least() {
        let mut sizes = vec![PUSH_BYTES];
        while let Some(smaller) = smaller_push(*sizes.last().unwrap()) {
            sizes.push(smaller);
        }
        assert_eq!(sizes[1], PUSH_BYTES / 2);
        assert_eq!(*sizes.last().unwrap(), MIN_PUSH_BYTES);
        assert!(sizes.windows(2).all(|w| w[1] < w[0]), "{sizes:?}");
        assert_eq!(smaller_push(MIN_PUSH_BYTES), None);
        let refusal = ClientError::Protocol("HTTP 413".into());
        let words = too_large_words("n1", &refusal);
        assert!(words.contains("n1") && words.contains("4096"), "{words}");
    }

    #[test]
    fn an_ended_tasks_stream_is_done_only_once_its_caller_was_passed_all_of_it() {
        let chunks = [PushChunk {
            task: 1,
            stream: Stream::Stdout,
            offset: 100,
            data: b"last words\n".to_vec(),
        }];
        let ack = |next, read| OutputAck {
            acks: vec![wharf_api::step_output::StreamAck {
                task: 1,
                stream: Stream::Stdout,
                next,
                read,
            }],
            ..Default::default()
        };
        // Taken by the controller but not yet read by the caller: lost if the controller
        // restarts, so the file must still be pushed.
        assert!(!passed_on(&chunks, &ack(111, 100), 1, Stream::Stdout));
        assert!(passed_on(&chunks, &ack(111, 111), 1, Stream::Stdout));
        // A stream the answer does not speak of, or one not pushed, is not done.
        assert!(!passed_on(
            &chunks,
            &OutputAck::default(),
            1,
            Stream::Stdout
        ));
        assert!(!passed_on(&chunks, &ack(111, 111), 1, Stream::Stderr));
    }

    #[test]
    fn a_task_holds_back_its_end_only_while_its_output_is_on_its_way() {
        let dir = tempfile::tempdir().unwrap();
        let task = JobDir::new(dir.path().to_path_buf());
        assert!(!is_held_back(&task), "nothing captured");
        std::fs::write(task.captured(true), b"x").unwrap();
        assert!(is_held_back(&task));
        std::fs::write(drained(&task), b"").unwrap();
        assert!(!is_held_back(&task));
    }
}
