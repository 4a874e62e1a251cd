//! Accounting limits, as Slurm's QoS and association limits: how much one user or one group
//! of jobs may hold at once, and how many jobs they may have.
//!
//! A pass counts what running jobs hold per scope (a QoS's user, a whole QoS, an association,
//! an account with every job below it in the tree) and starts a job only when [`Counters::fits`]
//! says no scope would go over; a job that would waits with a [`LimitReason`], blocks nobody
//! and gets no reservation (as in Slurm). Admission uses [`never_fits`] (a job over a limit on
//! its own could never run) and [`submit_fits`] (MaxSubmitJobs).
//!
//! ```
//! use wharf_core::{schedule, Assoc, Config, Node, PendingJob, QosLimits, Request, State, TresLimit};
//!
//! let mut config = Config::default();
//! config.limits.qos.insert(
//!     "normal".into(),
//!     QosLimits { max_tres_per_user: TresLimit { gpu: Some(4), ..TresLimit::default() }, ..QosLimits::default() },
//! );
//! let job = |id| {
//!     let mut j = PendingJob::new(id, Assoc::new("lab", "ann"), Request::per_node(1, 1 << 30, 4), 0);
//!     j.qos = Some("normal".into());
//!     j
//! };
//! let node = Node::new("n1", 8, 64 << 30, Node::numbered_gpus(8, "h100"));
//! let state = State { nodes: vec![node], pending: vec![job(1), job(2)], ..State::default() };
//! let plan = schedule(0, &state, &config);
//! assert_eq!(plan.starts.len(), 1);
//! assert_eq!(plan.waiting[0].reason.code(), "QOSMaxGRESPerUser");
//! ```

mod budget;

use std::collections::BTreeMap;

pub use budget::{format_utc, BudgetPeriod, BudgetTres, BudgetUsage, TresMins, TresMinutes};
pub use wharf_api::pending::{LimitReason, TresKind};

use crate::config::Config;
use crate::state::{Alloc, Assoc, PendingJob, RunningJob, Time};

/// A cap per TRES; `None` is no cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TresLimit {
    /// CPUs.
    pub cpu: Option<u64>,
    /// Memory, bytes.
    pub mem: Option<u64>,
    /// GPUs (of any type).
    pub gpu: Option<u64>,
}

impl TresLimit {
    /// True when no TRES is capped.
    pub fn is_empty(&self) -> bool {
        self.cpu.is_none() && self.mem.is_none() && self.gpu.is_none()
    }

    /// The first TRES on which `in_use + asks` goes over the cap.
    fn over(&self, in_use: &Amount, asks: &Amount) -> Option<(TresKind, u64, u64, u64)> {
        [
            (TresKind::Cpu, self.cpu, in_use.cpu, asks.cpu),
            (TresKind::Gpu, self.gpu, in_use.gpu, asks.gpu),
            (TresKind::Mem, self.mem, in_use.mem, asks.mem),
        ]
        .into_iter()
        .find_map(|(kind, cap, used, asks)| {
            cap.filter(|&c| asks > 0 && used.saturating_add(asks) > c)
                .map(|c| (kind, c, used, asks))
        })
    }
}

/// Limits of one QoS (Slurm's `sacctmgr add qos ... MaxTRESPerUser=...`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct QosLimits {
    /// Most TRES one user's running jobs in this QoS may hold together (MaxTRESPerUser).
    pub max_tres_per_user: TresLimit,
    /// Most running jobs per user (MaxJobsPerUser).
    pub max_jobs_per_user: Option<u64>,
    /// Most pending + running jobs per user, enforced at submit (MaxSubmitJobsPerUser).
    pub max_submit_jobs_per_user: Option<u64>,
    /// Longest time limit, ms (MaxWall).
    pub max_wall: Option<Time>,
    /// Most TRES all running jobs in this QoS may hold together (GrpTRES).
    pub grp_tres: TresLimit,
    /// Most running jobs in this QoS (GrpJobs).
    pub grp_jobs: Option<u64>,
    /// QoS whose jobs this one may preempt.
    pub preempt: Vec<String>,
    /// What happens to this QoS's running jobs when a job of a QoS that lists it in
    /// `preempt` needs their resources; `None` is requeue (the default).
    pub preempt_mode: Option<crate::config::PreemptMode>,
}

/// Limits of an association: an account (Grp limits count every job below it in the tree;
/// Max limits apply to each user in it that sets none) or one user in one account.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AssocLimits {
    /// Most TRES its running jobs may hold together (GrpTRES).
    pub grp_tres: TresLimit,
    /// Most running jobs together (GrpJobs).
    pub grp_jobs: Option<u64>,
    /// Most running jobs of one user association (MaxJobs).
    pub max_jobs: Option<u64>,
    /// Most pending + running jobs of one user association, at submit (MaxSubmitJobs).
    pub max_submit_jobs: Option<u64>,
    /// Most TRES one job may ask for (MaxTRESPerJob).
    pub max_tres_per_job: TresLimit,
    /// Budget per period, TRES-minutes of all its jobs together (GrpTRESMins): ended runs,
    /// running jobs' whole time limits and the job to start must fit (see [`BudgetUsage`]).
    pub grp_tres_mins: TresMins,
    /// The QoS its users may name; `None`: its parent account's (see
    /// [`crate::cycle::allowed_qos`]).
    pub qos: Option<Vec<String>>,
}

/// Every configured limit. Empty: nothing is limited (the pass skips all counting).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Limits {
    /// Per QoS name.
    pub qos: BTreeMap<String, QosLimits>,
    /// Per account name.
    pub accounts: BTreeMap<String, AssocLimits>,
    /// Per user association (account, user).
    pub users: BTreeMap<Assoc, AssocLimits>,
    /// QoS of jobs that name none (Slurm's DefaultQOS), so that leaving `--qos` out does not
    /// escape QoS limits. The caller applies it when building [`crate::PendingJob::qos`] and
    /// [`crate::RunningJob::qos`].
    pub default_qos: Option<String>,
}

impl Limits {
    /// True when an account or a user association has a budget (GrpTRESMins).
    pub fn has_budgets(&self) -> bool {
        self.accounts.values().any(|l| !l.grp_tres_mins.is_empty())
            || self.users.values().any(|l| !l.grp_tres_mins.is_empty())
    }
}

impl Limits {
    /// True when nothing is limited.
    pub fn is_empty(&self) -> bool {
        self.qos.is_empty()
            && self.accounts.is_empty()
            && self.users.is_empty()
            && self.default_qos.is_none()
    }
}

/// TRES held or asked for, over all nodes of a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct Amount {
    cpu: u64,
    mem: u64,
    gpu: u64,
}

impl Amount {
    fn of_pending(job: &PendingJob) -> Amount {
        let n = u64::from(job.request.node_count());
        Amount {
            cpu: n * u64::from(job.request.cpus),
            mem: n.saturating_mul(job.request.memory),
            gpu: n * u64::from(job.request.gpus),
        }
    }

    fn of_allocs(allocs: &[Alloc]) -> Amount {
        allocs.iter().fold(Amount::default(), |a, x| Amount {
            cpu: a.cpu + x.cpu_ids.len() as u64,
            mem: a.mem.saturating_add(x.memory),
            gpu: a.gpu + x.gpu_ids.len() as u64,
        })
    }

    fn add(&mut self, o: &Amount) {
        self.cpu += o.cpu;
        self.mem = self.mem.saturating_add(o.mem);
        self.gpu += o.gpu;
    }

    /// TRES-minutes of holding this for `ms` in `partition` (its billing weights).
    fn minutes(&self, config: &Config, partition: Option<&str>, ms: Time) -> TresMinutes {
        let rate = config
            .billing_for(partition)
            .rate(self.cpu, self.mem, self.gpu);
        TresMinutes::held(self.cpu, self.gpu, rate, ms)
    }
}

/// Jobs and TRES held in one scope.
#[derive(Debug, Clone, Copy, Default)]
struct Held {
    jobs: u64,
    tres: Amount,
}

impl Held {
    fn add(&mut self, a: &Amount) {
        self.jobs += 1;
        self.tres.add(a);
    }
}

/// The account and its ancestors, nearest first (an unknown account is its own root).
pub(crate) fn lineage<'a>(config: &'a Config, account: &'a str) -> Vec<&'a str> {
    let mut out = vec![account];
    let mut at = account;
    // Bounded by the number of accounts, so a cycle in a hand-built config cannot loop.
    for _ in 0..config.accounts.len() {
        let parent = config
            .accounts
            .iter()
            .find(|a| a.name == at)
            .and_then(|a| a.parent.as_deref());
        match parent {
            Some(p) if !out.contains(&p) => {
                out.push(p);
                at = p;
            }
            _ => break,
        }
    }
    out
}

/// The Max* limit that applies to a user association: its own, else its account's, else the
/// nearest ancestor's that sets it (Slurm's inheritance).
fn inherited<T: Copy>(
    config: &Config,
    assoc: &Assoc,
    pick: impl Fn(&AssocLimits) -> Option<T>,
) -> Option<(T, String)> {
    let limits = &config.limits;
    if let Some(v) = limits.users.get(assoc).and_then(&pick) {
        return Some((v, user_label(assoc)));
    }
    lineage(config, &assoc.account).into_iter().find_map(|a| {
        limits
            .accounts
            .get(a)
            .and_then(&pick)
            .map(|v| (v, format!("account {a}")))
    })
}

fn user_label(assoc: &Assoc) -> String {
    format!("user {} in account {}", assoc.user, assoc.account)
}

/// Why `job` could never run under the limits, with time limit `limit` (ms): over MaxWall,
/// MaxTRESPerJob, or a per-user or group TRES cap by itself. Admission refuses such a job.
pub fn never_fits(config: &Config, job: &PendingJob, limit: Time) -> Option<LimitReason> {
    if config.limits.is_empty() {
        return None;
    }
    let empty = Counters::default();
    match empty.check(config, job, Amount::of_pending(job), limit) {
        Err(r) if r.is_stuck() => Some(r),
        _ => None,
    }
}

/// [`never_fits`] for an exclusive job, charged the whole nodes it may be given: `whole`,
/// the capacity of each node it may use, of which it takes `nodes`. Each resource counts the
/// least any `nodes` of them hold, so a job is refused only where no choice of nodes fits.
pub(crate) fn never_fits_whole(
    config: &Config,
    job: &PendingJob,
    whole: &[crate::tres::Tres],
    nodes: u32,
    limit: Time,
) -> Option<LimitReason> {
    let n = nodes as usize;
    if config.limits.is_empty() || whole.len() < n {
        return None;
    }
    let least = |of: &dyn Fn(&crate::tres::Tres) -> u64| {
        let mut v: Vec<u64> = whole.iter().map(of).collect();
        v.sort_unstable();
        v[..n].iter().fold(0u64, |a, b| a.saturating_add(*b))
    };
    let asks = Amount {
        cpu: least(&|t| u64::from(t.cpus)),
        mem: least(&|t| t.memory),
        gpu: least(&|t| u64::from(t.gpu_total())),
    };
    match Counters::default().check(config, job, asks, limit) {
        Err(r) if r.is_stuck() => Some(r),
        _ => None,
    }
}

/// Whether one more job of `assoc` in `qos` may be submitted, given the jobs already pending
/// or running (their association and QoS): MaxSubmitJobsPerUser and MaxSubmitJobs.
pub fn submit_fits<'a>(
    config: &Config,
    assoc: &Assoc,
    qos: Option<&str>,
    active: impl IntoIterator<Item = (&'a Assoc, Option<&'a str>)>,
) -> Result<(), LimitReason> {
    let qos_cap = qos
        .and_then(|q| config.limits.qos.get(q))
        .and_then(|l| l.max_submit_jobs_per_user);
    let assoc_cap = inherited(config, assoc, |l| l.max_submit_jobs);
    if qos_cap.is_none() && assoc_cap.is_none() {
        return Ok(());
    }
    let (mut in_qos, mut in_assoc) = (0u64, 0u64);
    for (a, q) in active {
        in_qos += u64::from(a.user == assoc.user && q.is_some() && q == qos);
        in_assoc += u64::from(a == assoc);
    }
    if let (Some(limit), Some(q)) = (qos_cap, qos) {
        if in_qos >= limit {
            return Err(LimitReason::QosMaxSubmitJobsPerUser {
                qos: q.to_string(),
                limit,
            });
        }
    }
    if let Some((limit, label)) = assoc_cap {
        if in_assoc >= limit {
            return Err(LimitReason::AssocMaxSubmitJobs {
                assoc: label,
                limit,
            });
        }
    }
    Ok(())
}

/// What running (and, during a pass, just started) jobs hold in every limited scope.
#[derive(Debug, Clone, Default)]
pub(crate) struct Counters {
    active: bool,
    qos_user: BTreeMap<(String, String), Held>,
    qos: BTreeMap<String, Held>,
    user: BTreeMap<Assoc, Held>,
    account: BTreeMap<String, Held>,
    /// Budgets are configured: the TRES-minutes below are kept.
    budgets: bool,
    /// When the budget period ends.
    resets: Option<Time>,
    /// TRES-minutes used this period plus running jobs' remaining time limits, per user
    /// association and per account (with every account below it).
    mins_user: BTreeMap<Assoc, TresMinutes>,
    mins_account: BTreeMap<String, TresMinutes>,
}

impl Counters {
    /// Counts what `running` holds and, when budgets are configured, what ended runs used
    /// this period (`budget`) and what running jobs may use from the period's start to the
    /// end of their time limits.
    pub fn new(
        config: &Config,
        running: &[RunningJob],
        now: Time,
        budget: &BudgetUsage,
    ) -> Counters {
        let mut c = Counters {
            active: !config.limits.is_empty(),
            budgets: config.limits.has_budgets(),
            resets: budget.resets,
            ..Counters::default()
        };
        if c.active {
            for job in running {
                c.charge(
                    config,
                    &job.assoc,
                    job.qos.as_deref(),
                    &Amount::of_allocs(&job.allocs),
                );
            }
        }
        if c.budgets {
            for (assoc, used) in &budget.used {
                c.charge_mins(config, assoc, used);
            }
            for job in running {
                // It may hold its resources until its time limit (or, overrunning it, at
                // least until now); only the part inside this period counts.
                let from = job.start.max(budget.since);
                let to = job.start.saturating_add(job.time_limit).max(now);
                let a = Amount::of_allocs(&job.allocs);
                let m = a.minutes(config, job.partition.as_deref(), to.saturating_sub(from));
                c.charge_mins(config, &job.assoc, &m);
            }
        }
        c
    }

    fn charge_mins(&mut self, config: &Config, assoc: &Assoc, m: &TresMinutes) {
        self.mins_user.entry(assoc.clone()).or_default().add(m);
        for acct in lineage(config, &assoc.account) {
            self.mins_account
                .entry(acct.to_string())
                .or_default()
                .add(m);
        }
    }

    /// Whether `job` (time limit `limit`, ms) may start now without any scope going over.
    pub fn fits(&self, config: &Config, job: &PendingJob, limit: Time) -> Result<(), LimitReason> {
        if !self.active {
            return Ok(());
        }
        self.check(config, job, Amount::of_pending(job), limit)
    }

    /// Whether any limit is configured (none: every check passes).
    pub(crate) fn active(&self) -> bool {
        self.active
    }

    /// [`Counters::fits`] for what a job would take once placed, `taken` on each of its
    /// nodes: an exclusive job is charged its whole nodes, so it is checked on them, not on
    /// its request (as Slurm checks after it selects the nodes).
    pub(crate) fn fits_taken<'t>(
        &self,
        config: &Config,
        job: &PendingJob,
        taken: impl IntoIterator<Item = &'t crate::tres::Tres>,
        limit: Time,
    ) -> Result<(), LimitReason> {
        if !self.active {
            return Ok(());
        }
        let asks = taken.into_iter().fold(Amount::default(), |a, t| Amount {
            cpu: a.cpu + u64::from(t.cpus),
            mem: a.mem.saturating_add(t.memory),
            gpu: a.gpu + u64::from(t.gpu_total()),
        });
        self.check(config, job, asks, limit)
    }

    /// Adds a job that starts now with `allocs` (whole nodes for an exclusive job) for its
    /// time limit `limit` (ms).
    pub fn add(&mut self, config: &Config, job: &PendingJob, allocs: &[Alloc], limit: Time) {
        if self.active {
            let a = Amount::of_allocs(allocs);
            self.charge(config, &job.assoc, job.qos.as_deref(), &a);
            if self.budgets {
                let m = a.minutes(config, job.partition.as_deref(), limit);
                self.charge_mins(config, &job.assoc, &m);
            }
        }
    }

    fn charge(&mut self, config: &Config, assoc: &Assoc, qos: Option<&str>, a: &Amount) {
        if let Some(q) = qos {
            self.qos_user
                .entry((q.to_string(), assoc.user.clone()))
                .or_default()
                .add(a);
            self.qos.entry(q.to_string()).or_default().add(a);
        }
        self.user.entry(assoc.clone()).or_default().add(a);
        for acct in lineage(config, &assoc.account) {
            self.account.entry(acct.to_string()).or_default().add(a);
        }
    }

    fn check(
        &self,
        config: &Config,
        job: &PendingJob,
        asks: Amount,
        limit: Time,
    ) -> Result<(), LimitReason> {
        let assoc = &job.assoc;
        let zero = Held::default();
        if let Some((q, ql)) = job
            .qos
            .as_deref()
            .and_then(|q| config.limits.qos.get(q).map(|l| (q, l)))
        {
            let qos = || q.to_string();
            if let Some(max) = ql.max_wall.filter(|&m| limit > m) {
                return Err(LimitReason::QosMaxWall {
                    qos: qos(),
                    asks: limit,
                    limit: max,
                });
            }
            let mine = self
                .qos_user
                .get(&(q.to_string(), assoc.user.clone()))
                .unwrap_or(&zero);
            if let Some((tres, limit, in_use, asks)) = ql.max_tres_per_user.over(&mine.tres, &asks)
            {
                return Err(LimitReason::QosMaxTresPerUser {
                    qos: qos(),
                    tres,
                    limit,
                    in_use,
                    asks,
                });
            }
            let all = self.qos.get(q).unwrap_or(&zero);
            if let Some((tres, limit, in_use, asks)) = ql.grp_tres.over(&all.tres, &asks) {
                return Err(LimitReason::QosGrpTres {
                    qos: qos(),
                    tres,
                    limit,
                    in_use,
                    asks,
                });
            }
            if let Some(limit) = ql.max_jobs_per_user.filter(|&m| mine.jobs >= m) {
                return Err(LimitReason::QosMaxJobsPerUser { qos: qos(), limit });
            }
            if let Some(limit) = ql.grp_jobs.filter(|&m| all.jobs >= m) {
                return Err(LimitReason::QosGrpJobs { qos: qos(), limit });
            }
        }
        if let Some((cap, label)) = inherited(config, assoc, |l| {
            (!l.max_tres_per_job.is_empty()).then_some(l.max_tres_per_job)
        }) {
            if let Some((tres, limit, _, asks)) = cap.over(&Amount::default(), &asks) {
                return Err(LimitReason::AssocMaxTresPerJob {
                    assoc: label,
                    tres,
                    limit,
                    asks,
                });
            }
        }
        // The user association's own Grp limits, then every account up the tree.
        let scopes = config
            .limits
            .users
            .get(assoc)
            .map(|l| {
                let mins = self.mins_user.get(assoc);
                (
                    l,
                    self.user.get(assoc).unwrap_or(&zero),
                    mins,
                    user_label(assoc),
                )
            })
            .into_iter()
            .chain(lineage(config, &assoc.account).into_iter().filter_map(|a| {
                config.limits.accounts.get(a).map(|l| {
                    (
                        l,
                        self.account.get(a).unwrap_or(&zero),
                        self.mins_account.get(a),
                        format!("account {a}"),
                    )
                })
            }));
        let budget_asks = asks.minutes(config, job.partition.as_deref(), limit);
        let none = TresMinutes::default();
        for (l, held, mins, label) in scopes {
            if !l.grp_tres_mins.is_empty() {
                if let Some((tres, limit, used, asks)) =
                    budget::over(&l.grp_tres_mins, mins.unwrap_or(&none), &budget_asks)
                {
                    return Err(LimitReason::AssocGrpTresMins {
                        assoc: label,
                        tres,
                        limit,
                        used,
                        asks,
                        resets: self.resets,
                        running: held.jobs > 0,
                    });
                }
            }
            if let Some((tres, limit, in_use, asks)) = l.grp_tres.over(&held.tres, &asks) {
                return Err(LimitReason::AssocGrpTres {
                    assoc: label,
                    tres,
                    limit,
                    in_use,
                    asks,
                });
            }
            if let Some(limit) = l.grp_jobs.filter(|&m| held.jobs >= m) {
                return Err(LimitReason::AssocGrpJobs {
                    assoc: label,
                    limit,
                });
            }
        }
        if let Some((limit, label)) = inherited(config, assoc, |l| l.max_jobs) {
            let mine = self.user.get(assoc).unwrap_or(&zero);
            if mine.jobs >= limit {
                return Err(LimitReason::AssocMaxJobs {
                    assoc: label,
                    limit,
                });
            }
        }
        Ok(())
    }
}
