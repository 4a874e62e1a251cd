//! What a caller of the core does around a pass, shared by the controller and the simulator
//! so that the two cannot drift apart: the jobs it keeps, described as [`JobFacts`], become
//! the core's [`PendingJob`]s and [`RunningJob`]s (the default account and QoS, the request,
//! the time limit in ms), and a [`Plan`] becomes what happens to each job ([`apply`]: which
//! job starts where with what it is charged for, which running job is requeued or cancelled;
//! [`waiting_note`]: the reason, priority and expected start a waiting job shows).
//!
//! At submit, [`admit`] and [`admit_qos`] refuse a job that could never run as asked, with
//! the reason, and pick the partition it runs in.
//!
//! Pure, like the rest of the core: the caller passes the time and keeps its own records.

use wharf_api::array::ArrayTask;
use wharf_api::resources::format_duration;
use wharf_api::wire::ErrorKind;
use wharf_api::{JobId, PriorityView, Resources};

use crate::config::{Config, Partition, PartitionState, PreemptMode, Weights};
use crate::partition::DEFAULT_PARTITION;
use crate::plan::{Plan, Priority, Waiting};
use crate::select::Selection;
use crate::state::{Alloc, Assoc, Hold, PendingJob, RunningJob, Time};
use crate::tres::Request;

/// One job as its keeper holds it, in the terms the controller's records and the simulator's
/// workloads both have.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct JobFacts {
    /// Job id.
    pub id: JobId,
    /// The user it runs as.
    pub user: String,
    /// The account it named, if any.
    pub account: Option<String>,
    /// The partition it named, if any.
    pub partition: Option<String>,
    /// The QoS it named, if any.
    pub qos: Option<String>,
    /// Resources on each of its nodes.
    pub resources: Resources,
    /// How many nodes (0 is taken as 1).
    pub nodes: u32,
    /// Its time limit, ms.
    pub time_limit: Time,
    /// Submit time, ms (the original one for a requeued job).
    pub submit: Time,
    /// It may not start before this time, ms.
    pub begin: Option<Time>,
    /// Who holds it back, if anyone.
    pub hold: Option<Hold>,
    /// Nice: lowers its priority.
    pub nice: i32,
    /// A priority an admin fixed, if any.
    pub priority: Option<u64>,
    /// The GPU type it asks for, if any.
    pub gpu_kind: Option<String>,
    /// Which nodes it may use, and whether it takes them whole.
    pub select: Selection,
    /// It takes all the memory of each of its nodes (`--mem=0`).
    pub whole_memory: bool,
    /// A preemption that asks for a requeue may requeue it (else it is cancelled).
    pub requeue: bool,
    /// Why it went back to the queue last, in words, until it starts again.
    pub requeued_words: Option<String>,
}

/// Who a job runs for: the account it named, else its user's default account (the first
/// configured for them), else an account of the user's own name.
pub fn assoc(config: &Config, account: Option<&str>, user: &str) -> Assoc {
    let account = account
        .or_else(|| {
            config
                .users
                .iter()
                .find(|u| u.user == user)
                .map(|u| u.account.as_str())
        })
        .unwrap_or(user);
    Assoc::new(account, user)
}

/// The QoS the users of `assoc` may name, besides the default QoS (which anyone may): the
/// user association's list, else the nearest account's up the tree that sets one (Slurm's
/// association `QOS`, inherited from the parent). `None` when none sets any.
pub fn allowed_qos<'a>(config: &'a Config, assoc: &'a Assoc) -> Option<&'a [String]> {
    let l = &config.limits;
    l.users
        .get(assoc)
        .and_then(|u| u.qos.as_deref())
        .or_else(|| {
            (crate::limits::lineage(config, &assoc.account).into_iter())
                .find_map(|a| l.accounts.get(a)?.qos.as_deref())
        })
}

/// Whether the users of `assoc` may name QoS `qos` (defined, and granted: see
/// [`allowed_qos`]; anyone may name the default, and any where there are no accounts).
/// What [`admit_qos`] refuses at submit, and what holds a queued job whose grant went.
pub fn qos_granted(config: &Config, assoc: &Assoc, qos: &str) -> bool {
    config.qos.iter().any(|d| d.name == qos)
        && (config.accounts.is_empty()
            || config.limits.default_qos.as_deref() == Some(qos)
            || allowed_qos(config, assoc).is_some_and(|l| l.iter().any(|a| a == qos)))
}

/// The QoS a job runs in: the one it names, else the configured default.
pub fn qos(config: &Config, named: Option<&str>) -> Option<String> {
    named
        .map(str::to_string)
        .or_else(|| config.limits.default_qos.clone())
}

/// What a job asks the core for: `resources` on each of its `nodes` (at least one).
pub fn request(resources: Resources, nodes: u32) -> Request {
    let r = resources;
    let mut req = Request::per_node(r.cpus, r.memory, r.gpus);
    req.nodes = nodes.max(1);
    req
}

impl JobFacts {
    /// Who it runs for ([`assoc`]).
    pub fn assoc(&self, config: &Config) -> Assoc {
        assoc(config, self.account.as_deref(), &self.user)
    }

    /// How many nodes it asks for.
    pub fn node_count(&self) -> u32 {
        self.nodes.max(1)
    }

    /// The core's view of it while it waits.
    pub fn pending(&self, config: &Config) -> PendingJob {
        let mut req = request(self.resources, self.nodes);
        req.gpu_kind = self.gpu_kind.clone();
        req.whole_memory = self.whole_memory;
        let mut p = PendingJob::new(self.id, self.assoc(config), req, self.submit);
        p.time_limit = Some(self.time_limit);
        p.partition = self.partition.clone();
        p.qos = qos(config, self.qos.as_deref());
        p.begin = self.begin;
        p.hold = self.hold;
        p.nice = self.nice;
        p.priority = self.priority;
        p.select = self.select.clone();
        p
    }

    /// The core's view of it while it holds `allocs` (node, CPU ids, GPU ids, in rank order)
    /// from `start` to `start` + its time limit.
    pub fn running(
        &self,
        config: &Config,
        start: Time,
        allocs: impl IntoIterator<Item = (String, Vec<u32>, Vec<u32>)>,
        port: Option<u16>,
    ) -> RunningJob {
        RunningJob {
            id: self.id,
            assoc: self.assoc(config),
            partition: self.partition.clone(),
            qos: qos(config, self.qos.as_deref()),
            start,
            time_limit: self.time_limit,
            allocs: allocs
                .into_iter()
                .map(|(node, cpu_ids, gpu_ids)| Alloc {
                    node,
                    cpu_ids,
                    gpu_ids,
                    memory: self.resources.memory,
                })
                .collect(),
            port,
        }
    }
}

/// Keeps each throttled array's `pending` tasks to what its throttle still allows, lowest
/// task ids first (`pending` is in id order), and returns the others, which wait with
/// [`crate::PendingReason::JobArrayTaskLimit`]. `tasks` are every array task kept, each with
/// whether it holds resources now; `task_of` the array task a pending job is, if any.
/// A task that could not start now whatever its throttle (held, before its begin time,
/// waiting for a dependency) takes no place and keeps its own reason: with `%2`, two held
/// tasks must not keep the rest from running.
pub fn throttle_arrays(
    pending: &mut Vec<PendingJob>,
    tasks: impl IntoIterator<Item = (ArrayTask, bool)>,
    task_of: impl Fn(JobId) -> Option<ArrayTask>,
    now: Time,
) -> Vec<JobId> {
    let mut budget: std::collections::BTreeMap<JobId, u32> = Default::default();
    for (task, holds) in tasks {
        let Some(n) = task.throttle else {
            continue;
        };
        let left = budget.entry(task.job_id).or_insert(n);
        if holds {
            *left = left.saturating_sub(1);
        }
    }
    if budget.is_empty() {
        return Vec::new();
    }
    let mut limited = Vec::new();
    pending.retain(|p| {
        let waits_anyway =
            p.hold.is_some() || p.begin.is_some_and(|b| b > now) || !p.after.is_empty();
        let Some(task) = task_of(p.id).filter(|_| !waits_anyway) else {
            return true;
        };
        match budget.get_mut(&task.job_id) {
            Some(0) => {
                limited.push(p.id);
                false
            }
            Some(left) => {
                *left -= 1;
                true
            }
            None => true,
        }
    });
    limited
}

/// Why a job is refused at submit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The kind of error its submitter gets.
    pub kind: ErrorKind,
    /// The reason, in words that say what to change.
    pub message: String,
}

impl Refusal {
    fn new(kind: ErrorKind, message: String) -> Refusal {
        Refusal { kind, message }
    }
}

/// The partition a job that names `name` runs in: that one, else the configured default,
/// else the first; `None` when none is configured. Refused when `name` is not a partition.
pub fn partition<'c>(
    config: &'c Config,
    name: Option<&str>,
) -> Result<Option<&'c Partition>, Refusal> {
    let parts = &config.partitions;
    let wanted = name.unwrap_or_else(|| config.default_partition_name());
    if let Some(p) = parts.iter().find(|p| p.name == wanted) {
        return Ok(Some(p));
    }
    if parts.is_empty() && wanted == DEFAULT_PARTITION {
        return Ok(None);
    }
    let all = config.partitions_or_default();
    let names: Vec<&str> = all.iter().map(|p| p.name.as_str()).collect();
    Err(Refusal::new(
        ErrorKind::InvalidInput,
        format!(
            "unknown partition {wanted:?}; this cluster has: {}",
            names.join(", ")
        ),
    ))
}

/// The time limit, ms, of a job that gives none and runs in `part`: its DefaultTime, else
/// `site` (the site's default), and never over its MaxTime (as in Slurm, where a job with
/// neither gets MaxTime).
pub fn default_time(part: Option<&Partition>, site: Time) -> Time {
    crate::partition::default_limit(
        part.and_then(|p| p.default_time),
        part.and_then(|p| p.max_time),
        site,
    )
}

/// The memory per node, bytes, of a job that asks for none and has `cpus` CPUs and `gpus`
/// GPUs on each node in `part`: its DefMemPerGPU times the GPUs when the job has GPUs and it
/// is set, else its DefMemPerCPU times the CPUs when that is set, else `site` (the site's
/// default).
pub fn default_memory(part: Option<&Partition>, cpus: u32, gpus: u32, site: u64) -> u64 {
    let per_gpu = part
        .and_then(|p| p.def_mem_per_gpu)
        .filter(|_| gpus > 0)
        .map(|m| m.saturating_mul(u64::from(gpus)));
    let per_cpu = || {
        part.and_then(|p| p.def_mem_per_cpu)
            .map(|m| m.saturating_mul(u64::from(cpus.max(1))))
    };
    per_gpu.or_else(per_cpu).unwrap_or(site)
}

/// Refuses a job whose memory per CPU, or per GPU when it has GPUs, is over `part`'s
/// MaxMemPerCPU or MaxMemPerGPU. (Slurm may raise the job's CPUs instead; Wharf says what to
/// change.)
fn admit_memory(job: &JobFacts, part: &Partition) -> Result<(), Refusal> {
    let r = job.resources;
    let fmt = wharf_api::resources::format_memory;
    for (max, count, what, key) in [
        (part.max_mem_per_cpu, r.cpus, "CPU", "MaxMemPerCPU"),
        (part.max_mem_per_gpu, r.gpus, "GPU", "MaxMemPerGPU"),
    ] {
        let Some(max) = max else { continue };
        if count == 0 || r.memory <= max.saturating_mul(u64::from(count)) {
            continue;
        }
        return Err(Refusal::new(
            ErrorKind::InvalidInput,
            format!(
                "memory {} per node on {count} {what}{} is {} per {what}, over partition {}'s \
                 {key} of {}; ask for less memory or more {what}s",
                fmt(r.memory),
                if count == 1 { "" } else { "s" },
                fmt(r.memory.div_ceil(u64::from(count))),
                part.name,
                fmt(max)
            ),
        ));
    }
    Ok(())
}

/// The partition `job` runs in ([`partition`]), or why it is refused: its partition does not
/// exist, takes no new jobs, allows less time than it asks for, less memory per CPU or GPU,
/// or has fewer nodes than it asks for (its MaxNodes, its node list, or when it names none
/// the `registered` nodes; nothing is refused for its node count before any node has
/// joined). Who may use the partition is the caller's to check: it knows users' groups.
pub fn admit<'c>(
    config: &'c Config,
    job: &JobFacts,
    registered: usize,
) -> Result<Option<&'c Partition>, Refusal> {
    let Some(part) = partition(config, job.partition.as_deref())? else {
        admit_node_count(job, None, registered)?;
        return Ok(None);
    };
    if matches!(part.state, PartitionState::Drain | PartitionState::Inactive) {
        return Err(Refusal::new(
            ErrorKind::Unavailable,
            format!(
                "partition {} takes no new jobs (it is {}); choose another with --partition",
                part.name,
                if part.state == PartitionState::Drain {
                    "draining"
                } else {
                    "inactive"
                }
            ),
        ));
    }
    if let Some(max) = part.max_time {
        if job.time_limit > max {
            return Err(Refusal::new(
                ErrorKind::InvalidInput,
                format!(
                    "`time` {} is over partition {}'s maximum of {}; ask for less time",
                    format_duration(job.time_limit / 1000),
                    part.name,
                    format_duration(max / 1000)
                ),
            ));
        }
    }
    admit_memory(job, part)?;
    admit_node_count(job, Some(part), registered)?;
    Ok(Some(part))
}

/// Refuses a gang job that asks for more nodes than its partition's MaxNodes, or than its
/// partition has (the `registered` nodes when it names none).
fn admit_node_count(
    job: &JobFacts,
    part: Option<&Partition>,
    registered: usize,
) -> Result<(), Refusal> {
    let name = part.map_or(DEFAULT_PARTITION, |p| p.name.as_str());
    if let Some(max) = part.and_then(|p| p.max_nodes) {
        if job.nodes > max {
            return Err(Refusal::new(
                ErrorKind::InvalidInput,
                format!(
                    "`nodes` = {} is over partition {name}'s MaxNodes of {max}; ask for fewer \
                     nodes or another partition",
                    job.nodes
                ),
            ));
        }
    }
    let has = match part {
        Some(p) if !p.nodes.is_empty() => p.nodes.len(),
        _ => registered,
    };
    if has > 0 && job.nodes as usize > has {
        return Err(Refusal::new(
            ErrorKind::InvalidInput,
            format!(
                "`nodes` = {}: partition {name} has {has} node{}, and a job's nodes are all \
                 allocated at once; ask for at most {has}",
                job.nodes,
                if has == 1 { "" } else { "s" }
            ),
        ));
    }
    Ok(())
}

/// Refuses an unknown QoS, and a negative nice from anyone but an admin (it would raise the
/// job above others).
pub fn admit_qos(
    config: &Config,
    qos: Option<&str>,
    nice: i32,
    admin: bool,
    assoc: &Assoc,
) -> Result<(), Refusal> {
    if let Some(q) = qos {
        if !config.qos.iter().any(|d| d.name == q) {
            let known: Vec<&str> = config.qos.iter().map(|d| d.name.as_str()).collect();
            let has = if known.is_empty() {
                "none is configured".to_string()
            } else {
                format!("this cluster has: {}", known.join(", "))
            };
            return Err(Refusal::new(
                ErrorKind::InvalidInput,
                format!("unknown QoS {q:?}; {has}"),
            ));
        }
        // Granted per association once there are associations (as accounts are enforced
        // then, see the controller's `check_account`); a cluster without accounts has
        // nobody to grant a QoS to, and any may be named.
        if !admin && !qos_granted(config, assoc, q) {
            let default = config.limits.default_qos.as_deref();
            let allowed = allowed_qos(config, assoc);
            let may = match (allowed.filter(|l| !l.is_empty()), default) {
                (Some(l), _) => format!("it may use {}", l.join(", ")),
                (None, Some(d)) => format!("it may use the default QoS {d} only"),
                (None, None) => "it may name no QoS".into(),
            };
            let (user, account) = (&assoc.user, &assoc.account);
            return Err(Refusal::new(
                ErrorKind::PermissionDenied,
                format!(
                    "QoS {q} is not allowed for user {user} in account {account}: {may}; an \
                     admin allows it with `wharf admin account modify {account} --qos LIST` \
                     (or `wharf admin user modify {user} --account {account} --qos LIST`)"
                ),
            ));
        }
    }
    if nice < 0 && !admin {
        return Err(Refusal::new(
            ErrorKind::PermissionDenied,
            format!(
                "--nice {nice} would raise the job's priority; only an admin may; use 0 or more"
            ),
        ));
    }
    Ok(())
}

/// A job that starts now.
#[derive(Debug, Clone, PartialEq)]
pub struct Launch {
    /// Job id.
    pub job: JobId,
    /// What it holds on each of its nodes, in rank order.
    pub allocs: Vec<Alloc>,
    /// Its rendezvous port.
    pub port: Option<u16>,
    /// Its time limit, ms: it is killed there if still running.
    pub time_limit: Time,
    /// What it holds and is charged for on each node from now on: what it asked for, or for a
    /// whole-node job all of its first node (a gang's whole nodes are taken to be alike).
    pub resources: Resources,
}

/// A running job to stop for a waiting one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stopping {
    /// The job to stop.
    pub job: JobId,
    /// The job it makes room for.
    pub by: JobId,
    /// Requeued (keeping its original submit time) rather than cancelled.
    pub requeue: bool,
}

/// What a plan makes of the jobs it names.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Applied {
    /// Jobs that start, in the order the core decided them.
    pub launches: Vec<Launch>,
    /// Running jobs to stop, in the order decided.
    pub stops: Vec<Stopping>,
}

/// What `plan` makes of the jobs `facts` knows; a start or preemption of a job it does not
/// know (gone since the state was built) is left out.
pub fn apply<'a>(plan: &Plan, facts: impl Fn(JobId) -> Option<&'a JobFacts>) -> Applied {
    let mut applied = Applied::default();
    for start in &plan.starts {
        let (Some(job), Some(first)) = (facts(start.job), start.allocs.first()) else {
            continue;
        };
        let resources = if job.select.exclusive || job.whole_memory {
            Resources {
                cpus: first.cpu_ids.len() as u32,
                memory: first.memory,
                gpus: first.gpu_ids.len() as u32,
            }
        } else {
            job.resources
        };
        applied.launches.push(Launch {
            job: start.job,
            allocs: start.allocs.clone(),
            port: start.port,
            time_limit: start.time_limit,
            resources,
        });
    }
    for p in &plan.preemptions {
        let Some(job) = facts(p.job) else {
            continue;
        };
        applied.stops.push(Stopping {
            job: p.job,
            by: p.by,
            requeue: p.mode == PreemptMode::Requeue && job.requeue,
        });
    }
    applied
}

/// What a waiting job shows after a pass.
#[derive(Debug, Clone, PartialEq)]
pub struct WaitNote {
    /// Its priority, factor by factor, as `sprio` shows it.
    pub priority: Option<PriorityView>,
    /// When it is expected to start, ms, when the plan gave it a time (see
    /// [`crate::Waiting::estimated_start`]).
    pub expected_start: Option<Time>,
    /// Why it waits, in words other users may see too (made of public fields only:
    /// resources, limits, partition and job ids).
    pub reason: String,
}

/// What `wait`, one of `plan`'s waiting jobs, shows at `now`; `job` is what its keeper knows
/// of it, if anything.
pub fn waiting_note(
    plan: &Plan,
    wait: &Waiting,
    now: Time,
    weights: &Weights,
    job: Option<&JobFacts>,
) -> WaitNote {
    let reason = match wait.estimated_start {
        Some(at) => format!(
            "{}; expected to start in about {}",
            wait.reason,
            format_duration(at.saturating_sub(now) / 1000)
        ),
        None => wait.reason.to_string(),
    };
    let reason = match job.map(JobFacts::node_count) {
        Some(n) if n > 1 => gang_words(reason, n),
        _ => reason,
    };
    // Until it starts again, a requeued job says why it is back in the queue.
    let reason = match job.and_then(|j| j.requeued_words.as_deref()) {
        Some(words) => format!("{reason}; {words}"),
        None => reason,
    };
    WaitNote {
        priority: plan.priority(wait.job).map(|p| sprio(p, weights)),
        expected_start: wait.estimated_start,
        reason,
    }
}

/// A pending gang job's reason says that all of its nodes must be free at once.
fn gang_words(reason: String, nodes: u32) -> String {
    if reason.starts_with("Resources:") || reason.starts_with("Priority:") {
        format!("{reason} (it needs {nodes} nodes at once, all started together)")
    } else {
        reason
    }
}

/// A priority the way `sprio` shows it: each factor times its weight.
pub fn sprio(p: &Priority, w: &Weights) -> PriorityView {
    let weighted = |weight: u32, factor: f64| (weight as f64 * factor).round() as u64;
    PriorityView {
        total: p.value,
        age: weighted(w.age, p.age),
        fairshare: weighted(w.fairshare, p.fairshare),
        job_size: weighted(w.job_size, p.job_size),
        width: weighted(w.width, p.width),
        partition: weighted(w.partition, p.partition),
        qos: weighted(w.qos, p.qos),
        nice: p.nice.into(),
        fixed: p.fixed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::UserShares;
    use crate::plan::{Preemption, Start};
    use crate::PendingReason;

    fn facts(id: JobId) -> JobFacts {
        JobFacts {
            id,
            user: "ann".into(),
            resources: Resources {
                cpus: 2,
                memory: 1 << 30,
                gpus: 1,
            },
            nodes: 1,
            time_limit: 60_000,
            submit: 5,
            requeue: true,
            ..JobFacts::default()
        }
    }

    #[test]
    fn a_job_runs_for_its_named_account_else_its_default_else_its_own() {
        let mut c = Config::default();
        assert_eq!(assoc(&c, None, "ann"), Assoc::new("ann", "ann"));
        c.users.push(UserShares {
            user: "ann".into(),
            account: "physics".into(),
            shares: 1,
        });
        assert_eq!(assoc(&c, None, "ann"), Assoc::new("physics", "ann"));
        assert_eq!(assoc(&c, Some("chem"), "ann"), Assoc::new("chem", "ann"));
        c.limits.default_qos = Some("normal".into());
        assert_eq!(qos(&c, None).as_deref(), Some("normal"));
        assert_eq!(qos(&c, Some("high")).as_deref(), Some("high"));
    }

    #[test]
    fn a_job_without_a_time_gets_its_partitions_default_never_over_its_maximum() {
        const H: Time = 3_600_000;
        let mut p = Partition::new("short", &[]);
        assert_eq!(default_time(None, H), H);
        assert_eq!(default_time(Some(&p), H), H, "no default: the site's");
        p.max_time = Some(H / 2);
        assert_eq!(default_time(Some(&p), H), H / 2, "capped at MaxTime");
        p.default_time = Some(H / 4);
        assert_eq!(default_time(Some(&p), H), H / 4);
        p.default_time = Some(2 * H);
        assert_eq!(default_time(Some(&p), H), H / 2);
    }

    #[test]
    fn a_job_without_memory_gets_its_partitions_default_per_gpu_else_per_cpu() {
        const G: u64 = 1 << 30;
        let mut p = Partition::new("gpu", &[]);
        assert_eq!(default_memory(Some(&p), 4, 2, G), G, "none set: the site's");
        p.def_mem_per_cpu = Some(2 * G);
        assert_eq!(default_memory(Some(&p), 4, 2, G), 8 * G);
        p.def_mem_per_gpu = Some(40 * G);
        assert_eq!(default_memory(Some(&p), 4, 2, G), 80 * G);
        assert_eq!(default_memory(Some(&p), 4, 0, G), 8 * G, "no GPUs: per CPU");
        assert_eq!(default_memory(None, 4, 2, G), G);
    }

    #[test]
    fn memory_over_the_partitions_maximum_per_cpu_or_gpu_is_refused_naming_both() {
        let mut c = Config::default();
        let mut p = Partition::new("gpu", &[]);
        p.max_mem_per_cpu = Some(1 << 30);
        p.max_mem_per_gpu = Some(4 << 30);
        c.partitions = vec![p];
        let mut job = facts(1);
        job.resources.memory = 2 << 30; // 1G per CPU, 2G per GPU
        assert!(admit(&c, &job, 1).is_ok());
        job.resources.memory = 3 << 30;
        let r = admit(&c, &job, 1).unwrap_err();
        assert_eq!(r.kind, ErrorKind::InvalidInput);
        assert!(
            r.message.contains(
                "memory 3G per node on 2 CPUs is 1.5G per CPU, over partition gpu's \
                 MaxMemPerCPU of 1G"
            ),
            "{}",
            r.message
        );
        job.resources.cpus = 8;
        job.resources.memory = 6 << 30;
        let r = admit(&c, &job, 1).unwrap_err();
        assert!(
            r.message
                .contains("over partition gpu's MaxMemPerGPU of 4G"),
            "{}",
            r.message
        );
    }

    #[test]
    fn a_job_that_could_never_run_is_refused_with_its_reason() {
        let mut c = Config::default();
        let mut gang = facts(1);
        gang.nodes = 3;
        let refused = admit(&c, &gang, 2).unwrap_err();
        assert_eq!(refused.kind, ErrorKind::InvalidInput);
        assert!(
            refused.message.contains("partition default has 2 nodes"),
            "{}",
            refused.message
        );
        assert_eq!(admit(&c, &gang, 0), Ok(None), "no node has joined yet");
        let mut gpu = Partition::new("gpu", &["g1", "g2", "g3"]);
        gpu.max_time = Some(30_000);
        c.partitions = vec![Partition::new("cpu", &[]), gpu];
        let mut long = facts(2);
        long.partition = Some("gpu".into());
        let refused = admit(&c, &long, 5).unwrap_err();
        assert!(refused.message.contains("over partition gpu's maximum"));
        long.time_limit = 30_000;
        assert_eq!(
            admit(&c, &long, 5).unwrap().map(|p| p.name.as_str()),
            Some("gpu")
        );
        assert_eq!(
            admit(&c, &facts(3), 5).unwrap().map(|p| p.name.as_str()),
            Some("cpu"),
            "no partition named: the first"
        );
        long.partition = Some("tpu".into());
        assert!(admit(&c, &long, 5)
            .unwrap_err()
            .message
            .contains("cpu, gpu"));
        c.partitions[0].state = PartitionState::Drain;
        assert_eq!(
            admit(&c, &facts(4), 5).unwrap_err().kind,
            ErrorKind::Unavailable
        );
        let ann = Assoc::new("lab", "ann");
        assert_eq!(
            admit_qos(&c, Some("high"), 0, false, &ann)
                .unwrap_err()
                .kind,
            ErrorKind::InvalidInput
        );
        assert_eq!(
            admit_qos(&c, None, -5, false, &ann).unwrap_err().kind,
            ErrorKind::PermissionDenied
        );
        assert_eq!(admit_qos(&c, None, -5, true, &ann), Ok(()));
    }

    /// A QoS may preempt others' jobs or raise priority: a user names one only when their
    /// association allows it (its own list, else the nearest account's up the tree), as in
    /// Slurm; the default QoS anyone may; an admin any. Before, any user could name any QoS.
    /// A cluster without accounts has no associations to grant one: any may be named.
    #[test]
    fn a_user_names_only_the_qos_their_association_allows() {
        use crate::limits::AssocLimits;
        let mut c = Config::default();
        for q in ["normal", "high", "scavenger"] {
            c.qos.push(crate::Qos {
                name: q.into(),
                priority: 0,
            });
        }
        c.limits.default_qos = Some("normal".into());
        let nobody = Assoc::new("ann", "ann");
        assert_eq!(admit_qos(&c, Some("high"), 0, false, &nobody), Ok(()));
        c.accounts = vec![
            crate::Account {
                name: "cs".into(),
                parent: None,
                shares: 1,
            },
            crate::Account {
                name: "lab".into(),
                parent: Some("cs".into()),
                shares: 1,
            },
        ];
        let (ann, bob) = (Assoc::new("lab", "ann"), Assoc::new("lab", "bob"));
        let kind = |c: &Config, q: &str, who: &Assoc| {
            admit_qos(c, Some(q), 0, false, who).err().map(|e| e.kind)
        };
        // No list anywhere: the default QoS only.
        assert_eq!(kind(&c, "normal", &ann), None);
        let e = admit_qos(&c, Some("high"), 0, false, &ann).unwrap_err();
        assert_eq!(e.kind, ErrorKind::PermissionDenied);
        assert!(
            e.message
                .contains("QoS high is not allowed for user ann in account lab")
                && e.message.contains("the default QoS normal only")
                && e.message.contains("wharf admin account modify lab --qos"),
            "{}",
            e.message
        );
        assert_eq!(admit_qos(&c, Some("high"), 0, true, &ann), Ok(()));
        // The parent account's list holds for its sub-accounts.
        c.limits.accounts.insert(
            "cs".into(),
            AssocLimits {
                qos: Some(vec!["scavenger".into()]),
                ..Default::default()
            },
        );
        assert_eq!(kind(&c, "scavenger", &ann), None);
        assert_eq!(kind(&c, "high", &ann), Some(ErrorKind::PermissionDenied));
        // A user's own list wins over the accounts'.
        c.limits.users.insert(
            ann.clone(),
            AssocLimits {
                qos: Some(vec!["high".into()]),
                ..Default::default()
            },
        );
        assert_eq!(kind(&c, "high", &ann), None);
        assert_eq!(
            kind(&c, "scavenger", &ann),
            Some(ErrorKind::PermissionDenied)
        );
        assert_eq!(kind(&c, "high", &bob), Some(ErrorKind::PermissionDenied));
        assert_eq!(kind(&c, "normal", &bob), None);
    }

    #[test]
    fn a_throttled_array_runs_no_more_tasks_at_once_than_its_throttle_lowest_first() {
        let task = |id: JobId| ArrayTask {
            job_id: 10,
            task_id: (id - 10) as u32,
            throttle: Some(2),
            shape: Default::default(),
        };
        // Task 10 runs; 11, 12 and 13 wait, as does job 20 of no array.
        let mut pending: Vec<PendingJob> = [11, 12, 13, 20]
            .iter()
            .map(|&id| facts(id).pending(&Config::default()))
            .collect();
        let tasks = [
            (task(10), true),
            (task(11), false),
            (task(12), false),
            (task(13), false),
        ];
        let task_of = |id| (10..20).contains(&id).then(|| task(id));
        let limited = throttle_arrays(&mut pending.clone(), tasks, task_of, 0);
        assert_eq!(limited, vec![12, 13]);
        let mut kept = pending.clone();
        throttle_arrays(&mut kept, tasks, task_of, 0);
        let left: Vec<JobId> = kept.iter().map(|p| p.id).collect();
        assert_eq!(left, vec![11, 20]);
        // Tasks that could not start anyway (held, not yet begun, waiting for a dependency)
        // take no place: 13, the next that could, takes the one left, and they stay in the
        // pass, for their own reasons.
        pending[0].hold = Some(crate::Hold::User);
        pending[1].begin = Some(100);
        let limited = throttle_arrays(&mut pending.clone(), tasks, task_of, 50);
        assert_eq!(limited, Vec::<JobId>::new());
        pending[2].after = vec![20];
        pending.push(facts(14).pending(&Config::default()));
        let mut tasks = tasks.to_vec();
        tasks.push((task(14), false));
        let limited = throttle_arrays(&mut pending, tasks, task_of, 50);
        assert_eq!(limited, Vec::<JobId>::new());
        let left: Vec<JobId> = pending.iter().map(|p| p.id).collect();
        assert_eq!(left, vec![11, 12, 13, 20, 14]);
    }

    #[test]
    fn pending_and_running_carry_the_facts_in_the_cores_terms() {
        let c = Config::default();
        let mut f = facts(7);
        f.nodes = 0;
        let p = f.pending(&c);
        assert_eq!(p.request.nodes, 1, "no node count is one node");
        assert_eq!(p.time_limit, Some(60_000));
        assert_eq!(p.submit, 5);
        let r = f.running(&c, 100, [("n1".to_string(), vec![0, 1], vec![3])], None);
        assert_eq!(r.allocs[0].memory, 1 << 30);
        assert_eq!((r.start, r.time_limit), (100, 60_000));
    }

    #[test]
    fn a_whole_node_job_is_charged_for_its_node_and_a_preemption_requeues_only_if_allowed() {
        let mut whole = facts(1);
        whole.select.exclusive = true;
        let mut no_requeue = facts(2);
        no_requeue.requeue = false;
        let jobs = [whole, no_requeue, facts(3)];
        let alloc = Alloc {
            node: "n1".into(),
            cpu_ids: (0..8).collect(),
            gpu_ids: vec![0, 1, 3],
            memory: 16 << 30,
        };
        let plan = Plan {
            starts: vec![Start {
                job: 1,
                allocs: vec![alloc],
                time_limit: 60_000,
                port: Some(29_500),
            }],
            preemptions: vec![
                Preemption {
                    job: 2,
                    by: 1,
                    mode: PreemptMode::Requeue,
                },
                Preemption {
                    job: 3,
                    by: 1,
                    mode: PreemptMode::Requeue,
                },
                Preemption {
                    job: 9,
                    by: 1,
                    mode: PreemptMode::Requeue,
                },
            ],
            ..Plan::default()
        };
        let applied = apply(&plan, |id| jobs.iter().find(|j| j.id == id));
        let r = applied.launches[0].resources;
        assert_eq!((r.cpus, r.memory, r.gpus), (8, 16 << 30, 3));
        assert_eq!(applied.launches[0].port, Some(29_500));
        let requeues: Vec<(JobId, bool)> =
            applied.stops.iter().map(|s| (s.job, s.requeue)).collect();
        assert_eq!(requeues, vec![(2, false), (3, true)], "job 9 is unknown");
    }

    #[test]
    fn a_waiting_gang_says_it_needs_all_its_nodes_and_a_requeued_job_why_it_is_back() {
        let mut f = facts(4);
        f.nodes = 2;
        f.requeued_words = Some("requeued after node n1 failed".into());
        let wait = Waiting {
            job: 4,
            reason: PendingReason::Resources,
            estimated_start: Some(61_000),
        };
        let note = waiting_note(
            &Plan::default(),
            &wait,
            1_000,
            &Weights::default(),
            Some(&f),
        );
        assert!(
            note.reason.contains("expected to start in about 00:01:00")
                && note.reason.contains("(it needs 2 nodes at once")
                && note.reason.ends_with("; requeued after node n1 failed"),
            "{}",
            note.reason
        );
        assert_eq!(note.expected_start, Some(61_000));
        assert_eq!(note.priority, None, "not in the plan's priorities");
    }
}
