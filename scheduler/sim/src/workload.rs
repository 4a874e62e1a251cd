//! Workloads to replay: jobs with a shape, a run time, a time limit and an owner, and the nodes
//! they run on. Built from an SWF trace or generated (GPU jobs from several accounts).
//!
//! Rules for what a trace lacks (both stated in the CLI's help and in scheduler/sim/traces/README.md):
//! - **Time limit.** A trace's requested time (field 9) when known. Otherwise
//!   `run × f`, `f` uniform in `[1, 5)` drawn per job from the seed, rounded up to a whole minute
//!   (users ask for minutes), at least one minute. A job never runs past its limit (the
//!   controller kills it there), so its run is `min(run, limit)`.
//! - **Owner.** A trace's user id when known. Otherwise one of `users` synthetic users, drawn
//!   with Zipf weights `1/(rank+1)` (a few heavy users, as in every archive trace). A user
//!   belongs to account `mix(seed ^ user) mod accounts`, so the mapping does not depend on the
//!   order of draws.

use wharf_api::{JobId, Resources};

use crate::rng::{mix, SplitMix64};
use crate::swf::SwfTrace;

/// Milliseconds per second (the core's clock is in ms).
pub const MS: u64 = 1_000;

/// One job to replay.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimJob {
    /// Job id (unique in the workload).
    pub id: JobId,
    /// Submit time, ms.
    pub submit: u64,
    /// How long it runs once started, ms (never past `limit`).
    pub run: u64,
    /// Its time limit, ms.
    pub limit: u64,
    /// Nodes it spans.
    pub nodes: u32,
    /// What it needs on each of them.
    pub per_node: Resources,
    /// Owner (a user index).
    pub user: u32,
    /// Account index, into [`Workload::accounts`].
    pub account: u32,
    /// Partition index, into [`Workload::partitions`]; `None`: the default partition.
    pub partition: Option<u32>,
}

impl SimJob {
    /// CPUs over all its nodes.
    pub fn total_cpus(&self) -> u64 {
        self.per_node.cpus as u64 * self.nodes as u64
    }

    /// GPUs over all its nodes.
    pub fn total_gpus(&self) -> u64 {
        self.per_node.gpus as u64 * self.nodes as u64
    }
}

/// An account and its fair-share weight.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Account {
    /// Name.
    pub name: String,
    /// Shares (relative to its siblings).
    pub shares: u32,
}

/// A node of the simulated cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimNodeSpec {
    /// Name.
    pub name: String,
    /// Capacity.
    pub capacity: Resources,
}

/// Which resource utilization is measured on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Measure {
    /// Processor-seconds (SWF traces).
    Cpus,
    /// GPU-seconds (GPU workloads).
    Gpus,
}

/// A workload: nodes, accounts and jobs sorted by submit time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Workload {
    /// A short description.
    pub name: String,
    /// The cluster.
    pub nodes: Vec<SimNodeSpec>,
    /// Accounts.
    pub accounts: Vec<Account>,
    /// Partitions: name and node names (empty: every node is in one default partition).
    pub partitions: Vec<(String, Vec<String>)>,
    /// Jobs, by submit time then id.
    pub jobs: Vec<SimJob>,
    /// The resource utilization is measured on.
    pub measure: Measure,
    /// Trace jobs left out, with why (no run time, no processors, larger than the machine).
    pub skipped: usize,
}

/// How to turn an SWF trace into a workload.
#[derive(Debug, Clone)]
pub struct SwfOptions {
    /// Seed for limits and owners.
    pub seed: u64,
    /// Accounts to assign users to.
    pub accounts: u32,
    /// Synthetic users when the trace has none.
    pub users: u32,
    /// Processors per node; `None`: one node holding the whole machine (the processor-count
    /// model EASY was defined on).
    pub procs_per_node: Option<u32>,
    /// Memory per node, bytes (jobs ask for none; SWF memory fields are too sparse to use).
    pub node_memory: u64,
    /// Keep only the first `limit_jobs` jobs.
    pub limit_jobs: Option<usize>,
}

impl Default for SwfOptions {
    fn default() -> Self {
        SwfOptions {
            seed: 1,
            accounts: 4,
            users: 32,
            procs_per_node: None,
            node_memory: 1 << 40,
            limit_jobs: None,
        }
    }
}

/// The rule for a missing time limit: `run × f`, `f` in `[1, 5)`, up to a whole minute.
pub fn synthetic_limit(run_s: u64, rng: &mut SplitMix64) -> u64 {
    let f = rng.range_f64(1.0, 5.0);
    let secs = (run_s as f64 * f).ceil() as u64;
    secs.div_ceil(60).max(1) * 60
}

/// A user's account: a hash of seed and user, so independent of the order of draws.
pub fn account_of(seed: u64, user: u64, accounts: u32) -> u32 {
    (mix(seed ^ mix(user.wrapping_add(1))) % accounts.max(1) as u64) as u32
}

/// Builds a workload from a parsed trace.
pub fn from_swf(name: &str, trace: &SwfTrace, opt: &SwfOptions) -> Workload {
    let machine = trace
        .header
        .machine_procs()
        .or_else(|| trace.jobs.iter().filter_map(|j| j.procs()).max())
        .unwrap_or(1)
        .min(u32::MAX as u64) as u32;
    let ppn = opt
        .procs_per_node
        .unwrap_or(machine)
        .clamp(1, machine.max(1));
    let node_count = machine.div_ceil(ppn);
    let nodes = (0..node_count)
        .map(|i| SimNodeSpec {
            name: format!("n{i:05}"),
            capacity: Resources {
                cpus: ppn,
                memory: opt.node_memory,
                gpus: 0,
            },
        })
        .collect();
    let mut rng = SplitMix64::new(opt.seed);
    let zipf: Vec<f64> = (0..opt.users.max(1))
        .map(|r| 1.0 / (r as f64 + 1.0))
        .collect();
    let mut jobs = Vec::new();
    let mut skipped = 0;
    for j in &trace.jobs {
        if opt.limit_jobs.is_some_and(|n| jobs.len() >= n) {
            break;
        }
        // Draw for every job, kept or not, so one job's fate never shifts another's values.
        let limit_draw = rng.next_u64();
        let user_draw = rng.weighted(&zipf) as u64;
        let (Some(run), Some(procs)) = (j.run_time, j.procs()) else {
            skipped += 1;
            continue;
        };
        if procs == 0 || procs > machine as u64 {
            skipped += 1;
            continue;
        }
        let limit_s = match j.requested_time {
            Some(r) if r > 0 => r,
            _ => synthetic_limit(run, &mut SplitMix64::new(limit_draw)),
        };
        let user = j.user.unwrap_or(user_draw);
        let procs = procs as u32;
        let span = procs.div_ceil(ppn);
        jobs.push(SimJob {
            id: j.id,
            submit: j.submit_time * MS,
            run: run.min(limit_s) * MS,
            limit: limit_s * MS,
            nodes: span,
            per_node: Resources {
                cpus: procs.div_ceil(span),
                memory: 0,
                gpus: 0,
            },
            user: user.min(u32::MAX as u64) as u32,
            account: account_of(opt.seed, user, opt.accounts),
            partition: None,
        });
    }
    jobs.sort_by_key(|j| (j.submit, j.id));
    Workload {
        name: name.into(),
        nodes,
        partitions: Vec::new(),
        accounts: equal_accounts(opt.accounts),
        jobs,
        measure: Measure::Cpus,
        skipped,
    }
}

fn equal_accounts(n: u32) -> Vec<Account> {
    (0..n.max(1))
        .map(|i| Account {
            name: format!("acct{i}"),
            shares: 1,
        })
        .collect()
}

/// How to generate a GPU workload.
#[derive(Debug, Clone)]
pub struct GpuOptions {
    /// Seed.
    pub seed: u64,
    /// Nodes, each with 8 GPUs, 64 CPUs and 512 GiB.
    pub nodes: u32,
    /// Jobs to generate.
    pub jobs: usize,
    /// Accounts (equal shares). Account 0 is the heavy one: it submits half the work as
    /// bursts of identical array tasks; the rest submit single jobs.
    pub accounts: u32,
    /// Offered load: submitted GPU-seconds over (GPUs × submit span).
    pub load: f64,
    /// Fraction of jobs that span 2–4 whole nodes (needs a core that places multi-node jobs).
    pub multi_node: f64,
}

impl Default for GpuOptions {
    fn default() -> Self {
        GpuOptions {
            seed: 1,
            nodes: 16,
            jobs: 4_000,
            accounts: 4,
            load: 0.9,
            multi_node: 0.1,
        }
    }
}

/// GPUs, CPUs and memory of one generated node.
pub const GPU_NODE: Resources = Resources {
    cpus: 64,
    memory: 512 << 30,
    gpus: 8,
};

/// Generates a GPU workload: nodes of 8 GPUs, jobs asking 1, 2, 4 or 8 GPUs (8 CPUs and 64 GiB
/// per GPU) or, with `multi_node`, 2–4 whole nodes; run times log-uniform from 1 minute to 8
/// hours; limits by [`synthetic_limit`]; arrivals Poisson, scaled so the offered load is `load`.
pub fn gpu_synthetic(opt: &GpuOptions) -> Workload {
    let mut rng = SplitMix64::new(opt.seed);
    let accounts = opt.accounts.max(2);
    let nodes: Vec<SimNodeSpec> = (0..opt.nodes.max(1))
        .map(|i| SimNodeSpec {
            name: format!("gpu{i:05}"),
            capacity: GPU_NODE,
        })
        .collect();
    // Submissions: (account, shape, run, count). The heavy account submits arrays.
    struct Batch {
        account: u32,
        nodes: u32,
        gpus: u32,
        run_s: u64,
        count: usize,
    }
    let mut batches = Vec::new();
    let mut n = 0;
    while n < opt.jobs {
        let heavy = rng.unit() < 0.5;
        let account = if heavy {
            0
        } else {
            1 + rng.below(accounts as u64 - 1) as u32
        };
        let (nodes_n, gpus) = if rng.unit() < opt.multi_node {
            (2 + rng.below(3) as u32, 8)
        } else {
            (1, [1, 1, 2, 2, 4, 8][rng.below(6) as usize])
        };
        let run_s = (60.0 * 480f64.powf(rng.unit())).round() as u64;
        let count = if heavy {
            10 + rng.below(31) as usize
        } else {
            1
        };
        let count = count.min(opt.jobs - n);
        n += count;
        batches.push(Batch {
            account,
            nodes: nodes_n,
            gpus,
            run_s,
            count,
        });
    }
    let work: f64 = batches
        .iter()
        .map(|b| (b.run_s * b.gpus as u64 * b.nodes as u64 * b.count as u64) as f64)
        .sum();
    let gpus_total = nodes.len() as f64 * GPU_NODE.gpus as f64;
    let span_s = work / (opt.load.max(0.01) * gpus_total);
    let mean_gap = span_s / batches.len().max(1) as f64;
    let mut t = 0.0;
    let mut jobs = Vec::with_capacity(opt.jobs);
    for b in batches {
        t += rng.exponential(mean_gap);
        let limit = synthetic_limit(b.run_s, &mut rng);
        // Users: four per account, so per-user limits have something to act on.
        let user = b.account * 4 + rng.below(4) as u32;
        for _ in 0..b.count {
            jobs.push(SimJob {
                id: jobs.len() as JobId + 1,
                submit: (t * MS as f64) as u64,
                run: b.run_s * MS,
                limit: limit * MS,
                nodes: b.nodes,
                per_node: Resources {
                    cpus: 8 * b.gpus,
                    memory: (64 << 30) * b.gpus as u64,
                    gpus: b.gpus,
                },
                user,
                account: b.account,
                partition: None,
            });
        }
    }
    Workload {
        name: format!(
            "gpu-synthetic ({} nodes x 8 GPUs, {} jobs, {} accounts, load {})",
            nodes.len(),
            jobs.len(),
            accounts,
            opt.load
        ),
        nodes,
        partitions: Vec::new(),
        accounts: equal_accounts(accounts),
        jobs,
        measure: Measure::Gpus,
        skipped: 0,
    }
}

/// How to generate a deep backlog for the `sched` benchmark.
#[derive(Debug, Clone)]
pub struct BacklogOptions {
    /// Seed.
    pub seed: u64,
    /// Nodes of 8 GPUs.
    pub nodes: u32,
    /// Jobs (array tasks count one each).
    pub jobs: usize,
    /// Accounts, equal shares.
    pub accounts: u32,
}

/// Partitions of [`array_backlog`]: `all` and four quarters.
pub const BACKLOG_PARTITIONS: u32 = 5;

/// A backlog submitted at once: arrays of 10–1,000 identical tasks (1, 2, 4 or 8 GPUs, runs
/// log-uniform from 5 minutes to 4 hours), owners spread over `accounts`, each array in one of
/// [`BACKLOG_PARTITIONS`] partitions, submits 1 ms apart
/// per array so submit order is defined.
pub fn array_backlog(opt: &BacklogOptions) -> Workload {
    let mut rng = SplitMix64::new(opt.seed);
    let nodes: Vec<SimNodeSpec> = (0..opt.nodes.max(1))
        .map(|i| SimNodeSpec {
            name: format!("gpu{i:05}"),
            capacity: GPU_NODE,
        })
        .collect();
    let accounts = opt.accounts.max(1);
    // `all` holds every node; the other four each hold a quarter (a node is in two).
    let quarter = nodes.len().div_ceil(4);
    let mut partitions = vec![(
        "all".to_string(),
        nodes.iter().map(|n| n.name.clone()).collect::<Vec<_>>(),
    )];
    for (q, chunk) in nodes.chunks(quarter.max(1)).enumerate() {
        partitions.push((
            format!("q{q}"),
            chunk.iter().map(|n| n.name.clone()).collect(),
        ));
    }
    let mut jobs = Vec::with_capacity(opt.jobs);
    let mut array = 0u64;
    while jobs.len() < opt.jobs {
        let count = ((10.0 * 100f64.powf(rng.unit())) as usize).min(opt.jobs - jobs.len());
        let gpus = [1, 1, 2, 4, 8][rng.below(5) as usize];
        let run_s = (300.0 * 48f64.powf(rng.unit())).round() as u64;
        let limit = synthetic_limit(run_s, &mut rng);
        let account = rng.below(accounts as u64) as u32;
        let user = account * 4 + rng.below(4) as u32;
        let partition = rng.below(BACKLOG_PARTITIONS as u64) as u32;
        for _ in 0..count {
            jobs.push(SimJob {
                id: jobs.len() as JobId + 1,
                submit: array,
                run: run_s * MS,
                limit: limit * MS,
                nodes: 1,
                per_node: Resources {
                    cpus: 8 * gpus,
                    memory: (64 << 30) * gpus as u64,
                    gpus,
                },
                user,
                account,
                partition: Some(partition),
            });
        }
        array += 1;
    }
    Workload {
        name: format!(
            "array backlog ({} nodes x 8 GPUs, {} jobs, {} accounts)",
            nodes.len(),
            jobs.len(),
            accounts
        ),
        nodes,
        partitions,
        accounts: equal_accounts(accounts),
        jobs,
        measure: Measure::Gpus,
        skipped: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limit_rule() {
        let mut r = SplitMix64::new(3);
        for run in [0, 1, 59, 60, 61, 3_600, 100_000] {
            let l = synthetic_limit(run, &mut r);
            assert!(
                l >= run && l <= (5 * run).div_ceil(60).max(1) * 60,
                "{run} -> {l}"
            );
            assert_eq!(l % 60, 0);
        }
    }

    #[test]
    fn lublin_like_trace() {
        let t = crate::swf::parse(
            "; MaxNodes: 8\n\
             1 0 -1 100 4 -1 -1 -1 -1 -1 1 -1 -1 -1 0 -1 -1 -1\n\
             2 5 -1 -1 4 -1 -1 -1 -1 -1 5 -1 -1 -1 0 -1 -1 -1\n\
             3 9 -1 50 16 -1 -1 -1 -1 -1 1 -1 -1 -1 0 -1 -1 -1\n\
             4 9 -1 50 2 -1 -1 -1 30 -1 1 7 -1 -1 0 -1 -1 -1\n",
        )
        .unwrap();
        let w = from_swf("t", &t, &SwfOptions::default());
        assert_eq!(w.nodes.len(), 1);
        assert_eq!(w.nodes[0].capacity.cpus, 8);
        assert_eq!(w.skipped, 2); // no run time; wider than the machine
        assert_eq!(w.jobs.len(), 2);
        assert!(w.jobs[0].limit >= 100 * MS);
        // A requested time is used as the limit, and the job is killed there.
        assert_eq!((w.jobs[1].limit, w.jobs[1].run), (30 * MS, 30 * MS));
        assert_eq!(w.jobs[1].user, 7);
    }

    #[test]
    fn gpu_workload_has_the_asked_shape() {
        let w = gpu_synthetic(&GpuOptions {
            jobs: 500,
            ..GpuOptions::default()
        });
        assert_eq!(w.jobs.len(), 500);
        assert!(w.jobs.windows(2).all(|p| p[0].submit <= p[1].submit));
        assert!(w.jobs.iter().all(|j| (1..=8).contains(&j.per_node.gpus)));
        let accounts: std::collections::BTreeSet<u32> = w.jobs.iter().map(|j| j.account).collect();
        assert_eq!(accounts.len(), 4);
    }
}
