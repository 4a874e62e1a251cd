//! `wharf step`: runs a command on some or all of the nodes of the job it is called from,
//! within that job's allocation (Slurm's `srun` inside a job). It asks the node's agent
//! over the socket named in `WHARF_STEP_SOCKET`, which every job gets; the agent learns from
//! the kernel which job and user the caller is, never from the request. Waits for every task
//! of the step and exits with the step's status.

use std::collections::BTreeMap;
use std::io::Write;

use anyhow::{bail, Context, Result};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use wharf_api::step::{StepMemory, StepRecord, StepReply, StepRequest};
use wharf_api::step_input::{InputLine, StepInput};
use wharf_api::step_output::{OutputChunk, StepOutput, Stream};

/// Arguments.
#[derive(Debug, clap::Args)]
#[command(trailing_var_arg = true)]
pub struct Args {
    /// Run on the job's first N nodes (default: all of them).
    #[arg(short = 'N', long)]
    pub nodes: Option<u32>,
    /// The step's name, as `wharf acct --steps` shows it (default: its command's).
    #[arg(short = 'J', long)]
    pub job_name: Option<String>,
    /// The step's time limit (10, 1:30:00, 2-0, as the job's), within what is left of the
    /// job's (default: that).
    #[arg(short = 't', long, value_name = "TIME", value_parser = step_time)]
    pub time: Option<u64>,
    /// Run on these of the job's nodes (a host list, e.g. `gpu[01-02]`).
    #[arg(short = 'w', long)]
    pub nodelist: Option<String>,
    /// Tasks on each node (default: the job's tasks per node, or from --ntasks).
    #[arg(long)]
    pub ntasks_per_node: Option<u32>,
    /// Tasks in all, spread evenly over the step's nodes.
    #[arg(short = 'n', long)]
    pub ntasks: Option<u32>,
    /// GPUs each task has to itself, held by the step (default: every task sees all the
    /// job's GPUs on its node).
    #[arg(long)]
    pub gpus_per_task: Option<u32>,
    /// GPUs of the job's the step holds on each of its nodes, [TYPE:]COUNT: no other step
    /// is given them while it runs; it waits while too few are free.
    #[arg(long, value_name = "[TYPE:]COUNT", conflicts_with = "gres")]
    pub gpus_per_node: Option<String>,
    /// GPUs the step holds in all, [TYPE:]COUNT, the same number on each of its nodes.
    #[arg(
        short = 'G',
        long,
        value_name = "[TYPE:]COUNT",
        conflicts_with = "gres"
    )]
    pub gpus: Option<String>,
    /// GPUs the step holds on each node, as Slurm writes them: gpu:COUNT or gpu:TYPE:COUNT.
    #[arg(long, value_name = "gpu[:TYPE][:COUNT]")]
    pub gres: Option<String>,
    /// Share the job's GPUs with its other steps: hold none, wait for none, see all.
    #[arg(long)]
    pub overlap: bool,
    /// CPUs each task has to itself (default: the job's CPUs on a node shared evenly among
    /// the step's tasks there).
    #[arg(short = 'c', long)]
    pub cpus_per_task: Option<u32>,
    /// The most memory the step's tasks on a node may use together (4G, 512M; 0: all the
    /// job's there), within the job's memory there, split evenly among them. A ceiling, not
    /// a reservation: the job's other steps share the job's memory as before.
    #[arg(long, value_name = "SIZE", value_parser = wharf_api::resources::parse_memory_or_whole)]
    pub mem: Option<u64>,
    /// The step's memory on a node as so much per CPU it has there (its tasks' -c CPUs, else
    /// the job's CPUs there).
    #[arg(long, value_name = "SIZE", value_parser = wharf_api::resources::parse_memory, conflicts_with_all = ["mem", "mem_per_gpu"])]
    pub mem_per_cpu: Option<u64>,
    /// The step's memory on a node as so much per GPU its tasks see there (its own, else the
    /// job's there).
    #[arg(long, value_name = "SIZE", value_parser = wharf_api::resources::parse_memory, conflicts_with = "mem")]
    pub mem_per_gpu: Option<u64>,
    /// The job to run in: refused unless it is the job this command runs inside.
    #[arg(long)]
    pub jobid: Option<u64>,
    /// Which tasks read this command's standard input: a task's rank, `all` or `none` (the
    /// others read /dev/null).
    #[arg(short = 'i', long, default_value = "0", value_parser = StepInput::parse)]
    pub input: StepInput,
    /// Begin each line of the tasks' output with the task's rank (`3: `).
    #[arg(short = 'l', long)]
    pub label: bool,
    /// The tasks' standard output (and error, unless --error) goes to this file instead of
    /// here: %t the rank (else ranks past 0 add `.rankR`), %s the step, %j the job, %N the
    /// node; relative to this directory.
    #[arg(short = 'o', long)]
    pub output: Option<String>,
    /// The tasks' standard error goes to this file (the same patterns).
    #[arg(short = 'e', long)]
    pub error: Option<String>,
    /// Print nothing of the step's start and end on standard error (why one failed still is).
    #[arg(short, long)]
    pub quiet: bool,
    /// Write the tasks' output as it comes, a part of a line too (a progress bar's), rather
    /// than line by line; with --label, still whole lines.
    #[arg(short = 'u', long)]
    pub unbuffered: bool,
    /// The tasks' working directory (default: this command's); relative to this one.
    #[arg(short = 'D', long, value_name = "DIR")]
    pub chdir: Option<String>,
    /// Which of this command's environment variables the tasks get, comma-separated: ALL
    /// (the default), NONE (only the job's SLURM_* and WHARF_* ones), a NAME to pass on, a
    /// NAME=VALUE to set.
    #[arg(long, value_name = "ALL|NONE|NAME[=VALUE],...")]
    pub export: Option<String>,
    /// The command and its arguments.
    #[arg(required = true)]
    pub command: Vec<String>,
}

/// Connects to the agent's step socket named by `WHARF_STEP_SOCKET` (`@NAME` for an abstract
/// socket, else a path).
async fn connect() -> Result<tokio::net::UnixStream> {
    let Ok(name) = std::env::var("WHARF_STEP_SOCKET") else {
        bail!(
            "wharf step runs only inside a Wharf job (WHARF_STEP_SOCKET is not set); submit a \
             job with `wharf submit` and call it from the job's script"
        );
    };
    let stream = match name.strip_prefix('@') {
        Some(abstract_name) => {
            use std::os::linux::net::SocketAddrExt;
            let addr = std::os::unix::net::SocketAddr::from_abstract_name(abstract_name)?;
            std::os::unix::net::UnixStream::connect_addr(&addr)
        }
        None => std::os::unix::net::UnixStream::connect(&name),
    }
    .with_context(|| format!("cannot reach this node's Wharf agent at {name}"))?;
    stream.set_nonblocking(true)?;
    Ok(tokio::net::UnixStream::from_std(stream)?)
}

fn describe(s: &StepRecord) -> String {
    let names: Vec<&str> = s.nodes.iter().map(|n| n.node.as_str()).collect();
    format!(
        "{} task(s) on {}",
        s.ntasks(),
        wharf_api::hostlist::compress(&names)
    )
}

/// Runs the command: the step's exit status (its first failing task's).
pub async fn run(args: Args) -> Result<i32> {
    let env = exported(std::env::vars().collect(), args.export.as_deref())?;
    let job = std::env::var("WHARF_JOB_ID").unwrap_or_default();
    let workdir = match (std::env::current_dir(), &args.chdir) {
        (Ok(cwd), Some(dir)) => Some(cwd.join(dir)),
        (Err(e), Some(dir)) if !dir.starts_with('/') => {
            bail!(
                "--chdir {}: this command's directory is unknown ({e}); name it whole",
                crate::output::clean(dir)
            )
        }
        (_, Some(dir)) => Some(dir.into()),
        (cwd, None) => cwd.ok(),
    };
    // A directory named that is not there: said here, rather than the tasks starting in /.
    if let (Some(dir), Some(_)) = (&workdir, &args.chdir) {
        if !dir.is_dir() {
            bail!(
                "--chdir {}: no such directory here (the step's tasks see what this command \
                 sees, but for /tmp)",
                crate::output::clean(&dir.display().to_string())
            );
        }
    }
    // Each task of a step is a sandbox of its own, with its own /tmp: a directory under the
    // caller's is not there (the caller's /tmp is its own sandbox's).
    if let Some(w) = (workdir.as_ref()).and_then(|dir| super::submit::hidden_workdir(None, dir)) {
        eprintln!(
            "wharf: warning: the step's tasks cannot see {}: each task gets its own private {} \
             there, so they start in /; work from a shared directory, as the job's own",
            crate::output::clean(&w.display().to_string()),
            crate::output::clean(
                &w.iter()
                    .take(2)
                    .collect::<std::path::PathBuf>()
                    .display()
                    .to_string()
            ),
        );
    }
    let gpus = StepGpus::parse(&args)?;
    let request = StepRequest {
        nodes: args.nodes,
        nodelist: args.nodelist,
        ntasks_per_node: args.ntasks_per_node,
        ntasks: args.ntasks,
        gpus_per_task: args.gpus_per_task,
        gpus_per_node: gpus.per_node,
        gpus: gpus.total,
        gpu_type: gpus.kind,
        overlap: args.overlap,
        cpus_per_task: args.cpus_per_task,
        job: args.jobid,
        argv: args.command,
        name: args.job_name,
        time_limit: args
            .time
            .filter(|&t| t != wharf_api::resources::UNLIMITED_TIME),
        env,
        workdir: workdir.map(|d| d.display().to_string()),
        resume: None,
        output: StepOutput {
            stream: true,
            output: args.output,
            error: args.error,
        },
        input: args.input,
        memory: (args.mem.map(StepMemory::PerNode))
            .or(args.mem_per_cpu.map(StepMemory::PerCpu))
            .or(args.mem_per_gpu.map(StepMemory::PerGpu)),
    };
    // This command's standard input, read only when a task takes it.
    let mut input = (args.input != StepInput::None).then(read_stdin);
    // Whether the agent and controller take input: set by the step's start.
    let mut takes_input = false;
    let mut lines = Lines::new(args.label, args.unbuffered);
    let mut request = request;
    // Once started, the step is waited for again through a restart of the node's agent.
    let mut reconnect_by: Option<std::time::Instant> = None;
    loop {
        let stream = match (connect().await, reconnect_by) {
            (Ok(s), _) => s,
            (Err(_), Some(by)) if std::time::Instant::now() < by => {
                tokio::time::sleep(RECONNECT_EVERY).await;
                continue;
            }
            (Err(e), _) => return Err(e),
        };
        match exchange(
            stream,
            &request,
            &job,
            args.quiet,
            &mut lines,
            input.as_mut(),
            &mut takes_input,
        )
        .await?
        {
            Answer::Ended(status) => return Ok(status),
            Answer::Cut(Some(step)) => {
                if !args.quiet {
                    eprintln!("wharf: lost this node's agent; waiting for step {job}.{step} again");
                }
                request.resume = Some(step);
                reconnect_by = Some(std::time::Instant::now() + RECONNECT_FOR);
            }
            Answer::Cut(None) => {
                bail!("this node's Wharf agent went away before the step started")
            }
        }
    }
}

/// One entry of `--export` (srun's and `wharf step`'s).
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Export<'a> {
    /// `ALL`: every variable of the caller's.
    All,
    /// `NONE` (or `NIL`).
    None,
    /// A variable to pass on with the caller's value.
    Name(&'a str),
    /// `NAME=VALUE`.
    Set(&'a str, &'a str),
}

/// The entries of a `--export` list, or which one is not ALL, NONE, a name or NAME=VALUE.
pub(crate) fn export_entries(spec: &str) -> Result<Vec<Export<'_>>> {
    (spec.split(',').map(str::trim))
        .map(|e| {
            export_entry(e).ok_or_else(|| {
                anyhow::anyhow!(
                    "--export: {:?} is not ALL, NONE, a variable's name or NAME=VALUE",
                    crate::output::clean(e)
                )
            })
        })
        .collect()
}

fn export_entry(e: &str) -> Option<Export<'_>> {
    if e.eq_ignore_ascii_case("ALL") {
        return Some(Export::All);
    }
    if e.eq_ignore_ascii_case("NONE") || e.eq_ignore_ascii_case("NIL") {
        return Some(Export::None);
    }
    let (name, value) = e.split_once('=').map_or((e, None), |(n, v)| (n, Some(v)));
    let known = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    if name.is_empty() || !name.bytes().all(known) {
        return None;
    }
    Some(value.map_or(Export::Name(name), |v| Export::Set(name, v)))
}

/// The environment the step's tasks get of `env` (this command's) by `--export`: all of it
/// without one or with `ALL`; else its `SLURM_*` and `WHARF_*` variables (the job's place,
/// as Slurm keeps them under `NONE`) and the names given; `NAME=VALUE` entries set a value.
fn exported(env: BTreeMap<String, String>, spec: Option<&str>) -> Result<BTreeMap<String, String>> {
    let Some(spec) = spec else {
        return Ok(env);
    };
    let entries = export_entries(spec)?;
    let mut out: BTreeMap<String, String> = if entries.contains(&Export::All) {
        env.clone()
    } else {
        (env.iter())
            .filter(|(k, _)| k.starts_with("SLURM_") || k.starts_with("WHARF_"))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    };
    for e in entries {
        match e {
            Export::All | Export::None => {}
            Export::Set(name, value) => {
                out.insert(name.to_string(), value.to_string());
            }
            Export::Name(name) => {
                if let Some(v) = env.get(name) {
                    out.insert(name.to_string(), v.clone());
                }
            }
        }
    }
    Ok(out)
}

/// The step's GPU request, as `--gpus-per-node`, `--gpus` and `--gres` write it (the job's
/// options' forms, read the same way).
#[derive(Debug, Default, PartialEq, Eq)]
struct StepGpus {
    per_node: Option<u32>,
    total: Option<u32>,
    kind: Option<String>,
}

impl StepGpus {
    fn parse(args: &Args) -> Result<StepGpus> {
        Self::of(&[
            ("gpus-per-node", &args.gpus_per_node),
            ("gpus", &args.gpus),
            ("gres", &args.gres),
        ])
    }

    /// From the options given, as (name, value).
    fn of(options: &[(&str, &Option<String>)]) -> Result<StepGpus> {
        let mut req = wharf_api::JobRequest::default();
        for &(key, value) in options {
            if let Some(v) = value {
                wharf_api::jobfile::set_option(&mut req, key, v).map_err(anyhow::Error::msg)?;
            }
        }
        Ok(StepGpus {
            per_node: req.gpus,
            total: req.gpus_total,
            kind: req.gpu_type,
        })
    }
}

/// How long a caller whose agent went away tries to reach it again, and how often.
const RECONNECT_FOR: std::time::Duration = std::time::Duration::from_secs(120);
const RECONNECT_EVERY: std::time::Duration = std::time::Duration::from_millis(250);

/// How one connection to the agent ended.
enum Answer {
    /// The step ended with this status.
    Ended(i32),
    /// The connection was cut; the step's id when it had started.
    Cut(Option<u32>),
}

/// Bytes of standard input one line to the agent carries at most.
const INPUT_BYTES: usize = 64 << 10;

/// Reads this command's standard input on a thread of its own, a line for the agent at a
/// time: the channel holds one, so a step whose tasks do not read stops the reading (and
/// whoever writes into this command waits), as a pipe would.
fn read_stdin() -> tokio::sync::mpsc::Receiver<InputLine> {
    use std::io::Read;
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    std::thread::spawn(move || {
        let mut stdin = std::io::stdin().lock();
        let mut offset = 0u64;
        loop {
            let mut data = vec![0u8; INPUT_BYTES];
            let n = match stdin.read(&mut data) {
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                // An input that cannot be read ends there.
                Err(_) => 0,
            };
            data.truncate(n);
            let line = InputLine {
                offset,
                data,
                eof: n == 0,
            };
            offset += n as u64;
            if tx.blocking_send(line).is_err() || n == 0 {
                return;
            }
        }
    });
    rx
}

/// Sends `request` on `stream`, then `input` as it comes once the step's start says its
/// tasks take it (`takes_input`, kept for a connection that waits again), and reads the
/// answers until the step ends or the connection is cut.
async fn exchange(
    stream: tokio::net::UnixStream,
    request: &StepRequest,
    job: &str,
    quiet: bool,
    out: &mut Lines,
    input: Option<&mut tokio::sync::mpsc::Receiver<InputLine>>,
    takes_input: &mut bool,
) -> Result<Answer> {
    let (rd, mut wr) = stream.into_split();
    let mut line = serde_json::to_vec(request)?;
    line.push(b'\n');
    // The agent may refuse the caller before reading a word: its answer says why.
    let _ = wr.write_all(&line).await;
    // Input goes on beside the answers: a task's output never waits for its input. Only
    // once the step's record says it takes input: an agent from before input forwarding
    // drops the request's `input` (its record says none), and would take a line from this
    // command for its going away.
    let (go, mut go_rx) = tokio::sync::watch::channel(*takes_input);
    let send_input = async move {
        let go = go_rx.wait_for(|go| *go).await.is_ok();
        if let Some(input) = input.filter(|_| go) {
            while let Some(chunk) = input.recv().await {
                let mut line = serde_json::to_vec(&chunk).unwrap_or_default();
                line.push(b'\n');
                if wr.write_all(&line).await.is_err() {
                    break;
                }
            }
        }
        // Kept open: the agent takes the connection's end for the caller going away.
        std::future::pending::<()>().await;
        drop(wr);
    };
    tokio::pin!(send_input);
    let mut lines = BufReader::new(rd).lines();
    let mut started = request.resume;
    loop {
        let next = tokio::select! {
            l = lines.next_line() => l,
            () = &mut send_input => unreachable!("input never ends the exchange"),
        };
        let Ok(Some(text)) = next else {
            return Ok(Answer::Cut(started));
        };
        match serde_json::from_str::<StepReply>(&text)
            .with_context(|| "the agent's answer makes no sense")?
        {
            StepReply::Output(chunk) => {
                // Nothing should be lost on the way (the files are pushed again until the
                // caller has them), but should it be, the caller is told rather than left
                // with a hole it cannot see.
                let lost = out.gap(&chunk);
                if lost > 0 {
                    emit_all(out.flush_all());
                    let stream = match chunk.stream {
                        Stream::Stdout => "standard output",
                        Stream::Stderr => "standard error",
                    };
                    eprintln!(
                        "wharf: {lost} bytes of rank {}'s {stream} were lost on their way here",
                        chunk.rank
                    );
                }
                if let Some((stream, bytes)) = out.take(&chunk) {
                    emit(stream, &bytes);
                }
            }
            StepReply::Notice(why) => {
                emit_all(out.flush_all());
                eprintln!("wharf: {}", crate::output::clean(&why));
            }
            StepReply::Waiting(why) => {
                if !quiet {
                    eprintln!("wharf: {}", crate::output::clean(&why));
                }
            }
            StepReply::Started(s) => {
                started = Some(s.id);
                if s.input != StepInput::None {
                    *takes_input = true;
                    let _ = go.send(true);
                }
                out.ranks(s.ntasks());
                if !quiet {
                    eprintln!("wharf: step {job}.{} started: {}", s.id, describe(&s));
                }
            }
            StepReply::Ended(s) => {
                emit_all(out.flush_all());
                let why = (s.exit.as_ref())
                    .and_then(|e| e.message.clone())
                    .map(|m| format!(": {}", crate::output::clean(&m)));
                // Quiet leaves out the start and end, not why a step failed (as srun -Q).
                if !quiet || why.is_some() {
                    let why = why.unwrap_or_default();
                    eprintln!("wharf: step {job}.{} ended {}{why}", s.id, s.state());
                }
                return Ok(Answer::Ended(s.exit_status()));
            }
            StepReply::Error(why) => bail!("step refused: {}", crate::output::clean(&why)),
        }
    }
}

/// The longest partial line held back for the rest of it; past this it is written as it is.
const MAX_PARTIAL: usize = 64 << 10;

/// The tasks' output as this command writes it: whole lines, each stream of each rank on
/// its own (so lines of different ranks never mix), with the rank before each line when
/// labelled. The bytes are the tasks' own, control characters included.
struct Lines {
    label: bool,
    /// Unlabelled output goes out as it comes, not by whole lines.
    unbuffered: bool,
    width: usize,
    partial: BTreeMap<(u32, Stream), Vec<u8>>,
    /// Per (rank, stream): the offset of the next byte not yet taken. A restart of an agent
    /// or the controller may send some bytes again; they are dropped here.
    next: BTreeMap<(u32, Stream), u64>,
}

impl Lines {
    fn new(label: bool, unbuffered: bool) -> Lines {
        Lines {
            label,
            unbuffered: unbuffered && !label,
            width: 1,
            partial: BTreeMap::new(),
            next: BTreeMap::new(),
        }
    }

    /// Labels are as wide as the step's highest rank (`srun -l`'s).
    fn ranks(&mut self, ntasks: u32) {
        self.width = ntasks.saturating_sub(1).to_string().len();
    }

    /// Bytes of the chunk's stream missing before it: what never arrived between the last
    /// byte taken and where the chunk starts.
    fn gap(&self, c: &OutputChunk) -> u64 {
        let next = self.next.get(&(c.rank, c.stream)).copied().unwrap_or(0);
        c.offset.saturating_sub(next)
    }

    /// Takes a chunk: the whole lines it completes, as they are to be written.
    fn take(&mut self, c: &OutputChunk) -> Option<(Stream, Vec<u8>)> {
        let next = self.next.entry((c.rank, c.stream)).or_default();
        let end = c.offset + c.data.len() as u64;
        if end <= *next {
            return None;
        }
        // Past `next` (output lost on the way, see `gap`): go on from there.
        let skip = next.saturating_sub(c.offset) as usize;
        *next = end;
        let held = self.partial.entry((c.rank, c.stream)).or_default();
        held.extend_from_slice(&c.data[skip..]);
        let whole = match held.iter().rposition(|&b| b == b'\n') {
            _ if self.unbuffered && !held.is_empty() => held.len(),
            Some(i) => i + 1,
            None if held.len() > MAX_PARTIAL => held.len(),
            None => return None,
        };
        let rest = held.split_off(whole);
        let text = std::mem::replace(held, rest);
        Some((c.stream, self.render(c.rank, &text)))
    }

    fn render(&self, rank: u32, text: &[u8]) -> Vec<u8> {
        if !self.label {
            return text.to_vec();
        }
        let mut buf = Vec::with_capacity(text.len() + 16);
        for line in text.split_inclusive(|&b| b == b'\n') {
            buf.extend_from_slice(format!("{rank:>w$}: ", w = self.width).as_bytes());
            buf.extend_from_slice(line);
        }
        buf
    }

    /// What is left of every stream's last line (the step ended, or words of Wharf's own
    /// follow).
    fn flush_all(&mut self) -> Vec<(Stream, Vec<u8>)> {
        std::mem::take(&mut self.partial)
            .into_iter()
            .filter(|(_, text)| !text.is_empty())
            .map(|((rank, stream), text)| (stream, self.render(rank, &text)))
            .collect()
    }
}

/// Writes the tasks' bytes to this command's standard output or error. A closed one
/// (`| head`) is not the step's failure.
fn emit(stream: Stream, bytes: &[u8]) {
    let mut out: Box<dyn Write> = match stream {
        Stream::Stdout => Box::new(std::io::stdout().lock()),
        Stream::Stderr => Box::new(std::io::stderr().lock()),
    };
    let _ = out.write_all(bytes).and_then(|()| out.flush());
}

fn emit_all(parts: Vec<(Stream, Vec<u8>)>) {
    for (stream, bytes) in parts {
        emit(stream, &bytes);
    }
}

/// A step's `--time` in seconds: Slurm's forms, as a job's; `UNLIMITED` (or 0) is
/// [`wharf_api::resources::UNLIMITED_TIME`], the job's own limit.
pub fn step_time(text: &str) -> Result<u64, String> {
    wharf_api::resources::parse_time_limit(text).map_err(|e| format!("--time: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_steps_gpus_are_read_as_the_jobs_options_are() {
        let of = |key: &str, v: &str| StepGpus::of(&[(key, &Some(v.to_string()))]);
        let per_node = |n, kind: Option<&str>| StepGpus {
            per_node: Some(n),
            kind: kind.map(str::to_string),
            ..Default::default()
        };
        assert_eq!(of("gres", "gpu:1").unwrap(), per_node(1, None));
        assert_eq!(of("gres", "gpu").unwrap(), per_node(1, None));
        assert_eq!(of("gres", "gpu:h100:2").unwrap(), per_node(2, Some("h100")));
        assert_eq!(of("gpus-per-node", "2").unwrap(), per_node(2, None));
        assert_eq!(of("gpus", "4").unwrap().total, Some(4));
        assert!(of("gres", "gpu:x:y").is_err());
        assert!(of("gres", "mps:1").is_err());
        assert_eq!(StepGpus::of(&[]).unwrap(), StepGpus::default());
    }

    /// Chunks of each (rank, stream) follow each other, as the controller sends them.
    fn chunker() -> impl FnMut(u32, Stream, &[u8]) -> OutputChunk {
        let mut at: BTreeMap<(u32, Stream), u64> = BTreeMap::new();
        move |rank, stream, data| {
            let offset = at.entry((rank, stream)).or_default();
            let c = OutputChunk {
                seq: 0,
                rank,
                stream,
                offset: *offset,
                data: data.to_vec(),
            };
            *offset += data.len() as u64;
            c
        }
    }

    #[test]
    fn lines_come_out_whole_per_rank_and_stream_labelled_when_asked() {
        let mut chunk = chunker();
        let mut l = Lines::new(true, false);
        l.ranks(12);
        assert_eq!(l.take(&chunk(3, Stream::Stdout, b"hal")), None);
        // Another rank's line in between does not cut rank 3's.
        let other = l.take(&chunk(10, Stream::Stdout, b"x\n")).unwrap();
        assert_eq!(other, (Stream::Stdout, b"10: x\n".to_vec()));
        let got = l
            .take(&chunk(3, Stream::Stdout, b"f\nnext\n\x1b[1mpart"))
            .unwrap();
        assert_eq!(got, (Stream::Stdout, b" 3: half\n 3: next\n".to_vec()));
        assert_eq!(l.take(&chunk(3, Stream::Stderr, b"e")), None);
        let mut rest = l.flush_all();
        rest.sort();
        assert_eq!(
            rest,
            [
                (Stream::Stdout, b" 3: \x1b[1mpart".to_vec()),
                (Stream::Stderr, b" 3: e".to_vec())
            ]
        );
        // Unlabelled, the bytes pass as they are; a line without end is not held forever.
        let mut chunk = chunker();
        let mut l = Lines::new(false, false);
        assert_eq!(
            l.take(&chunk(0, Stream::Stdout, b"a\r\n")).unwrap().1,
            b"a\r\n"
        );
        let long = vec![b'y'; MAX_PARTIAL + 1];
        assert_eq!(l.take(&chunk(0, Stream::Stdout, &long)).unwrap().1, long);
        // Unbuffered (srun -u), a part of a line goes out as it comes (a progress bar's);
        // labelled, lines stay whole.
        let mut chunk = chunker();
        let mut l = Lines::new(false, true);
        let bar = l.take(&chunk(0, Stream::Stderr, b"\r 40%")).unwrap();
        assert_eq!(bar, (Stream::Stderr, b"\r 40%".to_vec()));
        assert_eq!(
            l.take(&chunk(0, Stream::Stderr, b"\r100%\n")).unwrap().1,
            b"\r100%\n"
        );
        assert_eq!(l.flush_all(), []);
        let mut chunk = chunker();
        let mut l = Lines::new(true, true);
        assert_eq!(l.take(&chunk(0, Stream::Stdout, b"part")), None);
    }

    #[test]
    fn export_passes_all_none_or_the_variables_named() {
        let env: BTreeMap<String, String> = [
            ("HOME", "/home/ann"),
            ("PATH", "/bin"),
            ("SLURM_JOB_ID", "7"),
            ("WHARF_STEP_SOCKET", "@s"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let keys = |spec: Option<&str>| -> Vec<String> {
            let out = exported(env.clone(), spec).unwrap();
            out.iter().map(|(k, v)| format!("{k}={v}")).collect()
        };
        assert_eq!(keys(None).len(), 4);
        assert_eq!(keys(Some("ALL")).len(), 4);
        assert_eq!(
            keys(Some("NONE")),
            ["SLURM_JOB_ID=7", "WHARF_STEP_SOCKET=@s"]
        );
        assert_eq!(
            keys(Some("PATH,OMP_NUM_THREADS=4,GONE")),
            [
                "OMP_NUM_THREADS=4",
                "PATH=/bin",
                "SLURM_JOB_ID=7",
                "WHARF_STEP_SOCKET=@s"
            ]
        );
        assert_eq!(keys(Some("ALL,HOME=/scratch"))[0], "HOME=/scratch");
        for bad in ["", "A,,B", "=1", "A B=1", "PATH;rm"] {
            let err = exported(env.clone(), Some(bad)).unwrap_err().to_string();
            assert!(err.starts_with("--export: "), "{bad}: {err}");
        }
    }

    #[test]
    fn bytes_sent_again_after_a_restart_are_written_once() {
        let c = |offset, data: &[u8]| OutputChunk {
            seq: 0,
            rank: 0,
            stream: Stream::Stdout,
            offset,
            data: data.to_vec(),
        };
        let mut l = Lines::new(false, false);
        assert_eq!(l.take(&c(0, b"one\ntw")).unwrap().1, b"one\n");
        // Sent again from an earlier offset: only what is new goes on.
        assert_eq!(l.take(&c(0, b"one\n")), None);
        assert_eq!(l.take(&c(4, b"two\nthree\n")).unwrap().1, b"two\nthree\n");
        assert_eq!(l.gap(&c(0, b"one\n")), 0);
    }

    #[test]
    fn bytes_that_never_arrived_are_counted_per_rank_and_stream() {
        let c = |rank, offset, data: &[u8]| OutputChunk {
            seq: 0,
            rank,
            stream: Stream::Stderr,
            offset,
            data: data.to_vec(),
        };
        let mut l = Lines::new(false, false);
        assert_eq!(l.gap(&c(0, 0, b"a\n")), 0);
        assert_eq!(l.take(&c(0, 0, b"a\n")).unwrap().1, b"a\n");
        // Rank 0's bytes 2..10 never came; rank 1's stream starts where it should.
        assert_eq!(l.gap(&c(0, 10, b"b\n")), 8);
        assert_eq!(l.gap(&c(1, 0, b"c\n")), 0);
        assert_eq!(l.take(&c(0, 10, b"b\n")).unwrap().1, b"b\n");
        assert_eq!(l.gap(&c(0, 12, b"d\n")), 0);
    }
}
