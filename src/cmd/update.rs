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
    /// New QoS.
    #[arg(short = 'q', long)]
    qos: Option<String>,
    /// New account to charge.
    #[arg(short = 'A', long)]
    account: Option<String>,
    /// Not before this time: now+1h (from now), 16:00, 2026-12-01T08:00 (your time zone),
    /// 2026-12-01T08:00Z (UTC); `now` clears it.
    #[arg(long)]
    begin: Option<String>,
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
        qos: args.qos,
        account: args.account,
        begin: args
            .begin
            .as_deref()
            .map(|b| wharf_api::forms::parse_begin(b).map_err(anyhow::Error::msg))
            .transpose()?
            .map(crate::localtime::localize)
            .transpose()?,
    };
    if req == UpdateRequest::default() {
        anyhow::bail!(
            "nothing to change: give --time, --nice, --partition, --qos, --account or --begin"
        );
    }
    let client = Client::new(Endpoint::parse(socket), None);
    match client
        .post::<_, JobRecord>(&format!("/v1/jobs/{}/update", args.job), &req)
        .await
    {
        Ok(job) if args.json => println!("{}", serde_json::to_string_pretty(&job)?),
        Ok(job) => {
            let spec = job.spec.as_ref();
            let named = |v: Option<&String>| {
                crate::output::clean(v.map_or("default", String::as_str)).into_owned()
            };
            println!(
                "job {}: time limit {}, nice {}, partition {}, qos {}, account {}{}",
                args.job,
                format_duration(job.time_limit),
                spec.map_or(0, |s| s.nice),
                named(spec.and_then(|s| s.partition.as_ref())),
                named(spec.and_then(|s| s.qos.as_ref())),
                named(spec.and_then(|s| s.account.as_ref())),
                job.begin_time
                    .map(|b| format!(", begins {}", crate::output::time(Some(b))))
                    .unwrap_or_default()
            )
        }
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
