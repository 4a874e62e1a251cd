//! `wharf update`: change a pending job, or a running job's time limit (Slurm's `scontrol update job`).

use anyhow::Result;
use wharf_api::resources::format_duration;
use wharf_api::wire::UpdateRequest;
use wharf_api::JobRecord;
use wharf_client::{Client, ClientError, Endpoint};

/// Arguments.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Job id, or ARRAYID_TASKID.
    #[arg(value_parser = super::job_arg)]
    job: String,
    /// New time limit, e.g. 30m, or UNLIMITED for the partition's maximum; +30 or -10 (minutes,
    /// or any time form after the sign) moves the one the job has (you may only lower it;
    /// admins may raise it).
    #[arg(short = 't', long, allow_hyphen_values = true)]
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
    /// Fix the job's priority at N, above or below every computed one (admins only); `auto`
    /// returns it to its computed priority.
    #[arg(long, value_name = "N|auto", value_parser = parse_priority)]
    priority: Option<u64>,
    /// New job name.
    #[arg(short = 'J', long, visible_alias = "job-name")]
    name: Option<String>,
    /// New dependency, as at submit (afterok:12, afterany:12:13, singleton, ...); "" clears
    /// it. Refused if the job would wait on itself through other jobs' dependencies.
    #[arg(short = 'd', long, value_name = "SPEC")]
    dependency: Option<String>,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

/// Runs the command.
pub async fn run(socket: &str, args: Args) -> Result<i32> {
    // `+30` and `-10` move the limit the job has, as scontrol's TimeLimit=+30.
    let (time, time_delta) = match args.time.as_deref().map(str::trim) {
        Some(t) if t.starts_with(['+', '-']) => {
            let secs =
                wharf_api::parse_duration(&t[1..]).map_err(|e| anyhow::anyhow!("--time: {e}"))?;
            let secs =
                i64::try_from(secs).map_err(|_| anyhow::anyhow!("--time: {t:?} is too large"))?;
            (None, Some(if t.starts_with('-') { -secs } else { secs }))
        }
        t => (
            t.map(wharf_api::parse_time_limit)
                .transpose()
                .map_err(|e| anyhow::anyhow!("--time: {e}"))?,
            None,
        ),
    };
    let req = UpdateRequest {
        time,
        time_delta,
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
        priority: args.priority,
        name: args.name,
        dependency: (args.dependency)
            .map(|d| {
                let d = d.trim().to_string();
                // Checked here too, so a typo is named before anything is sent.
                if !d.is_empty() {
                    wharf_api::dependency::parse_dependency(&d)
                        .map_err(|e| anyhow::anyhow!("--dependency: {e}"))?;
                }
                anyhow::Ok(d)
            })
            .transpose()?,
    };
    if req == UpdateRequest::default() {
        anyhow::bail!(
            "nothing to change: give --time, --nice, --partition, --qos, --account, --begin, \
             --priority, --name or --dependency"
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
                "job {} ({}): time limit {}, nice {}, partition {}, qos {}, account {}{}",
                args.job,
                crate::output::clean(&job.name),
                format_duration(job.time_limit),
                spec.map_or(0, |s| s.nice),
                named(spec.and_then(|s| s.partition.as_ref())),
                named(spec.and_then(|s| s.qos.as_ref())),
                named(spec.and_then(|s| s.account.as_ref())),
                job.begin_time
                    .map(|b| format!(", begins {}", crate::output::time(Some(b))))
                    .unwrap_or_default()
                    + &spec
                        .and_then(|s| s.priority)
                        .map(|p| format!(", priority fixed at {p}"))
                        .unwrap_or_default()
                    + &job
                        .dependency
                        .as_ref()
                        .map(|d| format!(", dependency {}", crate::output::clean(&d.to_string())))
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

/// `--priority`: a whole number from 1, or `auto` (sent as 0: the computed priority again).
fn parse_priority(s: &str) -> Result<u64, String> {
    match s.trim() {
        "auto" => Ok(0),
        n => match n.parse::<u64>() {
            Ok(0) | Err(_) => Err(format!(
                "expected a whole number from 1, or auto, found {s:?} (to keep a job from \
                 starting, use wharf hold)"
            )),
            Ok(v) => Ok(v),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::parse_priority;

    #[test]
    fn priority_is_a_number_from_one_or_auto() {
        assert_eq!(parse_priority("5000"), Ok(5000));
        assert_eq!(parse_priority("auto"), Ok(0));
        for bad in ["0", "-1", "high", ""] {
            assert!(
                parse_priority(bad).unwrap_err().contains("wharf hold"),
                "{bad}"
            );
        }
    }
}
