//! `wharf run`: submit, wait, stream output, exit with the job's status.

use std::io::{Read, Seek, SeekFrom, Write};
use std::time::Duration;

use anyhow::Result;
use wharf_api::{JobRecord, JobRequest, JobState};
use wharf_client::{Client, Endpoint};

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
}

impl Tail {
    fn pump(&mut self, out: &mut dyn Write) {
        let Ok(mut f) = std::fs::File::open(&self.path) else {
            return;
        };
        if f.seek(SeekFrom::Start(self.offset)).is_err() {
            return;
        }
        let mut buf = Vec::new();
        if let Ok(n) = f.read_to_end(&mut buf) {
            self.offset += n as u64;
            let _ = out.write_all(&buf);
            let _ = out.flush();
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

/// Runs the command.
pub async fn run(socket: &str, args: Args) -> Result<i32> {
    let job = JobRequest {
        command: Some(args.command.clone()),
        ..Default::default()
    }
    .overlay(args.flags.to_request()?);
    let id = submit(socket, job).await?;
    let client = Client::new(Endpoint::parse(socket), None);
    let first: JobRecord = client.get(&format!("/v1/jobs/{id}")).await?;
    let spec = first
        .spec
        .clone()
        .ok_or_else(|| anyhow::anyhow!("job {id} has no spec"))?;
    let mut out = Tail {
        path: spec.output_path(id),
        offset: 0,
    };
    let mut err = spec.error_path(id).map(|path| Tail { path, offset: 0 });
    let mut said_pending = false;
    let job = loop {
        let job: JobRecord = match client.get(&format!("/v1/jobs/{id}")).await {
            Ok(j) => j,
            Err(e) if e.is_transient() => {
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        if job.state == JobState::Pending && !said_pending {
            if let Some(r) = &job.reason {
                eprintln!("wharf: job {id} queued ({})", crate::output::clean(r));
                said_pending = true;
            }
        }
        // Before the job starts its output file may hold an older run's output.
        if !args.quiet && job.start_time.is_some() {
            out.pump(&mut std::io::stdout());
            if let Some(e) = err.as_mut() {
                e.pump(&mut std::io::stderr());
            }
        }
        if job.state.is_terminal() {
            break job;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    if job.state != JobState::Completed {
        let why = crate::output::clean(job.reason.as_deref().unwrap_or_default()).into_owned();
        eprintln!(
            "wharf: job {id} {}{}",
            job.state,
            if why.is_empty() {
                String::new()
            } else {
                format!(": {why}")
            }
        );
    }
    Ok(exit_status(&job))
}
