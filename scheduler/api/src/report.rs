//! Usage reports (`wharf report`, Slurm's `sreport`): CPU-hours, GPU-hours and billing by
//! account, user and partition over a time window, and the cluster's utilization. Each job
//! counts for the part of its run inside the window.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::JobRecord;

/// One job's run as a report counts it.
#[derive(Debug, Clone, PartialEq)]
pub struct Run {
    /// Account charged.
    pub account: String,
    /// Owner.
    pub user: String,
    /// Partition.
    pub partition: String,
    /// Started, ms since the epoch.
    pub start: u64,
    /// Ended (or now, while it runs), ms.
    pub end: u64,
    /// CPUs held.
    pub cpus: u32,
    /// GPUs held.
    pub gpus: u32,
    /// Memory held, bytes.
    pub memory: u64,
    /// Billing weights of its partition: per CPU, per GiB of memory, per GPU, per second.
    pub billing: [f64; 3],
}

impl Run {
    /// The run of a job that started, ending at `now` while it has not; `None` for a job that
    /// never ran.
    pub fn of(
        job: &JobRecord,
        account: String,
        partition: String,
        billing: [f64; 3],
        now: u64,
    ) -> Option<Run> {
        let start = job.start_time?;
        // Resources are per node: a gang held them on every one of its nodes.
        let nodes = job.node_count();
        Some(Run {
            account,
            user: job.owner.user.clone(),
            partition,
            start,
            end: job.end_time.unwrap_or(now).max(start),
            cpus: job.resources.cpus * nodes,
            gpus: job.resources.gpus * nodes,
            memory: job.resources.memory * u64::from(nodes),
            billing,
        })
    }
}

/// How many ms of a run from `start` to `end` lie inside `[since, until)`; `None` when a
/// report leaves the run out (a run of no length counts, for nothing, when it lies inside).
pub fn ms_inside(start: u64, end: u64, since: u64, until: u64) -> Option<u64> {
    let (from, to) = (start.max(since), end.min(until));
    if to <= from && !(start == end && since <= start && start < until) {
        return None;
    }
    Some(to.saturating_sub(from))
}

/// Usage of one (account, user, partition) over a window, summed: what the ledger's
/// aggregation returns.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Group {
    /// Account charged.
    pub account: String,
    /// User.
    pub user: String,
    /// Partition.
    pub partition: String,
    /// Runs that overlap the window.
    pub runs: u64,
    /// CPU-milliseconds held inside the window.
    pub cpu_ms: u64,
    /// GPU-milliseconds held inside the window.
    pub gpu_ms: u64,
    /// Billing units inside the window.
    pub billing: f64,
}

impl Run {
    /// The part of this run inside `[since, until)`, as a group of one; `None` when none of
    /// it is (a run of no length counts when it lies inside).
    pub fn inside(&self, since: u64, until: u64) -> Option<Group> {
        let ms = ms_inside(self.start, self.end, since, until)?;
        let gib = self.memory as f64 / f64::from(1u32 << 30);
        let rate = f64::from(self.cpus) * self.billing[0]
            + gib * self.billing[1]
            + f64::from(self.gpus) * self.billing[2];
        Some(Group {
            account: self.account.clone(),
            user: self.user.clone(),
            partition: self.partition.clone(),
            runs: 1,
            cpu_ms: u64::from(self.cpus) * ms,
            gpu_ms: u64::from(self.gpus) * ms,
            billing: rate * ms as f64 / 1000.0,
        })
    }
}

/// Usage of one account, user or partition.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct UsageRow {
    /// Account, user (`account/user` in the users list) or partition.
    pub name: String,
    /// Jobs that ran in the window.
    pub jobs: u64,
    /// CPU-hours held.
    pub cpu_hours: f64,
    /// GPU-hours held.
    pub gpu_hours: f64,
    /// Billing units (the partition's weights × seconds).
    pub billing: f64,
}

/// A report over `[since, until)`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// Window start, ms since the epoch.
    pub since: u64,
    /// Window end, ms.
    pub until: u64,
    /// Every job together.
    pub total: UsageRow,
    /// CPUs and GPUs of the nodes registered now, for utilization.
    pub capacity_cpus: u64,
    /// GPUs registered now.
    pub capacity_gpus: u64,
    /// By account, most GPU-hours first (then CPU-hours).
    pub accounts: Vec<UsageRow>,
    /// By `account/user`, in the same order.
    pub users: Vec<UsageRow>,
    /// By partition.
    pub partitions: Vec<UsageRow>,
}

impl Report {
    /// Adds up `runs` over `[since, until)`.
    pub fn of(
        runs: &[Run],
        since: u64,
        until: u64,
        capacity_cpus: u64,
        capacity_gpus: u64,
    ) -> Report {
        let groups: Vec<Group> = runs.iter().filter_map(|r| r.inside(since, until)).collect();
        Report::of_groups(&groups, since, until, capacity_cpus, capacity_gpus)
    }

    /// Adds up usage already summed by (account, user, partition) over `[since, until)`.
    pub fn of_groups(
        groups: &[Group],
        since: u64,
        until: u64,
        capacity_cpus: u64,
        capacity_gpus: u64,
    ) -> Report {
        let mut accounts: BTreeMap<String, UsageRow> = BTreeMap::new();
        let mut users: BTreeMap<String, UsageRow> = BTreeMap::new();
        let mut partitions: BTreeMap<String, UsageRow> = BTreeMap::new();
        let mut total = UsageRow {
            name: "total".into(),
            ..UsageRow::default()
        };
        for g in groups {
            let add = |row: &mut UsageRow| {
                row.jobs += g.runs;
                row.cpu_hours += g.cpu_ms as f64 / 3_600_000.0;
                row.gpu_hours += g.gpu_ms as f64 / 3_600_000.0;
                row.billing += g.billing;
            };
            add(&mut total);
            for (map, key) in [
                (&mut accounts, g.account.clone()),
                (&mut users, format!("{}/{}", g.account, g.user)),
                (&mut partitions, g.partition.clone()),
            ] {
                add(map.entry(key.clone()).or_insert_with(|| UsageRow {
                    name: key,
                    ..UsageRow::default()
                }));
            }
        }
        let ranked = |m: BTreeMap<String, UsageRow>| {
            let mut v: Vec<UsageRow> = m.into_values().collect();
            v.sort_by(|a, b| {
                (b.gpu_hours, b.cpu_hours)
                    .partial_cmp(&(a.gpu_hours, a.cpu_hours))
                    .unwrap_or(std::cmp::Ordering::Equal)
                    .then_with(|| a.name.cmp(&b.name))
            });
            v
        };
        Report {
            since,
            until,
            total,
            capacity_cpus,
            capacity_gpus,
            accounts: ranked(accounts),
            users: ranked(users),
            partitions: ranked(partitions),
        }
    }

    /// Share of the registered CPUs' hours in the window that jobs held (0.0–1.0).
    pub fn cpu_utilization(&self) -> Option<f64> {
        let hours = self.until.saturating_sub(self.since) as f64 / 3_600_000.0;
        (self.capacity_cpus > 0 && hours > 0.0)
            .then(|| self.total.cpu_hours / (self.capacity_cpus as f64 * hours))
    }

    /// Share of the registered GPUs' hours that jobs held.
    pub fn gpu_utilization(&self) -> Option<f64> {
        let hours = self.until.saturating_sub(self.since) as f64 / 3_600_000.0;
        (self.capacity_gpus > 0 && hours > 0.0)
            .then(|| self.total.gpu_hours / (self.capacity_gpus as f64 * hours))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const H: u64 = 3_600_000;

    fn run(
        account: &str,
        user: &str,
        part: &str,
        start: u64,
        end: u64,
        cpus: u32,
        gpus: u32,
    ) -> Run {
        Run {
            account: account.into(),
            user: user.into(),
            partition: part.into(),
            start,
            end,
            cpus,
            gpus,
            memory: 4 << 30,
            billing: [1.0, 0.25, 10.0],
        }
    }

    /// Three accounts, five users, hand-computed: a job across the window's start counts
    /// only its part inside; one after the window not at all; a requeued job's two runs both.
    #[test]
    fn totals_match_a_hand_computed_workload() {
        let t0 = 100 * H;
        let runs = vec![
            run("physics", "ann", "gpu", t0, t0 + 2 * H, 8, 4), // 16 CPU-h, 8 GPU-h
            run("physics", "bob", "gpu", t0 - H, t0 + H, 4, 2), // half inside: 4 CPU-h, 2 GPU-h
            run("bio", "cat", "cpu", t0 + H, t0 + 4 * H, 32, 0), // 96 CPU-h
            run("bio", "dan", "cpu", t0 + 20 * H, t0 + 21 * H, 1, 0), // after the window
            run("ml", "eve", "gpu", t0, t0 + H, 2, 8),          // 2 CPU-h, 8 GPU-h: first run
            run("ml", "eve", "gpu", t0 + 2 * H, t0 + 3 * H, 2, 8), // requeued: second run
        ];
        let r = Report::of(&runs, t0, t0 + 10 * H, 64, 16);
        assert_eq!(r.total.jobs, 5);
        assert!((r.total.cpu_hours - (16.0 + 4.0 + 96.0 + 2.0 + 2.0)).abs() < 1e-9);
        assert!((r.total.gpu_hours - (8.0 + 2.0 + 16.0)).abs() < 1e-9);
        let acc: Vec<(&str, f64, f64)> = r
            .accounts
            .iter()
            .map(|a| (a.name.as_str(), a.cpu_hours, a.gpu_hours))
            .collect();
        assert_eq!(
            acc,
            [
                ("ml", 4.0, 16.0),
                ("physics", 20.0, 10.0),
                ("bio", 96.0, 0.0)
            ]
        );
        assert_eq!(r.users[0].name, "ml/eve");
        assert_eq!(r.users[0].jobs, 2);
        // Billing: ann's job, 2 h × (8 CPUs × 1 + 4 GiB × 0.25 + 4 GPUs × 10) per second.
        let ann = r.users.iter().find(|u| u.name == "physics/ann").unwrap();
        assert!(
            (ann.billing - 7200.0 * 49.0).abs() < 1e-6,
            "{}",
            ann.billing
        );
        assert!((r.cpu_utilization().unwrap() - 120.0 / 640.0).abs() < 1e-9);
        assert!((r.gpu_utilization().unwrap() - 26.0 / 160.0).abs() < 1e-9);
        let parts: Vec<&str> = r.partitions.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(parts, ["gpu", "cpu"]);
        assert_eq!(Report::of(&[], t0, t0 + H, 0, 0).cpu_utilization(), None);
    }

    /// A gang held its resources on each of its nodes.
    #[test]
    fn a_gang_counts_every_node() {
        let owner = crate::Owner {
            uid: 1,
            gid: 1,
            user: "ann".into(),
        };
        let per_node = crate::Resources {
            cpus: 8,
            memory: 1 << 30,
            gpus: 2,
        };
        let mut job = crate::JobRecord::pending(owner, "t".into(), per_node, 60, 0);
        job.start_time = Some(0);
        job.end_time = Some(H);
        job.allocs = ["g1", "g2", "g3"]
            .iter()
            .map(|n| crate::NodeAlloc::new(n, vec![], vec![]))
            .collect();
        let run = Run::of(&job, "a".into(), "p".into(), [1.0, 0.0, 0.0], H).unwrap();
        assert_eq!((run.cpus, run.gpus, run.memory), (24, 6, 3 << 30));
        let r = Report::of(&[run], 0, H, 24, 6);
        assert!((r.total.cpu_hours - 24.0).abs() < 1e-9);
    }
}
