//! `wharf report`: CPU-hours, GPU-hours and billing by account, user and partition over a
//! time window, and the cluster's utilization (Slurm's `sreport`).

use anyhow::Result;
use wharf_api::report::{Report, UsageRow};
use wharf_client::{Client, Endpoint};

use crate::output;

/// Arguments.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Window start: 2026-11-01, 2026-11-01T08:00 (UTC) or now-30d (default: the first of
    /// this month, 00:00 UTC).
    #[arg(short = 'S', long)]
    start: Option<String>,
    /// Window end, as --start (default: now).
    #[arg(short = 'E', long)]
    end: Option<String>,
    /// Show at most this many users (most GPU-hours, then CPU-hours, first).
    #[arg(long, default_value_t = 20)]
    top: usize,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

/// Runs the command.
pub async fn run(socket: &str, args: Args) -> Result<i32> {
    let now = wharf_controller::now_ms();
    let since = match args.start.as_deref() {
        Some(t) => super::acct::window_time("--start", t, now)?,
        None => month_start(now),
    };
    let until = args
        .end
        .as_deref()
        .map(|t| super::acct::window_time("--end", t, now))
        .transpose()?
        .unwrap_or(now);
    let client = Client::new(Endpoint::parse(socket), None);
    let r: Report = client
        .get(&format!("/v1/report?since={since}&until={until}"))
        .await?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&r)?);
        return Ok(0);
    }
    println!(
        "Usage from {} to {}",
        output::time(Some(r.since)),
        output::time(Some(r.until))
    );
    let pct = |x: Option<f64>| {
        x.map(|v| format!("{:.1}%", v * 100.0))
            .unwrap_or("-".into())
    };
    println!(
        "Cluster: {:.1} CPU-hours ({} of {} CPUs' time), {:.1} GPU-hours ({} of {} GPUs'), {} runs",
        r.total.cpu_hours,
        pct(r.cpu_utilization()),
        r.capacity_cpus,
        r.total.gpu_hours,
        pct(r.gpu_utilization()),
        r.capacity_gpus,
        r.total.jobs
    );
    for (title, rows, limit) in [
        ("ACCOUNT", &r.accounts, usize::MAX),
        ("ACCOUNT/USER", &r.users, args.top),
        ("PARTITION", &r.partitions, usize::MAX),
    ] {
        println!();
        table(title, rows, limit);
    }
    Ok(0)
}

fn table(title: &str, rows: &[UsageRow], limit: usize) {
    // Runs, not jobs: each run of a requeued job counts. Billing in billing-hours (its
    // partition's weights × hours), beside the CPU-hours it weighs (`--json`: × seconds).
    let mut t = output::table(&[title, "RUNS", "CPU-HOURS", "GPU-HOURS", "BILLING-HOURS"]);
    for r in rows.iter().take(limit) {
        t.add_row([
            r.name.clone(),
            r.jobs.to_string(),
            format!("{:.1}", r.cpu_hours),
            format!("{:.1}", r.gpu_hours),
            format!("{:.1}", r.billing / 3600.0),
        ]);
    }
    output::print_table(&t);
}

/// The first of `now`'s month, 00:00 UTC, ms.
fn month_start(now: u64) -> u64 {
    let days = (now / 86_400_000) as i64;
    let (_, _, day) = wharf_api::forms::civil_from_days(days);
    (days - i64::from(day) + 1) as u64 * 86_400_000
}

#[cfg(test)]
mod tests {
    #[test]
    fn month_start_is_the_first_at_midnight_utc() {
        // 2026-11-26T14:00Z → 2026-11-01T00:00Z.
        assert_eq!(super::month_start(1_795_701_600_000), 1_793_491_200_000);
        // 2024-03-01 itself (after a leap day).
        assert_eq!(super::month_start(1_709_251_200_000), 1_709_251_200_000);
        assert_eq!(super::month_start(1_709_337_600_000), 1_709_251_200_000);
    }
}
