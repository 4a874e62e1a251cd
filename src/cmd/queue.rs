//! `wharf queue`.

use anyhow::Result;
use wharf_api::resources::{format_duration, format_memory};
use wharf_api::wire::{JobList, WhoAmI};
use wharf_api::{JobRecord, JobState};
use wharf_client::{Client, Endpoint};

use crate::output;

/// Arguments.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Include recently ended jobs (up to --limit).
    #[arg(short, long)]
    all: bool,
    /// How many ended jobs --all shows.
    #[arg(long, default_value_t = 50)]
    limit: u32,
    /// Only my jobs.
    #[arg(long)]
    me: bool,
    /// Only jobs in these states (e.g. running,pending).
    #[arg(long, value_delimiter = ',')]
    state: Vec<String>,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

/// Fetches jobs as the CLI shows them; `brief` leaves their specs out.
pub async fn fetch(
    client: &Client,
    finished: u32,
    me: bool,
    brief: bool,
) -> Result<Vec<JobRecord>> {
    let mut path = format!("/v1/jobs?finished={finished}&brief={brief}");
    if me {
        let who: WhoAmI = client.get("/v1/whoami").await?;
        path.push_str(&format!("&user={}", who.owner.uid));
    }
    Ok(client.get::<JobList>(&path).await?.jobs)
}

/// Runs the command.
pub async fn run(socket: &str, args: Args) -> Result<i32> {
    let client = Client::new(Endpoint::parse(socket), None);
    let mut states = Vec::new();
    for s in &args.state {
        states.push(JobState::parse(s).ok_or_else(|| {
            anyhow::anyhow!(
                "unknown state {s:?}; use one of {}",
                JobState::ALL.map(|s| s.as_str()).join(", ")
            )
        })?);
    }
    // The table shows no part of a spec; --json gives the whole records.
    let finished = if args.all { args.limit } else { 0 };
    let mut jobs = fetch(&client, finished, args.me, !args.json).await?;
    jobs.retain(|j| states.is_empty() || states.contains(&j.state));
    if args.json {
        println!("{}", serde_json::to_string_pretty(&JobList { jobs })?);
        return Ok(0);
    }
    let now = wharf_controller::now_ms();
    let mut t = output::table(&[
        "JOBID",
        "NAME",
        "USER",
        "STATE",
        "TIME",
        "LIMIT",
        "CPUS",
        "MEM",
        "GPUS",
        "NODES",
        "NODELIST(REASON)",
    ]);
    for j in &jobs {
        let where_ = match j.state {
            JobState::Pending => {
                let code = j
                    .reason
                    .as_deref()
                    .and_then(|r| r.split(':').next())
                    .unwrap_or("");
                match j.expected_start {
                    // Slurm's `squeue --start`, in one column.
                    Some(at) => format!(
                        "{code}, starts in {}",
                        format_duration(at.saturating_sub(now) / 1000)
                    ),
                    None => code.to_string(),
                }
            }
            _ if j.allocs.is_empty() => "-".into(),
            // How far its image's pull has come, on the node that is furthest behind.
            JobState::Starting if !j.pulling.is_empty() => {
                let behind = j
                    .pulling
                    .iter()
                    .min_by_key(|p| (p.layers_done, p.bytes_done));
                match behind {
                    Some(p) => format!("{} (pulling: {})", j.nodelist(), p.counts()),
                    None => j.nodelist(),
                }
            }
            _ => j.nodelist(),
        };
        t.add_row(vec![
            j.array.map_or_else(|| j.id.to_string(), |a| a.label()),
            j.name.chars().take(20).collect(),
            j.owner.user.clone(),
            j.state.to_string(),
            format_duration(j.elapsed_ms(now) / 1000),
            format_duration(j.time_limit),
            j.resources.cpus.to_string(),
            format_memory(j.resources.memory),
            j.resources.gpus.to_string(),
            j.node_count().to_string(),
            where_,
        ]);
    }
    output::print_table(&t);
    Ok(0)
}
