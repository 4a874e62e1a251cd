//! `wharf-sim`: replays a workload under FCFS, EASY and Wharf's policy and prints one table.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};

use wharf_sim::config::scheduler_file;
use wharf_sim::driver::{Knobs, Policy};
use wharf_sim::report::{outcomes_csv, render, Column, Report};
use wharf_sim::workload::{self, GpuOptions, SwfOptions, Workload};
use wharf_sim::{engine, metrics, swf};

/// Replays a workload through Wharf's scheduler core on a simulated clock.
///
/// Jobs without a time limit get `run x f`, f uniform in [1, 5) per job from the seed, rounded
/// up to a whole minute. Jobs without a user get one of --users synthetic users (Zipf weights);
/// each user belongs to one of --accounts accounts (equal shares) by a hash of seed and user.
#[derive(Debug, Parser)]
#[command(name = "wharf-sim", version)]
struct Cli {
    #[command(subcommand)]
    workload: Source,
    #[command(flatten)]
    common: Common,
}

#[derive(Debug, Args)]
struct Common {
    /// Seed for every synthetic choice (limits, owners, generated jobs).
    #[arg(long, global = true, default_value_t = 1)]
    seed: u64,
    /// Policies to compare, comma-separated.
    #[arg(
        long,
        global = true,
        value_delimiter = ',',
        default_value = "fcfs,easy,wharf"
    )]
    policy: Vec<PolicyArg>,
    /// Print JSON instead of a table.
    #[arg(long, global = true)]
    json: bool,
    /// Also write every job's submit, start and end under each policy to DIR/POLICY.csv
    /// (created if missing), for analysis beyond the table.
    #[arg(long, global = true, value_name = "DIR")]
    outcomes: Option<PathBuf>,
    /// Wharf's policy from this controller config file's `[scheduler]` section (default: the
    /// core's defaults, which are also the controller's); the flags below override it. Its
    /// partitions name real nodes, so only the default partition's billing weights are used.
    #[arg(long, global = true)]
    config: Option<PathBuf>,
    /// Wharf's policy: reservations per pass (backfill depth).
    #[arg(long, global = true)]
    reservations: Option<usize>,
    /// Wharf's policy: reservations past `--reservations` for the first blocked job of each
    /// association that holds none.
    #[arg(long, global = true)]
    assoc_reservations: Option<usize>,
    /// Wharf's policy: a job that has waited this many hours keeps its reservation.
    #[arg(long, global = true)]
    keep_reservations_after_h: Option<f64>,
    /// Wharf's policy: how many of the last pass's reservations (the first it made) may be
    /// kept.
    #[arg(long, global = true)]
    keep_reservations: Option<usize>,
    /// Wharf's policy: how many waiting jobs past the reservations get an estimated start.
    #[arg(long, global = true)]
    start_estimates: Option<usize>,
    /// Wharf's policy: age weight.
    #[arg(long, global = true)]
    weight_age: Option<u32>,
    /// Wharf's policy: fair-share weight.
    #[arg(long, global = true)]
    weight_fairshare: Option<u32>,
    /// Wharf's policy: job-size weight.
    #[arg(long, global = true)]
    weight_job_size: Option<u32>,
    /// Wharf's policy: width weight (the cube of a job's share of its partition).
    #[arg(long, global = true)]
    weight_width: Option<u32>,
    /// Wharf's policy: the job-size factor favours small jobs.
    #[arg(long, global = true)]
    favor_small: bool,
    /// Wharf's policy: usage half-life, hours.
    #[arg(long, global = true)]
    half_life_h: Option<f64>,
    /// Wharf's policy: age at which the age factor is full, hours.
    #[arg(long, global = true)]
    max_age_h: Option<f64>,
}

impl Common {
    fn knobs(&self) -> Result<Knobs> {
        let (mut c, billing) = match &self.config {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .with_context(|| format!("reading {}", path.display()))?;
                let f = scheduler_file(&text).with_context(|| format!("in {}", path.display()))?;
                (f.config, f.billing)
            }
            None => (wharf_core::Config::default(), None),
        };
        let hours = |h: f64, what: &str| -> Result<u64> {
            if !(h.is_finite() && h > 0.0) {
                bail!("--{what} must be a positive number of hours, not {h}");
            }
            Ok((h * 3_600_000.0) as u64)
        };
        if let Some(r) = self.reservations {
            if r == 0 {
                bail!("--reservations must be at least 1");
            }
            c.reservations = r;
        }
        if let Some(r) = self.assoc_reservations {
            c.assoc_reservations = r;
        }
        if let Some(h) = self.keep_reservations_after_h {
            c.keep_reservations_after = if h == 0.0 {
                0
            } else {
                hours(h, "keep-reservations-after-h")?
            };
        }
        if let Some(k) = self.keep_reservations {
            c.keep_reservations = k;
        }
        if let Some(e) = self.start_estimates {
            c.start_estimates = e;
        }
        if let Some(w) = self.weight_age {
            c.weights.age = w;
        }
        if let Some(w) = self.weight_fairshare {
            c.weights.fairshare = w;
        }
        if let Some(w) = self.weight_job_size {
            c.weights.job_size = w;
        }
        if let Some(w) = self.weight_width {
            c.weights.width = w;
        }
        c.favor_small |= self.favor_small;
        if let Some(h) = self.half_life_h {
            c.half_life = hours(h, "half-life-h")?;
        }
        if let Some(h) = self.max_age_h {
            c.max_age = hours(h, "max-age-h")?;
        }
        Ok(Knobs { config: c, billing })
    }
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum PolicyArg {
    Fcfs,
    Easy,
    Wharf,
}

impl From<PolicyArg> for Policy {
    fn from(p: PolicyArg) -> Policy {
        match p {
            PolicyArg::Fcfs => Policy::Fcfs,
            PolicyArg::Easy => Policy::Easy,
            PolicyArg::Wharf => Policy::Wharf,
        }
    }
}

#[derive(Debug, Subcommand)]
enum Source {
    /// A Standard Workload Format trace (Parallel Workloads Archive).
    Swf {
        /// The trace file.
        path: PathBuf,
        /// Accounts users are assigned to.
        #[arg(long, default_value_t = 4)]
        accounts: u32,
        /// Synthetic users, for traces without user ids.
        #[arg(long, default_value_t = 32)]
        users: u32,
        /// Processors per node; default: one node holding the whole machine.
        #[arg(long)]
        procs_per_node: Option<u32>,
        /// Replay only the first N jobs.
        #[arg(long)]
        jobs: Option<usize>,
    },
    /// A generated GPU workload: nodes of 8 GPUs, jobs of 1-8 GPUs or 2-4 whole nodes, one heavy
    /// account.
    Gpu {
        /// Nodes.
        #[arg(long, default_value_t = 16)]
        nodes: u32,
        /// Jobs.
        #[arg(long, default_value_t = 4_000)]
        jobs: usize,
        /// Accounts (account 0 submits half the work as arrays).
        #[arg(long, default_value_t = 4)]
        accounts: u32,
        /// Offered load (submitted GPU-seconds over capacity x submit span).
        #[arg(long, default_value_t = 0.9)]
        load: f64,
        /// Fraction of jobs spanning 2-4 whole nodes.
        #[arg(long, default_value_t = 0.1)]
        multi_node: f64,
    },
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    let seed = cli.common.seed;
    let w = load(&cli.workload, seed)?;
    if w.jobs.is_empty() {
        bail!("the workload has no job to replay ({} skipped)", w.skipped);
    }
    let knobs = cli.common.knobs()?;
    if let Some(dir) = &cli.common.outcomes {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("creating the --outcomes folder {}", dir.display()))?;
    }
    let mut columns = Vec::new();
    for p in &cli.common.policy {
        let policy = Policy::from(*p);
        let t0 = Instant::now();
        let replay = engine::replay_with(&w, policy, &knobs)
            .with_context(|| format!("replaying {} under {policy}", w.name))?;
        if let Some(dir) = &cli.common.outcomes {
            let path = dir.join(format!("{policy}.csv"));
            std::fs::write(&path, outcomes_csv(&w, &replay.outcomes))
                .with_context(|| format!("writing {}", path.display()))?;
        }
        columns.push(Column {
            policy,
            metrics: metrics::compute(&w, &replay.outcomes),
            never_started: replay.never_started.len() + replay.refused.len(),
            passes: replay.passes,
            reservations_dropped: replay.reservations_dropped,
            estimates: replay.estimates,
            wall_s: t0.elapsed().as_secs_f64(),
        });
    }
    let report = Report {
        workload: w.name.clone(),
        seed,
        jobs: w.jobs.len(),
        skipped: w.skipped,
        columns,
    };
    if cli.common.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", render(&report));
    }
    Ok(())
}

fn load(source: &Source, seed: u64) -> Result<Workload> {
    match source {
        Source::Swf {
            path,
            accounts,
            users,
            procs_per_node,
            jobs,
        } => {
            if *accounts == 0 || *users == 0 {
                bail!("--accounts and --users must be at least 1");
            }
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading trace {}", path.display()))?;
            let trace =
                swf::parse(&text).with_context(|| format!("parsing trace {}", path.display()))?;
            let name = path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            Ok(workload::from_swf(
                &format!("{name} (SWF, {accounts} accounts, {users} users)"),
                &trace,
                &SwfOptions {
                    seed,
                    accounts: *accounts,
                    users: *users,
                    procs_per_node: *procs_per_node,
                    limit_jobs: *jobs,
                    ..SwfOptions::default()
                },
            ))
        }
        Source::Gpu {
            nodes,
            jobs,
            accounts,
            load,
            multi_node,
        } => {
            if *accounts < 2 || *nodes == 0 || !(0.0..=1.0).contains(multi_node) || *load <= 0.0 {
                bail!("need --accounts >= 2, --nodes >= 1, --load > 0 and --multi-node in [0, 1]");
            }
            Ok(workload::gpu_synthetic(&GpuOptions {
                seed,
                nodes: *nodes,
                jobs: *jobs,
                accounts: *accounts,
                load: *load,
                multi_node: *multi_node,
            }))
        }
    }
}
