//! `wharf cancel`.

use anyhow::Result;
use wharf_api::step::StepRecord;
use wharf_api::wire::WhoAmI;
use wharf_api::JobRecord;
use wharf_client::{Client, ClientError, Endpoint};

mod signal;

/// How the filters pick jobs, for `--help`.
const FILTERS: &str = "Filters (scancel's) pick active jobs: `wharf cancel -t PD` cancels your \
pending jobs; `-u USER` picks USER's instead of your own (an admin's to cancel); given with \
job ids, they narrow those, whoever's they are (`wharf cancel 12 -t PD`: 12's pending tasks).

--signal SIG sends running jobs' processes a signal and ends nothing (unless the signal does): `wharf cancel --signal USR1 12` to make job 12 checkpoint, `-s TERM 12.1` for step 1 alone. As scancel's, it reaches every task of a job and of its steps, but not a batch job's script (#SBATCH, run once), which would end on a signal it does not trap: -b sends it to the script alone, -f to the script, its children and the steps. With filters, the running jobs they pick are signalled.";

/// Arguments.
#[derive(Debug, clap::Args)]
#[command(after_help = FILTERS)]
pub struct Args {
    /// Job ids: ID, an array's ID (all its tasks), ID_TASK or ID_[LIST] (some of its tasks:
    /// 20_[6-10], 20_[1,3]); or JOB.STEP for one step of a running job (the job goes on).
    #[arg(value_parser = super::job_or_step_arg)]
    jobs: Vec<String>,
    /// Only jobs in these states (e.g. pending, or Slurm's codes: PD,R).
    #[arg(short = 't', long, visible_alias = "states", value_delimiter = ',')]
    state: Vec<String>,
    /// Only these users' jobs (default: your own, when filtering): names or uids; a name this
    /// host does not know is refused.
    #[arg(short, long, value_delimiter = ',', value_name = "USER")]
    user: Vec<String>,
    /// Only jobs with this name.
    #[arg(short, long)]
    name: Option<String>,
    /// Only jobs in these partitions.
    #[arg(short, long, value_delimiter = ',', value_name = "PARTITION")]
    partition: Vec<String>,
    /// Send this signal to the jobs' (or steps') processes instead of ending them: a name,
    /// with or without SIG (USR1, SIGTERM), or a number (10). Only running jobs take one.
    #[arg(short = 's', long, value_name = "SIGNAL", value_parser = signal::parse)]
    signal: Option<nix::sys::signal::Signal>,
    /// With --signal: a batch job's script alone (not its children nor its steps).
    #[arg(short = 'b', long, requires = "signal", conflicts_with = "full")]
    batch: bool,
    /// With --signal: a batch job's script and its children too, as well as its steps.
    #[arg(short = 'f', long, requires = "signal")]
    full: bool,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

impl Args {
    /// Whether any filter is given.
    fn filters(&self) -> bool {
        !self.state.is_empty()
            || !self.user.is_empty()
            || self.name.is_some()
            || !self.partition.is_empty()
    }
}

/// Runs the command. Exit status 1 if any cancel was refused.
pub async fn run(socket: &str, mut args: Args) -> Result<i32> {
    // An array's tasks listed in brackets are each named (checked when parsed).
    args.jobs = (args.jobs.iter())
        .flat_map(|j| match super::task_list(j) {
            Some(Ok(tasks)) => tasks,
            _ => vec![j.clone()],
        })
        .collect();
    let what = if args.signal.is_some() {
        "signal"
    } else {
        "cancel"
    };
    if args.jobs.is_empty() && !args.filters() {
        anyhow::bail!(
            "name the jobs to {what} (IDs), or pick them with -t STATE, -u USER, -n NAME or \
             -p PARTITION"
        );
    }
    let (steps, jobs): (Vec<String>, Vec<String>) =
        args.jobs.iter().cloned().partition(|j| j.contains('.'));
    if args.json && !steps.is_empty() && !jobs.is_empty() {
        anyhow::bail!("with --json, {what} steps and jobs in separate commands");
    }
    if !steps.is_empty() && args.filters() {
        anyhow::bail!(
            "-t, -u, -n and -p pick jobs, not steps: name the steps alone ({})",
            steps.join(" ")
        );
    }
    if let Some(sig) = args.signal {
        if (args.batch || args.full) && !steps.is_empty() {
            anyhow::bail!(
                "-b and -f pick a batch job's script, which no step has: signal the steps ({}) \
                 without them",
                steps.join(" ")
            );
        }
        let jobs = if args.filters() {
            let picked = picked(socket, &args).await?;
            if picked.is_empty() {
                eprintln!("wharf: no running job matches; nothing signalled");
                return Ok(0);
            }
            picked
        } else {
            jobs
        };
        let how = (args.batch, args.full);
        return signal::run(socket, &jobs, &steps, sig, how, args.json).await;
    }
    if !steps.is_empty() {
        let mut status = cancel_steps(socket, &steps, args.json).await?;
        if !jobs.is_empty() {
            status = status.max(post_each(socket, &jobs, args.json, "cancel", cancelled).await?);
        }
        return Ok(status);
    }
    let jobs = if args.filters() {
        let picked = picked(socket, &args).await?;
        if picked.is_empty() {
            eprintln!("wharf: no active job matches; nothing cancelled");
            return Ok(0);
        }
        picked
    } else {
        args.jobs.clone()
    };
    post_each(socket, &jobs, args.json, "cancel", cancelled).await
}

/// What `wharf cancel` says of a job it cancelled.
fn cancelled(job: &JobRecord) -> String {
    if job.state.is_terminal() {
        job.state.to_string()
    } else {
        "cancelling".into()
    }
}

/// The API path of `action` on step `label` (`JOB.STEP`).
fn step_path(label: &str, action: &str) -> String {
    let (job, step) = label.rsplit_once('.').unwrap_or((label, ""));
    format!("/v1/jobs/{job}/steps/{step}/{action}")
}

/// Cancels each step `JOB.STEP` of `steps`, printing `step JOB.STEP: cancelling` (or, with
/// `json`, the steps at the end). Exit status 1 if the controller refused any.
async fn cancel_steps(socket: &str, steps: &[String], json: bool) -> Result<i32> {
    let path = |label: &str| step_path(label, "cancel");
    let body = serde_json::json!({});
    post_all(
        socket,
        steps,
        json,
        "step",
        path,
        &body,
        |_: &StepRecord| "cancelling".to_string(),
    )
    .await
}

/// The active jobs `args`'s filters pick (among its job ids, when it names some), each by
/// its own id (`ARRAYID_TASK` for an array's task: an array's id alone would cancel every
/// task of it); without `-u` or ids, the caller's own. Only running ones with `--signal`:
/// no other job has processes to take it.
async fn picked(socket: &str, args: &Args) -> Result<Vec<String>> {
    let client = Client::new(Endpoint::parse(socket), None);
    let users = if args.user.is_empty() && args.jobs.is_empty() {
        let who: WhoAmI = client.get("/v1/whoami").await?;
        vec![who.owner.user]
    } else {
        args.user.clone()
    };
    let filter = super::queue::Picked::new(&args.state, &users, &args.jobs, &args.partition)?;
    // The listing's rows hold all the filters need: one look, checked for -p.
    super::queue::with_rows(&client, 0, false, &filter, |rows| {
        (rows.iter())
            .filter(|r| !r.state.is_terminal())
            .filter(|r| args.signal.is_none() || r.state == wharf_api::JobState::Running)
            .filter(|r| args.name.as_ref().is_none_or(|n| *n == r.name))
            .map(|r| match r.array {
                Some((array, task)) => format!("{array}_{task}"),
                None => r.id.to_string(),
            })
            .collect()
    })
    .await
}

/// Posts `/v1/jobs/ID/ACTION` for each job, printing `job ID: WHAT` (or, with `json`, the
/// changed jobs at the end). Exit status 1 if the controller refused any of them.
pub async fn post_each(
    socket: &str,
    jobs: &[String],
    json: bool,
    action: &str,
    what: impl Fn(&JobRecord) -> String,
) -> Result<i32> {
    let path = |id: &str| format!("/v1/jobs/{id}/{action}");
    post_all(
        socket,
        jobs,
        json,
        "job",
        path,
        &serde_json::json!({}),
        what,
    )
    .await
}

/// Posts `body` to `path(ID)` for each of `ids`, printing `NOUN ID: WHAT` of each answer
/// (or, with `json`, the answers at the end). Exit status 1 if the controller refused any.
async fn post_all<T: serde::de::DeserializeOwned + serde::Serialize>(
    socket: &str,
    ids: &[String],
    json: bool,
    noun: &str,
    path: impl Fn(&str) -> String,
    body: &serde_json::Value,
    what: impl Fn(&T) -> String,
) -> Result<i32> {
    let client = Client::new(Endpoint::parse(socket), None);
    let mut status = 0;
    let mut done = Vec::new();
    for id in ids {
        match client.post::<_, T>(&path(id), body).await {
            Ok(answer) => {
                if !json {
                    println!("{noun} {id}: {}", what(&answer));
                }
                done.push(answer);
            }
            Err(ClientError::Api { error, .. }) => {
                eprintln!("error: {noun} {id}: {}", crate::output::clean(&error.error));
                status = 1;
            }
            Err(e) => return Err(e.into()),
        }
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&done)?);
    }
    Ok(status)
}
