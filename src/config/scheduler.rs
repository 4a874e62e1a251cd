//! `[scheduler]`: the policy, its weights, partitions, the account tree and QoS.

use anyhow::Result;
use serde::Deserialize;

use wharf_api::job::is_name;

use super::duration;

/// `[scheduler]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SchedulerSection {
    pub policy: String,
    pub reservations: usize,
    /// Reservations past `reservations` for the first blocked job of each association that
    /// holds none (0: none).
    pub assoc_reservations: usize,
    /// A job that has waited this long keeps the reservation it holds.
    pub keep_reservations_after: String,
    /// How many of the last pass's reservations (the first it made) may be kept.
    pub keep_reservations: usize,
    /// How many waiting jobs past the reservations get an estimated start (0: none).
    pub start_estimates: usize,
    pub max_job_test: usize,
    pub half_life: String,
    pub max_age: String,
    pub favor_small: bool,
    pub weight_age: u32,
    pub weight_fairshare: u32,
    pub weight_job_size: u32,
    pub weight_width: u32,
    pub weight_partition: u32,
    pub weight_qos: u32,
    /// QoS of jobs that name none.
    pub default_qos: Option<String>,
    /// Cancel a job whose dependency can never be met (Slurm's kill_invalid_depend).
    pub kill_invalid_dependency: bool,
    /// Ports for jobs' rendezvous (`MASTER_PORT`): `"29500-29999"`.
    pub rendezvous_ports: String,
    /// When account budgets (`grp_tres_mins`) start over: `"never"`, `"daily"`, `"weekly"`,
    /// `"monthly"` (the default), `"quarterly"` or `"yearly"`, at UTC calendar boundaries.
    pub budget_period: String,
    /// `[[scheduler.partition]]` entries; none: every node in one partition.
    #[serde(rename = "partition")]
    pub partitions: Vec<PartitionSection>,
    /// `[[scheduler.account]]`: the fair-share account tree.
    #[serde(rename = "account")]
    pub accounts: Vec<AccountSection>,
    /// `[[scheduler.user]]`: users' shares in accounts.
    #[serde(rename = "user")]
    pub users: Vec<UserSection>,
    /// `[[scheduler.qos]]`: qualities of service.
    #[serde(rename = "qos")]
    pub qos: Vec<QosSection>,
}

/// One `[[scheduler.qos]]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QosSection {
    pub name: String,
    #[serde(default)]
    pub priority: u32,
    /// MaxTRESPerUser: `{ gpu = 4, cpu = 64, mem = "256G" }`.
    #[serde(default)]
    pub max_tres_per_user: TresSection,
    /// MaxJobsPerUser (running).
    #[serde(default)]
    pub max_jobs_per_user: Option<u64>,
    /// MaxSubmitJobsPerUser (pending + running, at submit).
    #[serde(default)]
    pub max_submit_jobs_per_user: Option<u64>,
    /// MaxWall, a duration.
    #[serde(default)]
    pub max_wall: Option<String>,
    /// GrpTRES of the whole QoS.
    #[serde(default)]
    pub grp_tres: TresSection,
    /// GrpJobs of the whole QoS (running).
    #[serde(default)]
    pub grp_jobs: Option<u64>,
    /// QoS whose jobs this one may preempt.
    #[serde(default)]
    pub preempt: Vec<String>,
    /// What becomes of this QoS's jobs when preempted: off, requeue (default) or cancel.
    #[serde(default)]
    pub preempt_mode: Option<String>,
}

/// A `preempt_mode` value, or an error naming `key`.
fn preempt_mode(key: &str, text: &str) -> Result<wharf_controller::PreemptMode> {
    wharf_controller::PreemptMode::parse(text).ok_or_else(|| {
        anyhow::anyhow!("{key}: preempt_mode {text:?}: use \"off\", \"requeue\" or \"cancel\"")
    })
}

/// A TRES limit table: `{ cpu = 64, gpu = 4, mem = "256G" }`; a key left out is not capped.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TresSection {
    pub cpu: Option<u64>,
    pub gpu: Option<u64>,
    pub mem: Option<String>,
}

impl TresSection {
    fn resolve(&self, key: &str) -> Result<wharf_controller::sched_limits::TresLimit> {
        let mem = self
            .mem
            .as_deref()
            .map(|m| {
                wharf_api::resources::parse_memory(m).map_err(|e| anyhow::anyhow!("{key} mem: {e}"))
            })
            .transpose()?;
        Ok(wharf_controller::sched_limits::TresLimit {
            cpu: self.cpu,
            mem,
            gpu: self.gpu,
        })
    }
}

/// A budget table in TRES-minutes: `{ gpu = 6000, cpu = 50000, billing = 100000 }`; a key
/// left out has no budget.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TresMinsSection {
    pub cpu: Option<u64>,
    pub gpu: Option<u64>,
    pub billing: Option<u64>,
}

/// The limits a `[[scheduler.account]]` and a `[[scheduler.user]]` both have, borrowed.
struct LimitFields<'a> {
    grp_tres: &'a TresSection,
    grp_jobs: Option<u64>,
    max_jobs: Option<u64>,
    max_submit_jobs: Option<u64>,
    max_tres_per_job: &'a TresSection,
    grp_tres_mins: &'a TresMinsSection,
    qos: &'a Option<Vec<String>>,
}

/// The association limits written in a `[[scheduler.account]]` or `[[scheduler.user]]`
/// (named `key` in errors), or `None` when none is set; its `qos` must name QoS of
/// `defined_qos`.
fn assoc_limits(
    key: &str,
    f: LimitFields<'_>,
    defined_qos: &[wharf_controller::SchedulerQos],
) -> Result<Option<wharf_controller::sched_limits::AssocLimits>> {
    if let Some(q) = (f.qos.iter().flatten()).find(|q| !defined_qos.iter().any(|d| &d.name == *q)) {
        anyhow::bail!("{key}: qos names {q:?}, which is not a defined [[scheduler.qos]]");
    }
    let l = wharf_controller::sched_limits::AssocLimits {
        grp_tres: f.grp_tres.resolve(&format!("{key} grp_tres"))?,
        grp_jobs: f.grp_jobs,
        max_jobs: f.max_jobs,
        max_submit_jobs: f.max_submit_jobs,
        max_tres_per_job: f
            .max_tres_per_job
            .resolve(&format!("{key} max_tres_per_job"))?,
        grp_tres_mins: wharf_controller::sched_limits::TresMins {
            cpu: f.grp_tres_mins.cpu,
            gpu: f.grp_tres_mins.gpu,
            billing: f.grp_tres_mins.billing,
        },
        qos: f.qos.clone(),
    };
    Ok((l != Default::default()).then_some(l))
}

/// One `[[scheduler.account]]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AccountSection {
    pub name: String,
    #[serde(default)]
    pub parent: Option<String>,
    #[serde(default = "one")]
    pub shares: u32,
    /// GrpTRES: all running jobs of the association (an account: every job below it).
    #[serde(default)]
    pub grp_tres: TresSection,
    /// GrpJobs (running).
    #[serde(default)]
    pub grp_jobs: Option<u64>,
    /// MaxJobs per user association (running).
    #[serde(default)]
    pub max_jobs: Option<u64>,
    /// MaxSubmitJobs per user association (pending + running, at submit).
    #[serde(default)]
    pub max_submit_jobs: Option<u64>,
    /// MaxTRESPerJob.
    #[serde(default)]
    pub max_tres_per_job: TresSection,
    /// GrpTRESMins: a budget per period, TRES-minutes of all its jobs together.
    #[serde(default)]
    pub grp_tres_mins: TresMinsSection,
    /// The QoS its users may name (besides the default); unset: the parent account's.
    #[serde(default)]
    pub qos: Option<Vec<String>>,
}

/// One `[[scheduler.user]]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UserSection {
    pub name: String,
    pub account: String,
    #[serde(default = "one")]
    pub shares: u32,
    #[serde(default)]
    pub default: bool,
    /// GrpTRES: all running jobs of the association (an account: every job below it).
    #[serde(default)]
    pub grp_tres: TresSection,
    /// GrpJobs (running).
    #[serde(default)]
    pub grp_jobs: Option<u64>,
    /// MaxJobs per user association (running).
    #[serde(default)]
    pub max_jobs: Option<u64>,
    /// MaxSubmitJobs per user association (pending + running, at submit).
    #[serde(default)]
    pub max_submit_jobs: Option<u64>,
    /// MaxTRESPerJob.
    #[serde(default)]
    pub max_tres_per_job: TresSection,
    /// GrpTRESMins: a budget per period, TRES-minutes of all its jobs together.
    #[serde(default)]
    pub grp_tres_mins: TresMinsSection,
    /// The QoS its users may name (besides the default); unset: the parent account's.
    #[serde(default)]
    pub qos: Option<Vec<String>>,
}

fn one() -> u32 {
    1
}

/// One `[[scheduler.partition]]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PartitionSection {
    pub name: String,
    pub nodes: Vec<String>,
    pub default: bool,
    pub state: String,
    pub priority_tier: u32,
    pub max_time: Option<String>,
    pub default_time: Option<String>,
    pub max_nodes: Option<u32>,
    /// DefMemPerCPU, DefMemPerGPU, MaxMemPerCPU, MaxMemPerGPU: sizes such as "4G".
    pub def_mem_per_cpu: Option<String>,
    pub def_mem_per_gpu: Option<String>,
    pub max_mem_per_cpu: Option<String>,
    pub max_mem_per_gpu: Option<String>,
    pub billing_cpu: f64,
    pub billing_memory_gib: f64,
    pub billing_gpu: f64,
    /// AllowAccounts: accounts whose jobs may run here; empty: all.
    pub allow_accounts: Vec<String>,
    /// AllowGroups: Unix groups whose members may run jobs here; empty: everyone.
    pub allow_groups: Vec<String>,
    /// What becomes of its jobs when a job of a higher tier needs their nodes.
    pub preempt_mode: String,
}

impl Default for PartitionSection {
    fn default() -> Self {
        let b = wharf_controller::SchedulerBilling::default();
        PartitionSection {
            name: String::new(),
            nodes: vec![],
            default: false,
            state: "up".into(),
            priority_tier: 0,
            max_time: None,
            default_time: None,
            max_nodes: None,
            def_mem_per_cpu: None,
            def_mem_per_gpu: None,
            max_mem_per_cpu: None,
            max_mem_per_gpu: None,
            billing_cpu: b.cpu,
            billing_memory_gib: b.memory_gib,
            billing_gpu: b.gpu,
            allow_accounts: vec![],
            allow_groups: vec![],
            preempt_mode: "off".into(),
        }
    }
}

impl PartitionSection {
    fn resolve(&self) -> Result<wharf_controller::SchedulerPartition> {
        use wharf_controller::PartitionState;
        let name = &self.name;
        let key = format!("scheduler.partition {name:?}");
        if !is_name(name) {
            anyhow::bail!("{key}: name must be 1 to 64 letters, digits, '-', '_' or '.'");
        }
        let state = match self.state.to_ascii_lowercase().as_str() {
            "up" => PartitionState::Up,
            "down" => PartitionState::Down,
            "drain" => PartitionState::Drain,
            "inactive" => PartitionState::Inactive,
            other => anyhow::bail!(
                "{key}: state {other:?}: use \"up\", \"down\", \"drain\" or \"inactive\""
            ),
        };
        let ms = |what: &str, text: &Option<String>| -> Result<Option<u64>> {
            text.as_deref()
                .map(|t| Ok(duration(&format!("{key} {what}"), t)?.as_millis() as u64))
                .transpose()
        };
        for (what, w) in [
            ("billing_cpu", self.billing_cpu),
            ("billing_memory_gib", self.billing_memory_gib),
            ("billing_gpu", self.billing_gpu),
        ] {
            if !(w.is_finite() && w >= 0.0) {
                anyhow::bail!("{key}: {what} must be a number at least 0");
            }
        }
        if self.max_nodes == Some(0) {
            anyhow::bail!("{key}: max_nodes must be at least 1");
        }
        // Each entry is a host list: `gpu[01-16]`.
        let mut nodes = Vec::new();
        for entry in &self.nodes {
            let names = wharf_api::hostlist::expand(entry, wharf_api::hostlist::MAX_HOSTS)
                .map_err(|e| anyhow::anyhow!("{key}: nodes: {e}"))?;
            nodes.extend(names);
        }
        let nodes: Vec<&str> = nodes.iter().map(String::as_str).collect();
        if let Some(bad) = self.allow_accounts.iter().find(|a| !is_name(a)) {
            anyhow::bail!(
                "{key}: allow_accounts: {bad:?} is not an account name (1 to 64 letters, digits, \
                 '-', '_' or '.')"
            );
        }
        // Group names come from the system's databases (LDAP ones may hold spaces).
        let bad_group = |g: &String| {
            g.trim().is_empty()
                || g.len() > 256
                || g.contains([':', ','])
                || g.chars().any(char::is_control)
        };
        if let Some(bad) = self.allow_groups.iter().find(|g| bad_group(g)) {
            anyhow::bail!("{key}: allow_groups: {bad:?} is not a group name");
        }
        let mut p = wharf_controller::SchedulerPartition::new(name, &nodes);
        p.allow_accounts = self.allow_accounts.clone();
        p.allow_groups = self.allow_groups.clone();
        p.state = state;
        p.priority_tier = self.priority_tier;
        p.max_time = ms("max_time", &self.max_time)?;
        p.default_time = ms("default_time", &self.default_time)?;
        p.max_nodes = self.max_nodes;
        let size = |what: &str, text: &Option<String>| -> Result<Option<u64>> {
            text.as_deref()
                .map(|t| {
                    wharf_api::resources::parse_memory(t)
                        .map_err(|e| anyhow::anyhow!("{key} {what}: {e}"))
                })
                .transpose()
        };
        p.def_mem_per_cpu = size("def_mem_per_cpu", &self.def_mem_per_cpu)?;
        p.def_mem_per_gpu = size("def_mem_per_gpu", &self.def_mem_per_gpu)?;
        p.max_mem_per_cpu = size("max_mem_per_cpu", &self.max_mem_per_cpu)?;
        p.max_mem_per_gpu = size("max_mem_per_gpu", &self.max_mem_per_gpu)?;
        p.preempt_mode = preempt_mode(&key, &self.preempt_mode)?;
        p.billing = wharf_controller::SchedulerBilling {
            cpu: self.billing_cpu,
            memory_gib: self.billing_memory_gib,
            gpu: self.billing_gpu,
        };
        Ok(p)
    }
}

impl Default for SchedulerSection {
    fn default() -> Self {
        let c = wharf_controller::SchedulerConfig::default();
        SchedulerSection {
            policy: "multifactor".into(),
            reservations: c.reservations,
            assoc_reservations: c.assoc_reservations,
            keep_reservations_after: format!("{}s", c.keep_reservations_after / 1000),
            keep_reservations: c.keep_reservations,
            start_estimates: c.start_estimates,
            max_job_test: c.max_job_test,
            half_life: "7d".into(),
            max_age: "7d".into(),
            favor_small: c.favor_small,
            weight_age: c.weights.age,
            weight_fairshare: c.weights.fairshare,
            weight_job_size: c.weights.job_size,
            weight_width: c.weights.width,
            weight_partition: c.weights.partition,
            weight_qos: c.weights.qos,
            default_qos: None,
            kill_invalid_dependency: true,
            rendezvous_ports: format!(
                "{}-{}",
                c.rendezvous_ports.start(),
                c.rendezvous_ports.end()
            ),
            budget_period: c.budget_period.as_str().into(),
            partitions: vec![],
            accounts: vec![],
            users: vec![],
            qos: vec![],
        }
    }
}

/// A port range `LOW-HIGH` of unprivileged ports (1024 and up), at least one port.
fn port_range(text: &str) -> Result<std::ops::RangeInclusive<u16>> {
    let key = "scheduler.rendezvous_ports";
    let (lo, hi) = text.split_once('-').ok_or_else(|| {
        anyhow::anyhow!("{key} {text:?}: give a range LOW-HIGH, e.g. \"29500-29999\"")
    })?;
    let port = |p: &str| -> Result<u16> {
        p.trim()
            .parse::<u16>()
            .map_err(|_| anyhow::anyhow!("{key} {text:?}: {p:?} is not a port (1024-65535)"))
    };
    let (lo, hi) = (port(lo)?, port(hi)?);
    if lo < 1024 || lo > hi {
        anyhow::bail!("{key} {text:?}: the range must run upwards from 1024 or above");
    }
    Ok(lo..=hi)
}

impl SchedulerSection {
    /// The scheduler's configuration.
    pub fn resolve(&self) -> Result<wharf_controller::SchedulerConfig> {
        use wharf_controller::SchedulerPolicy;
        let policy = match self.policy.to_ascii_lowercase().as_str() {
            "fcfs" => SchedulerPolicy::Fcfs,
            "easy" => SchedulerPolicy::Easy,
            "multifactor" => SchedulerPolicy::Multifactor,
            other => anyhow::bail!(
                "scheduler.policy {other:?}: use \"fcfs\", \"easy\" or \"multifactor\""
            ),
        };
        if self.reservations == 0 {
            anyhow::bail!(
                "scheduler.reservations must be at least 1: without a reservation a large job \
                 can wait forever behind small ones"
            );
        }
        if self.max_job_test == 0 {
            anyhow::bail!("scheduler.max_job_test must be at least 1");
        }
        let ms = |key: &str, text: &str| -> Result<u64> {
            Ok(duration(key, text)?.as_millis().min(u64::MAX as u128) as u64)
        };
        let mut c = wharf_controller::SchedulerConfig::with_policy(policy);
        c.reservations = self.reservations;
        c.assoc_reservations = self.assoc_reservations;
        // 0: every reservation is kept from the moment it is made.
        let keep = "scheduler.keep_reservations_after";
        c.keep_reservations_after = super::duration_or_off(keep, &self.keep_reservations_after)?
            .as_millis()
            .min(u64::MAX as u128) as u64;
        c.keep_reservations = self.keep_reservations;
        c.start_estimates = self.start_estimates;
        c.max_job_test = self.max_job_test;
        c.half_life = ms("scheduler.half_life", &self.half_life)?;
        c.max_age = ms("scheduler.max_age", &self.max_age)?;
        c.favor_small = self.favor_small;
        c.weights.age = self.weight_age;
        c.weights.fairshare = self.weight_fairshare;
        c.weights.job_size = self.weight_job_size;
        c.weights.width = self.weight_width;
        c.weights.partition = self.weight_partition;
        c.weights.qos = self.weight_qos;
        c.rendezvous_ports = port_range(&self.rendezvous_ports)?;
        use wharf_controller::sched_limits::BudgetPeriod;
        c.budget_period = BudgetPeriod::parse(&self.budget_period).ok_or_else(|| {
            let names: Vec<String> = BudgetPeriod::ALL
                .iter()
                .map(|p| format!("{:?}", p.as_str()))
                .collect();
            anyhow::anyhow!(
                "scheduler.budget_period {:?}: use {}",
                self.budget_period,
                names.join(", ")
            )
        })?;
        let mut names = std::collections::BTreeSet::new();
        for p in &self.partitions {
            if !names.insert(p.name.as_str()) {
                anyhow::bail!("scheduler.partition {:?} is defined twice", p.name);
            }
            c.partitions.push(p.resolve()?);
        }
        let defaults: Vec<&str> = self
            .partitions
            .iter()
            .filter(|p| p.default)
            .map(|p| p.name.as_str())
            .collect();
        if defaults.len() > 1 {
            anyhow::bail!(
                "scheduler.partition: {} are all marked default; mark one",
                defaults.join(", ")
            );
        }
        c.default_partition = defaults.first().map(|d| d.to_string());
        let mut seen = std::collections::BTreeSet::new();
        for q in &self.qos {
            if !is_name(&q.name) {
                anyhow::bail!(
                    "scheduler.qos {:?}: name must be 1 to 64 letters, digits, '-', '_' or '.'",
                    q.name
                );
            }
            if !seen.insert(q.name.as_str()) {
                anyhow::bail!("scheduler.qos {:?} is defined twice", q.name);
            }
            c.qos.push(wharf_controller::SchedulerQos {
                name: q.name.clone(),
                priority: q.priority,
            });
        }
        if let Some(d) = &self.default_qos {
            if !seen.contains(d.as_str()) {
                anyhow::bail!(
                    "scheduler.default_qos {d:?} is not a defined [[scheduler.qos]]; define it or leave default_qos out"
                );
            }
            c.limits.default_qos = Some(d.clone());
        }
        // After the QoS: an association's `qos` list names them.
        self.resolve_accounts(&mut c)?;
        for q in &self.qos {
            let key = format!("scheduler.qos {:?}", q.name);
            if let Some(p) = q.preempt.iter().find(|p| !seen.contains(p.as_str())) {
                anyhow::bail!("{key}: preempt names {p:?}, which is not a defined QoS");
            }
            let max_wall = q
                .max_wall
                .as_deref()
                .map(|t| ms(&format!("{key} max_wall"), t))
                .transpose()?;
            let limits = wharf_controller::sched_limits::QosLimits {
                max_tres_per_user: q
                    .max_tres_per_user
                    .resolve(&format!("{key} max_tres_per_user"))?,
                max_jobs_per_user: q.max_jobs_per_user,
                max_submit_jobs_per_user: q.max_submit_jobs_per_user,
                max_wall,
                grp_tres: q.grp_tres.resolve(&format!("{key} grp_tres"))?,
                grp_jobs: q.grp_jobs,
                preempt: q.preempt.clone(),
                preempt_mode: q
                    .preempt_mode
                    .as_deref()
                    .map(|m| preempt_mode(&key, m))
                    .transpose()?,
            };
            if limits != Default::default() {
                c.limits.qos.insert(q.name.clone(), limits);
            }
        }
        Ok(c)
    }

    /// The account tree and users' shares. Each user's default account comes first among
    /// their entries (the one marked `default`, else the first listed).
    fn resolve_accounts(&self, c: &mut wharf_controller::SchedulerConfig) -> Result<()> {
        let mut names = std::collections::BTreeSet::new();
        for a in &self.accounts {
            let key = format!("scheduler.account {:?}", a.name);
            if !is_name(&a.name) {
                anyhow::bail!("{key}: name must be 1 to 64 letters, digits, '-', '_' or '.'");
            }
            if !names.insert(a.name.as_str()) {
                anyhow::bail!("{key} is defined twice");
            }
            if a.shares == 0 {
                anyhow::bail!("{key}: shares must be at least 1");
            }
        }
        for a in &self.accounts {
            if let Some(p) = &a.parent {
                if !names.contains(p.as_str()) || p == &a.name {
                    anyhow::bail!(
                        "scheduler.account {:?}: parent {p:?} is not another defined account",
                        a.name
                    );
                }
            }
            c.accounts.push(wharf_controller::SchedulerAccount {
                name: a.name.clone(),
                parent: a.parent.clone(),
                shares: a.shares,
            });
            let fields = LimitFields {
                grp_tres: &a.grp_tres,
                grp_jobs: a.grp_jobs,
                max_jobs: a.max_jobs,
                max_submit_jobs: a.max_submit_jobs,
                max_tres_per_job: &a.max_tres_per_job,
                grp_tres_mins: &a.grp_tres_mins,
                qos: &a.qos,
            };
            if let Some(l) =
                assoc_limits(&format!("scheduler.account {:?}", a.name), fields, &c.qos)?
            {
                c.limits.accounts.insert(a.name.clone(), l);
            }
        }
        let mut seen = std::collections::BTreeSet::new();
        for u in &self.users {
            let key = format!("scheduler.user {:?} in {:?}", u.name, u.account);
            if !names.contains(u.account.as_str()) {
                anyhow::bail!("{key}: no [[scheduler.account]] is named {:?}", u.account);
            }
            if !seen.insert((u.name.as_str(), u.account.as_str())) {
                anyhow::bail!("{key} is defined twice");
            }
            if u.shares == 0 {
                anyhow::bail!("{key}: shares must be at least 1");
            }
            let fields = LimitFields {
                grp_tres: &u.grp_tres,
                grp_jobs: u.grp_jobs,
                max_jobs: u.max_jobs,
                max_submit_jobs: u.max_submit_jobs,
                max_tres_per_job: &u.max_tres_per_job,
                grp_tres_mins: &u.grp_tres_mins,
                qos: &u.qos,
            };
            if let Some(l) = assoc_limits(&key, fields, &c.qos)? {
                c.limits.users.insert(
                    wharf_controller::SchedulerAssoc::new(&u.account, &u.name),
                    l,
                );
            }
            let marked = self
                .users
                .iter()
                .filter(|o| o.name == u.name && o.default)
                .count();
            if marked > 1 {
                anyhow::bail!(
                    "scheduler.user {:?} has {marked} default accounts; mark one",
                    u.name
                );
            }
        }
        let mut ordered: Vec<&UserSection> = self.users.iter().collect();
        // Stable: the default entry first, then the order written.
        ordered.sort_by_key(|u| !u.default);
        for u in ordered {
            c.users.push(wharf_controller::SchedulerUserShares {
                user: u.name.clone(),
                account: u.account.clone(),
                shares: u.shares,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::FileConfig;

    /// The error a config file's `[scheduler]` is refused with.
    fn refused(text: &str) -> String {
        let file: FileConfig = toml::from_str(text).unwrap();
        file.scheduler.resolve().unwrap_err().to_string()
    }

    #[test]
    fn rendezvous_ports_are_a_range_of_unprivileged_ports() {
        let resolve = |text: &str| {
            let file: FileConfig =
                toml::from_str(&format!("[scheduler]\nrendezvous_ports = \"{text}\"\n")).unwrap();
            file.scheduler.resolve()
        };
        assert_eq!(
            resolve("40000-40009").unwrap().rendezvous_ports,
            40000..=40009
        );
        assert_eq!(resolve("5000-5000").unwrap().rendezvous_ports, 5000..=5000);
        for (bad, says) in [
            ("29500", "give a range LOW-HIGH"),
            ("80-90", "from 1024 or above"),
            ("30000-29000", "run upwards"),
            ("1-x", "\"x\" is not a port"),
            ("29500-70000", "is not a port"),
        ] {
            let err = resolve(bad).unwrap_err().to_string();
            assert!(
                err.contains("scheduler.rendezvous_ports") && err.contains(says),
                "{bad}: {err}"
            );
        }
    }

    #[test]
    fn scheduler_section_chooses_the_policy_and_refuses_nonsense() {
        let file: FileConfig = toml::from_str(
            "[scheduler]\npolicy = \"easy\"\nhalf_life = \"1d\"\nweight_fairshare = 5\n",
        )
        .unwrap();
        let c = file.scheduler.resolve().unwrap();
        assert_eq!(c.policy, wharf_controller::SchedulerPolicy::Easy);
        assert_eq!(c.half_life, 24 * 3600 * 1000);
        assert_eq!(c.weights.fairshare, 5);
        let d = FileConfig::default().scheduler.resolve().unwrap();
        assert_eq!(d, wharf_controller::SchedulerConfig::default());
        let file: FileConfig = toml::from_str(
            "[[scheduler.partition]]\nname = \"cpu\"\n\
             [[scheduler.partition]]\nname = \"gpu\"\nnodes = [\"g1\"]\ndefault = true\n\
             max_time = \"1d\"\npriority_tier = 2\nbilling_gpu = 10.0\nstate = \"drain\"\n",
        )
        .unwrap();
        let c = file.scheduler.resolve().unwrap();
        assert_eq!(c.default_partition.as_deref(), Some("gpu"));
        let gpu = &c.partitions[1];
        assert_eq!(gpu.nodes, vec!["g1".to_string()]);
        assert_eq!(gpu.max_time, Some(24 * 3600 * 1000));
        assert_eq!(gpu.billing.gpu, 10.0);
        assert_eq!(gpu.state, wharf_controller::PartitionState::Drain);
        let file: FileConfig = toml::from_str(
            "[[scheduler.partition]]\nname = \"gpu\"\nnodes = [\"g[01-03]\", \"big1\"]\n\
             allow_accounts = [\"physics\"]\nallow_groups = [\"gpuusers\"]\n",
        )
        .unwrap();
        let c = file.scheduler.resolve().unwrap();
        assert_eq!(c.partitions[0].nodes, ["g01", "g02", "g03", "big1"]);
        assert_eq!(c.partitions[0].allow_accounts, ["physics"]);
        assert_eq!(c.partitions[0].allow_groups, ["gpuusers"]);
        let file: FileConfig = toml::from_str(
            "[[scheduler.partition]]\nname = \"gpu\"\ndef_mem_per_cpu = \"2G\"\n\
             def_mem_per_gpu = \"40G\"\nmax_mem_per_cpu = \"8G\"\nmax_mem_per_gpu = \"96G\"\n",
        )
        .unwrap();
        let c = file.scheduler.resolve().unwrap();
        let gpu = &c.partitions[0];
        assert_eq!(gpu.def_mem_per_cpu, Some(2 << 30));
        assert_eq!(gpu.def_mem_per_gpu, Some(40 << 30));
        assert_eq!(gpu.max_mem_per_cpu, Some(8 << 30));
        assert_eq!(gpu.max_mem_per_gpu, Some(96 << 30));
        for (text, want) in [
            ("name = \"a\"\nnodes = [\"g[1-\"]", "nodes: host list \"g[1-\""),
            ("name = \"a\"\nallow_accounts = [\"a b\"]", "is not an account name"),
            ("name = \"a\"\nallow_groups = [\"a,b\"]", "is not a group name"),
            ("name = \"a\"\n[[scheduler.partition]]\nname = \"a\"", "defined twice"),
            ("name = \"a b\"", "name must be"),
            ("name = \"a\"\nstate = \"closed\"", "state \"closed\""),
            ("name = \"a\"\nbilling_gpu = -1.0", "billing_gpu"),
            ("name = \"a\"\nmax_mem_per_gpu = \"lots\"", "max_mem_per_gpu: invalid memory size"),
            ("name = \"a\"\ndef_mem_per_cpu = \"4Q\"", "def_mem_per_cpu: unknown memory unit"),
            ("name = \"a\"\ndefault = true\n[[scheduler.partition]]\nname = \"b\"\ndefault = true", "mark one"),
        ] {
            let err = refused(&format!("[[scheduler.partition]]\n{text}\n"));
            assert!(err.contains(want), "{err}");
        }
        for (text, want) in [
            ("policy = \"sjf\"", "scheduler.policy \"sjf\""),
            ("reservations = 0", "scheduler.reservations"),
            ("half_life = \"soon\"", "scheduler.half_life"),
            (
                "keep_reservations_after = \"a while\"",
                "scheduler.keep_reservations_after",
            ),
        ] {
            let err = refused(&format!("[scheduler]\n{text}\n"));
            assert!(err.contains(want), "{err}");
        }
    }

    #[test]
    fn reservations_past_the_depth_and_kept_ones_are_configured() {
        let text = "[scheduler]\nassoc_reservations = 4\nkeep_reservations_after = \"2d\"\n";
        let file: FileConfig = toml::from_str(text).unwrap();
        let c = file.scheduler.resolve().unwrap();
        assert_eq!(c.assoc_reservations, 4);
        assert_eq!(c.keep_reservations_after, 2 * 24 * 3600 * 1000);
        assert_eq!(c.keep_reservations, 1, "the first made is kept");
        assert_eq!((c.weights.job_size, c.weights.width), (4000, 6000));
        let text = "[scheduler]\nstart_estimates = 0\n";
        let file: FileConfig = toml::from_str(text).unwrap();
        assert_eq!(file.scheduler.resolve().unwrap().start_estimates, 0);
        let text = "[scheduler]\nkeep_reservations = 2\nweight_width = 0\n";
        let file: FileConfig = toml::from_str(text).unwrap();
        let c = file.scheduler.resolve().unwrap();
        assert_eq!((c.keep_reservations, c.weights.width), (2, 0));
        let text = "[scheduler]\nkeep_reservations = -1\n";
        assert!(toml::from_str::<FileConfig>(text).is_err());
        let text = "[scheduler]\nkeep_reservations_after = \"0\"\n";
        let file: FileConfig = toml::from_str(text).unwrap();
        assert_eq!(file.scheduler.resolve().unwrap().keep_reservations_after, 0);
    }

    #[test]
    fn the_gpu_lab_example_is_a_valid_config() {
        let text = include_str!("../../examples/gpu-lab.toml");
        let file: FileConfig = toml::from_str(text).unwrap();
        let c = file.scheduler.resolve().unwrap();
        assert_eq!(c.partitions.len(), 2);
        assert_eq!(c.default_partition.as_deref(), Some("batch"));
        assert_eq!(c.accounts.len(), 4);
        assert_eq!(c.qos[0].name, "deadline");
        assert_eq!(c.limits.default_qos.as_deref(), Some("normal"));
        assert_eq!(c.limits.qos["normal"].max_tres_per_user.gpu, Some(4));
        assert_eq!(c.limits.qos["deadline"].max_jobs_per_user, Some(2));
        assert_eq!(c.limits.accounts["robotics"].grp_tres.gpu, Some(8));
        assert_eq!(c.limits.accounts["robotics"].grp_tres_mins.gpu, Some(6000));
    }

    #[test]
    fn accounts_and_users_build_the_fair_share_tree() {
        let file: FileConfig = toml::from_str(
            "[[scheduler.account]]\nname = \"physics\"\nshares = 3\n\
             [[scheduler.account]]\nname = \"theory\"\nparent = \"physics\"\n\
             [[scheduler.user]]\nname = \"ann\"\naccount = \"physics\"\n\
             [[scheduler.user]]\nname = \"ann\"\naccount = \"theory\"\ndefault = true\n",
        )
        .unwrap();
        let c = file.scheduler.resolve().unwrap();
        assert_eq!(c.accounts[0].shares, 3);
        assert_eq!(c.accounts[1].parent.as_deref(), Some("physics"));
        assert_eq!(
            c.users[0].account, "theory",
            "the default account comes first"
        );
        for (text, want) in [
            (
                "[[scheduler.account]]\nname = \"a\"\nparent = \"b\"",
                "parent \"b\"",
            ),
            (
                "[[scheduler.user]]\nname = \"u\"\naccount = \"nope\"",
                "no [[scheduler.account]]",
            ),
            (
                "[[scheduler.account]]\nname = \"a\"\nshares = 0",
                "shares must be",
            ),
        ] {
            let err = refused(text);
            assert!(err.contains(want), "{err}");
        }
    }

    #[test]
    fn preempt_modes_are_read_and_a_bad_one_names_the_key() {
        let file: FileConfig = toml::from_str(
            "[[scheduler.partition]]\nname = \"scav\"\npreempt_mode = \"Requeue\"\n\
             [[scheduler.partition]]\nname = \"high\"\npriority_tier = 1\n\
             [[scheduler.qos]]\nname = \"high\"\npreempt = [\"low\"]\n\
             [[scheduler.qos]]\nname = \"low\"\npreempt_mode = \"cancel\"\n",
        )
        .unwrap();
        let c = file.scheduler.resolve().unwrap();
        use wharf_controller::PreemptMode;
        assert_eq!(c.partitions[0].preempt_mode, PreemptMode::Requeue);
        assert_eq!(c.partitions[1].preempt_mode, PreemptMode::Off);
        assert_eq!(c.limits.qos["high"].preempt_mode, None);
        assert_eq!(c.limits.qos["low"].preempt_mode, Some(PreemptMode::Cancel));
        for (text, want) in [
            (
                "[[scheduler.partition]]\nname = \"p\"\npreempt_mode = \"suspend\"",
                "scheduler.partition \"p\": preempt_mode \"suspend\": use \"off\"",
            ),
            (
                "[[scheduler.qos]]\nname = \"q\"\npreempt_mode = \"kill\"",
                "scheduler.qos \"q\": preempt_mode \"kill\"",
            ),
        ] {
            let err = refused(text);
            assert!(err.contains(want), "{err}");
        }
    }

    #[test]
    fn qos_and_association_limits_are_read_and_nonsense_names_the_key() {
        let file: FileConfig = toml::from_str(
            "[[scheduler.qos]]\nname = \"normal\"\n\
             max_tres_per_user = { gpu = 4, cpu = 64, mem = \"256G\" }\n\
             max_jobs_per_user = 3\nmax_submit_jobs_per_user = 10\nmax_wall = \"1d\"\n\
             grp_tres = { gpu = 16 }\ngrp_jobs = 20\npreempt = [\"scavenger\"]\n\
             [[scheduler.qos]]\nname = \"scavenger\"\n\
             [[scheduler.account]]\nname = \"physics\"\ngrp_tres = { cpu = 128 }\n\
             grp_jobs = 50\nmax_jobs = 5\nmax_submit_jobs = 100\n\
             max_tres_per_job = { gpu = 8 }\nqos = [\"normal\"]\n\
             [[scheduler.user]]\nname = \"ann\"\naccount = \"physics\"\nmax_jobs = 1\n\
             qos = [\"normal\", \"scavenger\"]\n",
        )
        .unwrap();
        let c = file.scheduler.resolve().unwrap();
        let q = &c.limits.qos["normal"];
        assert_eq!(q.max_tres_per_user.gpu, Some(4));
        assert_eq!(q.max_tres_per_user.cpu, Some(64));
        assert_eq!(q.max_tres_per_user.mem, Some(256 << 30));
        assert_eq!(q.max_jobs_per_user, Some(3));
        assert_eq!(q.max_submit_jobs_per_user, Some(10));
        assert_eq!(q.max_wall, Some(24 * 3600 * 1000));
        assert_eq!(q.grp_tres.gpu, Some(16));
        assert_eq!(q.grp_jobs, Some(20));
        assert_eq!(q.preempt, vec!["scavenger".to_string()]);
        assert!(
            !c.limits.qos.contains_key("scavenger"),
            "no limits, no entry"
        );
        let a = &c.limits.accounts["physics"];
        assert_eq!(a.grp_tres.cpu, Some(128));
        assert_eq!(
            (a.grp_jobs, a.max_jobs, a.max_submit_jobs),
            (Some(50), Some(5), Some(100))
        );
        assert_eq!(a.max_tres_per_job.gpu, Some(8));
        assert_eq!(a.qos, Some(vec!["normal".to_string()]));
        let ann = wharf_controller::SchedulerAssoc::new("physics", "ann");
        assert_eq!(c.limits.users[&ann].max_jobs, Some(1));
        assert_eq!(c.limits.users[&ann].qos.as_ref().map(Vec::len), Some(2));

        for (text, want) in [
            (
                "[[scheduler.qos]]\nname = \"q\"\npreempt = [\"nope\"]",
                "scheduler.qos \"q\": preempt names \"nope\"",
            ),
            (
                "[[scheduler.qos]]\nname = \"q\"\nmax_wall = \"soon\"",
                "scheduler.qos \"q\" max_wall",
            ),
            (
                "[[scheduler.qos]]\nname = \"q\"\ngrp_tres = { mem = \"lots\" }",
                "scheduler.qos \"q\" grp_tres mem",
            ),
            (
                "[[scheduler.account]]\nname = \"a\"\nmax_tres_per_job = { mem = \"x\" }",
                "scheduler.account \"a\" max_tres_per_job mem",
            ),
            (
                "[scheduler]\ndefault_qos = \"gold\"",
                "scheduler.default_qos \"gold\" is not a defined",
            ),
            (
                "[[scheduler.account]]\nname = \"a\"\nqos = [\"gold\"]",
                "scheduler.account \"a\": qos names \"gold\", which is not a defined",
            ),
        ] {
            let err = refused(text);
            assert!(err.contains(want), "{err}");
        }
        for (text, want) in [
            (
                "[[scheduler.qos]]\nname = \"q\"\nmax_tres_per_user = { gpus = 4 }",
                "unknown field `gpus`",
            ),
            (
                "[[scheduler.account]]\nname = \"a\"\nmax_jobs = -1",
                "max_jobs",
            ),
            (
                "[[scheduler.user]]\nname = \"u\"\naccount = \"a\"\nmax_job = 1",
                "unknown field `max_job`",
            ),
        ] {
            let err = toml::from_str::<FileConfig>(text).unwrap_err().to_string();
            assert!(err.contains(want), "{err}");
        }
    }

    #[test]
    fn budgets_and_their_period_are_read_and_nonsense_is_refused() {
        use wharf_controller::sched_limits::BudgetPeriod;
        let file: FileConfig = toml::from_str(
            "[scheduler]\nbudget_period = \"Weekly\"\n\
             [[scheduler.account]]\nname = \"physics\"\n\
             grp_tres_mins = { gpu = 6000, billing = 100000 }\n\
             [[scheduler.user]]\nname = \"ann\"\naccount = \"physics\"\n\
             grp_tres_mins = { cpu = 500 }\n",
        )
        .unwrap();
        let c = file.scheduler.resolve().unwrap();
        assert_eq!(c.budget_period, BudgetPeriod::Weekly);
        let b = c.limits.accounts["physics"].grp_tres_mins;
        assert_eq!((b.cpu, b.gpu, b.billing), (None, Some(6000), Some(100_000)));
        let ann = wharf_controller::SchedulerAssoc::new("physics", "ann");
        assert_eq!(c.limits.users[&ann].grp_tres_mins.cpu, Some(500));
        let none: FileConfig = toml::from_str("").unwrap();
        assert_eq!(
            none.scheduler.resolve().unwrap().budget_period,
            BudgetPeriod::Monthly
        );
        let err = refused("[scheduler]\nbudget_period = \"fortnightly\"");
        assert!(
            err.contains("scheduler.budget_period \"fortnightly\": use \"never\", \"daily\""),
            "{err}"
        );
        for (text, want) in [
            (
                "[[scheduler.account]]\nname = \"a\"\ngrp_tres_mins = { gpu = -1 }",
                "grp_tres_mins",
            ),
            (
                "[[scheduler.account]]\nname = \"a\"\ngrp_tres_mins = { mem = 10 }",
                "unknown field `mem`",
            ),
            (
                "[[scheduler.account]]\nname = \"a\"\ngrp_tres_mins = { gpu = \"lots\" }",
                "grp_tres_mins",
            ),
        ] {
            let err = toml::from_str::<FileConfig>(text).unwrap_err().to_string();
            assert!(err.contains(want), "{text}: {err}");
        }
    }
}
