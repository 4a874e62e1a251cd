//! `wharf step`: runs a command on some or all of the nodes of the job it is called from,
//! within that job's allocation (Slurm's `srun` inside a job). It asks the node's agent
//! over the socket named in `WHARF_STEP_SOCKET`, which every job gets; the agent learns from
//! the kernel which job and user the caller is, never from the request. Waits for every task
//! of the step and exits with the step's status.

use std::collections::BTreeMap;

use anyhow::{bail, Context, Result};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use wharf_api::step::{StepRecord, StepReply, StepRequest};

/// Arguments.
#[derive(Debug, clap::Args)]
#[command(trailing_var_arg = true)]
pub struct Args {
    /// Run on the job's first N nodes (default: all of them).
    #[arg(short = 'N', long)]
    nodes: Option<u32>,
    /// Run on these of the job's nodes (a host list, e.g. `gpu[01-02]`).
    #[arg(short = 'w', long)]
    nodelist: Option<String>,
    /// Tasks on each node (default: the job's tasks per node, or from --ntasks).
    #[arg(long)]
    ntasks_per_node: Option<u32>,
    /// Tasks in all, spread evenly over the step's nodes.
    #[arg(short = 'n', long)]
    ntasks: Option<u32>,
    /// GPUs each task has to itself (default: every task sees all the job's GPUs on its node).
    #[arg(long)]
    gpus_per_task: Option<u32>,
    /// The job to run in: refused unless it is the job this command runs inside.
    #[arg(long)]
    jobid: Option<u64>,
    /// Print nothing of the step's start and end on standard error.
    #[arg(short, long)]
    quiet: bool,
    /// The command and its arguments.
    #[arg(required = true)]
    command: Vec<String>,
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
    let env: BTreeMap<String, String> = std::env::vars().collect();
    let job = std::env::var("WHARF_JOB_ID").unwrap_or_default();
    let request = StepRequest {
        nodes: args.nodes,
        nodelist: args.nodelist,
        ntasks_per_node: args.ntasks_per_node,
        ntasks: args.ntasks,
        gpus_per_task: args.gpus_per_task,
        job: args.jobid,
        argv: args.command,
        env,
        workdir: std::env::current_dir()
            .ok()
            .map(|d| d.display().to_string()),
        resume: None,
    };
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
        match exchange(stream, &request, &job, args.quiet).await? {
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

/// Sends `request` on `stream` and reads the answers until the step ends or the connection
/// is cut.
async fn exchange(
    mut stream: tokio::net::UnixStream,
    request: &StepRequest,
    job: &str,
    quiet: bool,
) -> Result<Answer> {
    let mut line = serde_json::to_vec(request)?;
    line.push(b'\n');
    // The agent may refuse the caller before reading a word: its answer says why.
    let _ = stream.write_all(&line).await;
    let mut lines = BufReader::new(stream).lines();
    let mut started = request.resume;
    loop {
        let Ok(Some(text)) = lines.next_line().await else {
            return Ok(Answer::Cut(started));
        };
        match serde_json::from_str::<StepReply>(&text)
            .with_context(|| "the agent's answer makes no sense")?
        {
            StepReply::Started(s) => {
                started = Some(s.id);
                if !quiet {
                    eprintln!("wharf: step {job}.{} started: {}", s.id, describe(&s));
                }
            }
            StepReply::Ended(s) => {
                if !quiet {
                    let why = s
                        .exit
                        .as_ref()
                        .and_then(|e| e.message.clone())
                        .map(|m| format!(": {}", crate::output::clean(&m)))
                        .unwrap_or_default();
                    eprintln!("wharf: step {job}.{} ended {}{why}", s.id, s.state());
                }
                return Ok(Answer::Ended(s.exit_status()));
            }
            StepReply::Error(why) => bail!("step refused: {}", crate::output::clean(&why)),
        }
    }
}
