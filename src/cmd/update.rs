//! `wharf update`: change a pending job (Slurm's `scontrol update job`).

use anyhow::Result;
use wharf_api::resources::{format_duration, parse_duration};
use wharf_api::wire::UpdateRequest;
use wharf_api::JobRecord;
use wharf_client::{Client, ClientError, Endpoint};

/// Arguments.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Job id, or ARRAYID_TASKID.
    job: String,
    /// New time limit, e.g. 30m (you may only lower it; admins may raise it).
    #[arg(short = 't', long)]
    time: Option<String>,
    /// New nice (negative: admins only).
    #[arg(long, allow_hyphen_values = true)]
    nice: Option<i32>,
    /// New partition.
    #[arg(short = 'p', long)]
    partition: Option<String>,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

/// Runs the command.
pub async fn run(socket: &str, args: Args) -> Result<i32> {
    let req = UpdateRequest {
        time: args
            .time
            .as_deref()
            .map(parse_duration)
            .transpose()
            .map_err(|e| anyhow::anyhow!("--time: {e}"))?,
        nice: args.nice,
        partition: args.partition,
    };
    if req == UpdateRequest::default() {
        anyhow::bail!("nothing to change: give --time, --nice or --partition");
    }
    let client = Client::new(Endpoint::parse(socket), None);
    match client
        .post::<_, JobRecord>(&format!("/v1/jobs/{}/update", args.job), &req)
        .await
    {
        Ok(job) if args.json => println!("{}", serde_json::to_string_pretty(&job)?),
        Ok(job) => println!(
            "job {}: time limit {}, nice {}, partition {}",
            args.job,
            format_duration(job.time_limit),
            job.spec.as_ref().map_or(0, |s| s.nice),
            job.spec
                .as_ref()
                .and_then(|s| s.partition.clone())
                .unwrap_or_else(|| "default".into())
        ),
        Err(ClientError::Api { error, .. }) => {
            eprintln!(
                "error: job {}: {}",
                args.job,
                crate::output::clean(&error.error)
            );
            return Ok(1);
        }
        Err(e) => return Err(e.into()),
    }
    Ok(0)
}
