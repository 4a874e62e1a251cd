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
    };
    let mut stream = connect().await?;
    let mut line = serde_json::to_vec(&request)?;
    line.push(b'\n');
    // The agent may refuse the caller before reading a word: its answer says why.
    let _ = stream.write_all(&line).await;
    let mut lines = BufReader::new(stream).lines();
    loop {
        let Some(text) = lines.next_line().await? else {
            bail!("this node's Wharf agent went away before the step ended");
        };
        match serde_json::from_str::<StepReply>(&text)
            .with_context(|| "the agent's answer makes no sense")?
        {
            StepReply::Started(s) => {
                if !args.quiet {
                    eprintln!("wharf: step {job}.{} started: {}", s.id, describe(&s));
                }
            }
            StepReply::Ended(s) => {
                let status = s.exit_status();
                if !args.quiet {
                    let why = s
                        .exit
                        .as_ref()
                        .and_then(|e| e.message.clone())
                        .map(|m| format!(": {}", crate::output::clean(&m)))
                        .unwrap_or_default();
                    eprintln!("wharf: step {job}.{} ended {}{why}", s.id, s.state());
                }
                return Ok(status);
            }
            StepReply::Error(why) => bail!("step refused: {}", crate::output::clean(&why)),
        }
    }
}
