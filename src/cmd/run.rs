//! `wharf run`: submit, wait, stream output, exit with the job's status.

use std::io::{Read, Seek, SeekFrom, Write};
use std::time::Duration;

use anyhow::{Context, Result};
use tokio::signal::unix::{signal, Signal, SignalKind};
use wharf_api::wire::ErrorKind;
use wharf_api::{JobRecord, JobRequest, JobState};
use wharf_client::{Client, ClientError, Endpoint};

use super::submit::{submit, JobFlags};

/// Arguments.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    flags: JobFlags,
    /// Do not stream output; only wait.
    #[arg(long)]
    quiet: bool,
    /// The command and its arguments.
    #[arg(last = true, required = true)]
    command: Vec<String>,
}

/// Follows a file as it grows.
struct Tail {
    path: String,
    offset: u64,
    /// What it read could not all be written on (a full disk, a closed pipe): the file is
    /// then kept.
    lost: bool,
}

impl Tail {
    fn new(path: &str) -> Tail {
        Tail {
            path: path.to_string(),
            offset: 0,
            lost: false,
        }
    }

    fn pump(&mut self, out: &mut dyn Write) {
        // Only a regular file of this user's, not through a link, is followed: a FIFO,
        // device or link another user put at the name (in a directory others may write in)
        // must neither hold this command in its open nor show it another file.
        use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
        let opened = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_NOFOLLOW)
            .open(&self.path);
        let Ok(mut f) = opened else {
            return;
        };
        let mine = |m: &std::fs::Metadata| m.is_file() && m.uid() == nix::unistd::getuid().as_raw();
        if !f.metadata().is_ok_and(|m| mine(&m)) {
            return;
        }
        if f.seek(SeekFrom::Start(self.offset)).is_err() {
            return;
        }
        let mut buf = Vec::new();
        if let Ok(n) = f.read_to_end(&mut buf) {
            self.offset += n as u64;
            if out.write_all(&buf).and_then(|_| out.flush()).is_err() {
                self.lost = true;
            }
        }
    }
}

/// The exit status `wharf run` passes on for a finished job (shell conventions).
pub fn exit_status(job: &JobRecord) -> i32 {
    let exit = job.exit.clone().unwrap_or_default();
    match job.state {
        JobState::Completed => 0,
        _ if exit.code.is_some_and(|c| c != 0) => exit.code.unwrap_or(1),
        _ if exit.signal.is_some() => 128 + exit.signal.unwrap_or(0),
        JobState::Timeout => 124,
        _ => 1,
    }
}

/// How long the controller is asked to hold each wait for the job (it caps the wait at its
/// `controller.poll_wait`); the client then asks again.
const WAIT_MS: u64 = 60_000;

/// How long the first wait for the job's start lasts: a job still pending then is said to be
/// queued, with the scheduler's reason.
const QUEUED_AFTER_MS: u64 = 1_000;

/// Job `id` once it is in none of `states` (at once if it is not now), or after `wait_ms`;
/// while the controller is unreachable (restarting), asked again every half second.
async fn wait(client: &Client, id: u64, states: &[JobState], wait_ms: u64) -> Result<JobRecord> {
    let states: Vec<&str> = states.iter().map(|s| s.as_str()).collect();
    let path = format!(
        "/v1/jobs/{id}/wait?state={}&wait_ms={wait_ms}",
        states.join(",")
    );
    loop {
        match client.get(&path).await {
            Ok(job) => return Ok(job),
            Err(e) if e.is_transient() => tokio::time::sleep(Duration::from_millis(500)).await,
            Err(e) => return Err(e.into()),
        }
    }
}

/// The exit status of `job`, ended, as [`exit_status`] gives it; what ended it goes to stderr
/// when it did not complete, the job named as users name it (an array's task `ID_TASK`).
fn ended(job: &JobRecord) -> i32 {
    if job.state != JobState::Completed {
        let why = crate::output::clean(job.reason.as_deref().unwrap_or_default()).into_owned();
        eprintln!(
            "wharf: job {} {}{}",
            job.label(),
            job.state,
            if why.is_empty() {
                String::new()
            } else {
                format!(": {why}")
            }
        );
    }
    exit_status(job)
}

/// Waits for job `id` to end (`wharf submit --wait`); its exit status as [`exit_status`]
/// gives it, and what ended it on stderr when it did not complete.
pub(crate) async fn wait_for_end(client: &Client, id: u64) -> Result<i32> {
    let live: Vec<JobState> = JobState::ALL
        .into_iter()
        .filter(|s| !s.is_terminal())
        .collect();
    let job = loop {
        let job = wait(client, id, &live, WAIT_MS).await?;
        if job.state.is_terminal() {
            break job;
        }
    };
    Ok(ended(&job))
}

/// Most ranks whose files `wharf run` follows; past them, their files are left as they are.
const MAX_FOLLOWED: u32 = 256;

/// Every rank's output files (and error files, where errors go elsewhere), in rank order.
type Files = Vec<(String, Option<String>)>;

/// The files each rank of job `id` writes (its node's index in the names: rank R runs on
/// node R / tasks per node), up to [`MAX_FOLLOWED`].
fn rank_files(job: &JobRecord, spec: &wharf_api::JobSpec) -> Files {
    let per_node = spec.tasks_per_node.max(1);
    (0..spec.tasks().min(MAX_FOLLOWED))
        .map(|rank| {
            let place = wharf_api::job::FilePlace {
                node_index: Some(rank / per_node),
                ..job.file_place()
            };
            (
                spec.rank_output_path(job.id, rank, &place),
                spec.rank_error_path(job.id, rank, &place),
            )
        })
        .collect()
}

/// The job's output files, every rank's, followed as they grow while the job runs: as srun
/// does, each task's output reaches this command's.
struct Output {
    out: Vec<Tail>,
    err: Vec<Tail>,
    /// Wakes the client when a file in the output's directories is written: the job's output
    /// appears as it is written on this machine. Where that cannot be watched (or is written
    /// by another machine, which inotify does not see), output appears at each answer of the
    /// controller: when the job changes state, and at least every `controller.poll_wait`.
    /// Only made when there is output still to follow: closing an inotify instance that
    /// watches something waits for the kernel to retire the watch (about 8 ms on the
    /// development VM), which the command would pay at its exit.
    watch: Option<wharf_agent::watch::Inotify>,
}

impl Output {
    /// The ranks' files; followed as they grow when `follow`.
    fn new(files: &Files, follow: bool) -> Output {
        use nix::sys::inotify::AddWatchFlags;
        let watch = follow
            .then(wharf_agent::watch::Inotify::new)
            .and_then(Result::ok);
        if let Some(w) = &watch {
            hold_open_in_child(std::os::fd::AsRawFd::as_raw_fd(w));
        }
        let mut dirs: Vec<&std::path::Path> = (files.iter())
            .flat_map(|(out, err)| [Some(out), err.as_ref()])
            .flatten()
            .map(|path| std::path::Path::new(path).parent().unwrap_or("/".as_ref()))
            .collect();
        dirs.sort();
        dirs.dedup();
        let watch = watch.filter(|w| {
            dirs.iter()
                .all(|d| w.add(d, AddWatchFlags::IN_MODIFY).is_ok())
        });
        let tail = |path: &String| Tail::new(path);
        Output {
            out: files.iter().map(|(out, _)| tail(out)).collect(),
            err: files
                .iter()
                .filter_map(|(_, err)| err.as_ref().map(tail))
                .collect(),
            watch,
        }
    }

    /// Copies what the files gained to stdout and stderr.
    fn pump(&mut self) {
        for t in &mut self.out {
            t.pump(&mut std::io::stdout());
        }
        for t in &mut self.err {
            t.pump(&mut std::io::stderr());
        }
    }

    /// Removes the files, all passed on: the job's output was this command's, as srun
    /// leaves none behind. A file some task never made is no error.
    fn remove(&self) {
        let lost: Vec<&str> = (self.out.iter().chain(&self.err))
            .filter(|t| t.lost)
            .map(|t| t.path.as_str())
            .collect();
        if !lost.is_empty() {
            eprintln!(
                "wharf: some of the job's output could not be written here; it is kept in {}",
                crate::output::clean(&lost.join(", "))
            );
            return;
        }
        for t in self.out.iter().chain(&self.err) {
            let _ = std::fs::remove_file(&t.path);
        }
    }

    /// Resolves when the output may have grown; never without a watch.
    async fn grown(&self) {
        match &self.watch {
            Some(w) if w.events().await.is_ok() => {}
            _ => std::future::pending().await,
        }
    }
}

/// Keeps the inotify instance `fd` open in a child process that lives until this one ends.
///
/// Closing an inotify instance that watches something waits for the kernel to retire its
/// watches (a grace period of the notification layer: 8 ms at the median on the development
/// VM, more under load), and an exiting process closes its descriptors before its parent
/// hears of the exit: `wharf run` would end that much after its job. With a second reference
/// in a child, this process's close only drops its own; the child, which waits for nothing
/// but this process's end (the write end of a pipe, which only this process holds, closes
/// with it), makes the last close, which nobody waits for. Best effort: without the child,
/// the close is paid at exit as before.
fn hold_open_in_child(fd: std::os::fd::RawFd) {
    let mut pipe = [0; 2];
    // SAFETY: pipe2 writes two descriptors into the array it is given.
    if unsafe { libc::pipe2(pipe.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return;
    }
    let parent = std::process::id() as libc::pid_t;
    // SAFETY: the child makes system calls only (no allocation, no lock), so another thread
    // of this process holding a lock at the fork cannot stop it.
    match unsafe { libc::fork() } {
        0 => {
            let mut keep = [fd, pipe[0]];
            keep.sort_unstable();
            let close_range = |from: i32, to: i32| {
                if from <= to {
                    // SAFETY: closes descriptors of this child only.
                    unsafe { libc::syscall(libc::SYS_close_range, from as u32, to as u32, 0) };
                }
            };
            // Nothing but the two: the child must not hold this process's output or its
            // connections open after it.
            close_range(0, keep[0] - 1);
            close_range(keep[0] + 1, keep[1] - 1);
            close_range(keep[1] + 1, i32::MAX);
            // SAFETY: plain system calls; `_exit` skips the parent's atexit handlers.
            unsafe {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                if libc::getppid() == parent {
                    let mut byte = 0u8;
                    while libc::read(pipe[0], (&mut byte as *mut u8).cast(), 1) < 0
                        && *libc::__errno_location() == libc::EINTR
                    {}
                }
                libc::_exit(0);
            }
        }
        -1 => {
            // SAFETY: the two descriptors pipe2 made, closed once.
            unsafe {
                libc::close(pipe[0]);
                libc::close(pipe[1]);
            }
        }
        // The write end stays open until this process ends.
        // SAFETY: the child's end, closed once here.
        _ => unsafe {
            libc::close(pipe[0]);
        },
    }
}

/// The job `wharf run` submits: interactive, so, as `srun` outside a job, it is not
/// requeued (a lost node ends it NODE_FAIL, a requeue-mode preemption PREEMPTED) unless
/// `--requeue` asks for it; batch jobs are.
fn interactive(mut job: JobRequest) -> JobRequest {
    job.requeue = Some(job.requeue.unwrap_or(false));
    job
}

/// Whether signal `number` is ignored by this process now (as its parent left it).
fn ignored(number: i32) -> bool {
    // SAFETY: reads the disposition only (a null new action changes nothing).
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        libc::sigaction(number, std::ptr::null(), &mut old) == 0
            && old.sa_sigaction == libc::SIG_IGN
    }
}

/// How long `wharf run` waits for its job to end after the first signal has asked for the
/// job's cancel, so that it can say how the job ended; a second signal ends the wait at once.
const CANCEL_WAIT: Duration = Duration::from_secs(5);

/// The signals that end `wharf run` as they end `srun`: the first cancels the job (as
/// `wharf cancel` does), so that no job runs, or starts later, with nobody attached.
struct Interrupts {
    /// Each signal taken; none for one this process was started ignoring.
    int: Option<Signal>,
    term: Option<Signal>,
    hup: Option<Signal>,
    /// The first signal taken, and when the wait for the job's end after it stops.
    first: Option<(i32, tokio::time::Instant)>,
}

impl Interrupts {
    /// Takes SIGINT, SIGTERM and SIGHUP from now on, instead of their ending the process;
    /// not one it was started ignoring (`nohup wharf run ... &` outlives its terminal, and a
    /// background job of a script is not for the terminal's Ctrl-C), as the default would.
    fn new() -> Result<Interrupts> {
        let on = |kind: SignalKind, number: i32| -> Result<Option<Signal>> {
            if ignored(number) {
                return Ok(None);
            }
            signal(kind).map(Some).context("watching for signals")
        };
        Ok(Interrupts {
            int: on(SignalKind::interrupt(), libc::SIGINT)?,
            term: on(SignalKind::terminate(), libc::SIGTERM)?,
            hup: on(SignalKind::hangup(), libc::SIGHUP)?,
            first: None,
        })
    }

    /// The number of the next signal taken.
    async fn recv(&mut self) -> i32 {
        async fn next(s: &mut Option<Signal>) -> Option<()> {
            match s {
                Some(s) => s.recv().await,
                None => std::future::pending().await,
            }
        }
        tokio::select! {
            Some(()) = next(&mut self.int) => libc::SIGINT,
            Some(()) = next(&mut self.term) => libc::SIGTERM,
            Some(()) = next(&mut self.hup) => libc::SIGHUP,
            else => std::future::pending().await,
        }
    }

    /// The exit status for the first signal taken, once one was.
    fn status(&self) -> Option<i32> {
        self.first.map(|(sig, _)| 128 + sig)
    }

    /// Resolves when the wait for the job's end after the first signal is over (`until`,
    /// as [`Interrupts::until`] gives it); never before a signal.
    async fn given_up(until: Option<tokio::time::Instant>) {
        match until {
            Some(until) => tokio::time::sleep_until(until).await,
            None => std::future::pending().await,
        }
    }

    /// When the wait for the job's end after the first signal stops; none before a signal.
    fn until(&self) -> Option<tokio::time::Instant> {
        self.first.map(|(_, until)| until)
    }

    /// Takes signal `sig`: the first asks the controller to cancel job `id` (said on stderr);
    /// a second gives the status to exit with at once.
    async fn take(&mut self, sig: i32, client: &Client, id: u64) -> Option<i32> {
        if self.first.is_some() {
            return Some(128 + sig);
        }
        self.first = Some((sig, tokio::time::Instant::now() + CANCEL_WAIT));
        eprintln!("wharf: cancelling job {id}");
        let path = format!("/v1/jobs/{id}/cancel");
        match client
            .post::<_, JobRecord>(&path, &serde_json::json!({}))
            .await
        {
            Ok(_) => {}
            // A job that has ended meanwhile is not cancelled: its end is reported as it is.
            Err(ClientError::Api { error, .. }) if error.kind == ErrorKind::Conflict => {}
            Err(e) => eprintln!(
                "wharf: cancelling job {id}: {}",
                crate::output::clean(&e.to_string())
            ),
        }
        None
    }
}

/// The output and error files of a run that names none, which it passes on and removes: the
/// tasks' standard output and error apart, as srun keeps them, in the directory it runs in,
/// or in `home` where that one may not be written to (the node writes them as the user).
fn passing_files(
    cwd: &std::path::Path,
    home: Option<&std::path::Path>,
    writable: impl Fn(&std::path::Path) -> bool,
) -> (Option<String>, Option<String>) {
    let dir = match home {
        // A `%` of the path is the path's, not a pattern's letter.
        Some(h) if !writable(cwd) && writable(h) => format!("{}/", h.display()).replace('%', "%%"),
        _ => String::new(),
    };
    (
        Some(format!("{dir}wharf-%j.out")),
        Some(format!("{dir}wharf-%j.err")),
    )
}

/// Whether this process may write in `dir`.
fn writable(dir: &std::path::Path) -> bool {
    nix::unistd::access(dir, nix::unistd::AccessFlags::W_OK).is_ok()
}

/// Runs the command.
pub async fn run(socket: &str, args: Args) -> Result<i32> {
    let flags = args.flags.to_request()?;
    let keep_files = flags.output.is_some() || flags.error.is_some();
    let mut job = interactive(
        JobRequest {
            command: Some(args.command.clone()),
            ..Default::default()
        }
        .overlay(flags),
    );
    if !keep_files {
        // The files' names are the job's working directory's: --chdir's, where it gives one.
        let cwd = std::env::current_dir().context("reading the current directory")?;
        let workdir = job.workdir.as_ref().map_or(cwd.clone(), |w| cwd.join(w));
        let home = std::env::var_os("HOME").map(std::path::PathBuf::from);
        (job.output, job.error) = passing_files(&workdir, home.as_deref(), writable);
    }
    // Taken from before the submit: a signal while it is under way cancels the job once its
    // id is known (a second one ends this command at once, submitted or not).
    let mut interrupts = Interrupts::new()?;
    let mut early = None;
    let id = {
        let mut submitting = std::pin::pin!(submit(socket, job));
        loop {
            tokio::select! {
                id = &mut submitting => break id?,
                sig = interrupts.recv() => match early {
                    Some(_) => return Ok(128 + sig),
                    None => early = Some(sig),
                },
            }
        }
    };
    let client = Client::new(Endpoint::parse(socket), None);
    if let Some(sig) = early {
        if let Some(status) = interrupts.take(sig, &client, id).await {
            return Ok(status);
        }
    }
    // Each wait is answered the moment the job leaves the states it waits out: no polling.
    // Output is followed from the start; with --quiet only the end counts.
    let before_start = [JobState::Pending, JobState::Starting];
    let mut job = wait(&client, id, &before_start, QUEUED_AFTER_MS).await?;
    let spec = job
        .spec
        .clone()
        .ok_or_else(|| anyhow::anyhow!("job {id} has no spec"))?;
    // A job that ended before the first answer (or a --quiet run) has no output to follow.
    let follow = !args.quiet && !job.state.is_terminal();
    let mut named = rank_files(&job, &spec);
    let mut output = Output::new(&named, follow);
    let mut said_pending = false;
    let mut pumped = false;
    loop {
        // A name with the job's node in it (`%N`) is known once the job has its nodes.
        if !pumped && rank_files(&job, &spec) != named {
            named = rank_files(&job, &spec);
            output = Output::new(&named, follow);
        }
        if job.state == JobState::Pending && !said_pending && interrupts.first.is_none() {
            if let Some(r) = &job.reason {
                eprintln!("wharf: job {id} queued ({})", crate::output::clean(r));
                said_pending = true;
            }
        }
        // Before the job starts its output file may hold an older run's output.
        let streaming = !args.quiet && job.start_time.is_some();
        if streaming {
            output.pump();
            pumped = true;
        }
        if job.state.is_terminal() {
            break;
        }
        let mut waiting_out = match job.state {
            JobState::Pending | JobState::Starting => before_start.to_vec(),
            state => vec![state],
        };
        if args.quiet {
            waiting_out.push(JobState::Running);
        }
        let mut next = std::pin::pin!(wait(&client, id, &waiting_out, WAIT_MS));
        job = loop {
            tokio::select! {
                answer = &mut next => break answer?,
                () = output.grown(), if streaming => output.pump(),
                // Before the signals: the deadline is read before they are borrowed.
                () = Interrupts::given_up(interrupts.until()) => {
                    eprintln!("wharf: job {id} is still stopping");
                    return Ok(interrupts.status().unwrap_or(1));
                }
                sig = interrupts.recv() => {
                    if let Some(status) = interrupts.take(sig, &client, id).await {
                        return Ok(status);
                    }
                }
            }
        };
    }
    let status = ended(&job);
    // Files it named are the user's to keep; the default ones were only the way here. (A
    // job that ran no task, or a --quiet run, printed nothing of them.)
    if !keep_files && pumped && job.start_time.is_some() {
        output.remove();
    }
    if let Some(n) = unread_input() {
        eprintln!(
            "wharf: warning: {n} bytes given on standard input were not read: a job gets no \
             standard input (inside a job, `wharf step` passes its input on); give the job \
             the data as a file"
        );
    }
    Ok(interrupts.status().unwrap_or(status))
}

/// How many bytes wait unread on this command's standard input when it is a pipe or a
/// file, which `printf 'a\n' | wharf run -- wc -l` means for the job, as it would for srun;
/// `None` for a terminal, `/dev/null`, or nothing waiting.
fn unread_input() -> Option<u64> {
    use std::os::fd::AsRawFd;
    let stdin = std::io::stdin();
    let fd = stdin.as_raw_fd();
    let stat = nix::sys::stat::fstat(fd).ok()?;
    let kind =
        nix::sys::stat::SFlag::from_bits_truncate(stat.st_mode) & nix::sys::stat::SFlag::S_IFMT;
    let waiting = if kind == nix::sys::stat::SFlag::S_IFREG {
        let at = nix::unistd::lseek(fd, 0, nix::unistd::Whence::SeekCur).ok()?;
        u64::try_from(stat.st_size - at).ok()?
    } else if kind == nix::sys::stat::SFlag::S_IFIFO || kind == nix::sys::stat::SFlag::S_IFSOCK {
        let mut n: libc::c_int = 0;
        // SAFETY: FIONREAD writes one int through the pointer given.
        if unsafe { libc::ioctl(fd, libc::FIONREAD, &mut n) } != 0 {
            return None;
        }
        u64::try_from(n).ok()?
    } else {
        return None;
    };
    (waiting > 0).then_some(waiting)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_regular_file_is_followed() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("wharf-1.out");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        // Before, opening a FIFO put at the name waited for a writer for ever.
        let (done, waited) = std::sync::mpsc::channel();
        let path = fifo.display().to_string();
        std::thread::spawn(move || {
            let mut out = Vec::new();
            super::Tail::new(&path).pump(&mut out);
            let _ = done.send(out);
        });
        let out = waited
            .recv_timeout(std::time::Duration::from_secs(5))
            .expect("a FIFO held the pump");
        assert!(out.is_empty());
        let file = dir.path().join("wharf-2.out");
        std::fs::write(&file, "hello\n").unwrap();
        let mut tail = super::Tail::new(&file.display().to_string());
        let mut out = Vec::new();
        tail.pump(&mut out);
        assert_eq!(out, b"hello\n");
        assert!(!tail.lost);
        // Not through a link: another user's link at the name shows nothing of its target.
        let link = dir.path().join("wharf-3.out");
        std::os::unix::fs::symlink(&file, &link).unwrap();
        let mut out = Vec::new();
        super::Tail::new(&link.display().to_string()).pump(&mut out);
        assert!(out.is_empty());
        // What cannot be written on is lost here: the file is kept for it.
        struct Full;
        impl std::io::Write for Full {
            fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
                Err(std::io::Error::from_raw_os_error(libc::ENOSPC))
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let mut tail = super::Tail::new(&file.display().to_string());
        tail.pump(&mut Full);
        assert!(tail.lost);
    }

    #[test]
    fn a_run_keeps_output_and_errors_apart_where_it_may_write() {
        use std::path::Path;
        let files = |cwd_ok: bool, home: Option<&str>| {
            let home = home.map(Path::new);
            super::passing_files(Path::new("/work"), home, |d| {
                d == Path::new("/work") && cwd_ok || d != Path::new("/work")
            })
        };
        let here = (Some("wharf-%j.out".into()), Some("wharf-%j.err".into()));
        assert_eq!(files(true, Some("/home/ann")), here);
        assert_eq!(
            files(false, Some("/home/a%n")),
            (
                Some("/home/a%%n/wharf-%j.out".into()),
                Some("/home/a%%n/wharf-%j.err".into())
            )
        );
        // Nowhere better: the job says why it cannot write there.
        assert_eq!(files(false, None), here);
    }

    #[test]
    fn a_run_is_not_requeued_unless_asked() {
        assert_eq!(interactive(JobRequest::default()).requeue, Some(false));
        let asked = JobRequest {
            requeue: Some(true),
            ..Default::default()
        };
        assert_eq!(interactive(asked).requeue, Some(true));
    }
}
