//! Jobs: what a user asks for ([`JobRequest`]), what the controller accepts ([`JobSpec`]), and
//! the record of a job's life ([`JobRecord`]).
//!
//! ```text
//!   Pending ──schedule──▶ Starting ──every rank started──▶ Running ──exit──▶ Completed | Failed
//!      │  ▲                  │                            │           ▲  OutOfMemory | Timeout
//!      │  │                  │ launch failed, stopped     │ cancel,   │  Cancelled | Preempted
//!      ▼  │                  ▼                            ▼ preempt   │
//!   Cancelled             NodeFail | Failed            (kill sent) ───┘   node lost ─▶ NodeFail
//!         │                                               │              (or requeued)
//!         └──── requeued (preempted, `wharf requeue`, ◀───┘
//!                         node lost)
//! ```
//!
//! A job on several nodes (a gang) runs its tasks on each (one, or `tasks_per_node`, each in
//! its own sandbox); it ends once every task has, as the controller's `cluster/gang.rs`
//! describes.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::pending::PendingReason;

use crate::hostlist::HostList;
use crate::resources::{
    format_duration, format_memory, parse_memory, parse_memory_or_whole, parse_time_limit,
    Resources, UNLIMITED_TIME,
};

/// A job's number, unique for the life of the controller's store.
pub type JobId = u64;

/// Largest script accepted: the kernel's limit for one argument (MAX_ARG_STRLEN, 128 KiB
/// counting the NUL that ends it).
pub const MAX_SCRIPT_BYTES: usize = 128 * 1024 - 1;
/// Largest number of command words.
pub const MAX_ARGS: usize = 4096;
/// Largest number of environment variables a job may set.
pub const MAX_ENV: usize = 1024;
/// Longest job name.
pub const MAX_NAME: usize = 128;

/// Refuses a job name that is empty, longer than [`MAX_NAME`] bytes or holds a character a
/// terminal would act on, as at submit and at `wharf update --name`.
pub fn check_job_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > MAX_NAME || name.chars().any(crate::text::is_unsafe) {
        return Err(format!(
            "`name` must be 1 to {MAX_NAME} printable characters"
        ));
    }
    Ok(())
}

/// The options a user gives for a job, from a TOML job file, `#WHARF` lines or CLI flags. All
/// optional: the controller fills defaults and validates ([`JobRequest::resolve`]).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobRequest {
    /// Job name (default: the command or script name).
    pub name: Option<String>,
    /// Image: a name in the node's image store, or `host` for the node's own filesystem.
    pub image: Option<String>,
    /// Command and arguments, run directly.
    pub command: Option<Vec<String>>,
    /// A script, run under the interpreter its `#!` line names, else `/bin/sh` (see
    /// [`script_argv`]).
    pub script: Option<String>,
    /// CPUs per task (`cpus_per_task` is the same); a node gives the job this many times its
    /// tasks per node.
    #[serde(alias = "cpus_per_task")]
    pub cpus: Option<u32>,
    /// Memory per node in bytes (job files may write `"4G"`); 0 takes all of each node's
    /// memory, as Slurm's `--mem=0`.
    #[serde(default, deserialize_with = "de_memory")]
    pub memory: Option<u64>,
    /// Memory per CPU in bytes (Slurm's `--mem-per-cpu`): the node's memory is this times the
    /// job's CPUs there. Excludes `memory` and `mem_per_gpu`.
    #[serde(
        default,
        deserialize_with = "de_memory",
        skip_serializing_if = "Option::is_none"
    )]
    pub mem_per_cpu: Option<u64>,
    /// Memory per GPU in bytes (Slurm's `--mem-per-gpu`): the node's memory is this times the
    /// job's GPUs there. Excludes `memory` and `mem_per_cpu`.
    #[serde(
        default,
        deserialize_with = "de_memory",
        skip_serializing_if = "Option::is_none"
    )]
    pub mem_per_gpu: Option<u64>,
    /// GPUs per node (`gpus_per_node` is the same).
    #[serde(alias = "gpus_per_node")]
    pub gpus: Option<u32>,
    /// GPUs for the whole job (Slurm's `--gpus`/`-G`): split evenly over its nodes, which
    /// must divide it; set with `gpus` only if they agree.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpus_total: Option<u32>,
    /// GPUs per task (Slurm's `--gpus-per-task`): each task sees only its own; the job gets
    /// this many times its tasks per node on each node. Without it every task of a node sees
    /// all the job's GPUs there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpus_per_task: Option<u32>,
    /// Time limit in seconds (job files may write `"30m"` or `"1:00:00"`); `UNLIMITED`
    /// ([`UNLIMITED_TIME`]) asks for the partition's maximum.
    #[serde(default, deserialize_with = "de_time")]
    pub time: Option<u64>,
    /// Number of nodes, all allocated at once and launched together.
    pub nodes: Option<u32>,
    /// Tasks in all (Slurm's `--ntasks`): `nodes` times the tasks per node; either of those
    /// left out is derived from it, as Slurm does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ntasks: Option<u32>,
    /// Tasks per node (Slurm's `--ntasks-per-node`, default 1): each in its own sandbox on
    /// its node, same image, same user.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ntasks_per_node: Option<u32>,
    /// Working directory inside the job (default: the directory `wharf submit` ran in).
    pub workdir: Option<String>,
    /// Standard output file; `%j` is the job id, `%x` the job name (default `wharf-%j.out`).
    pub output: Option<String>,
    /// Standard error file (default: the output file).
    pub error: Option<String>,
    /// Extra environment variables.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Needs the node's RDMA devices (`/dev/infiniband/*`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rdma: Option<bool>,
    /// Extra binds, `SOURCE:DEST[:ro]`; each source must lie under a path the node's admin
    /// allows (`[agent] allowed_mounts`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mounts: Vec<String>,
    /// Run as root inside the container (the user's own id outside; still no capabilities).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remap_root: Option<bool>,
    /// A writable root: the image under a per-job layer the job may change (in memory, counted
    /// against its memory limit, gone when it ends). Images only, not the node's own root.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub writable: Option<bool>,
    /// Locked memory the job needs, bytes (`u64::MAX` = unlimited; job files may write
    /// `"unlimited"` or `"64G"`). A node that cannot give it fails the job at once, saying so.
    #[serde(
        default,
        deserialize_with = "de_memlock",
        skip_serializing_if = "Option::is_none"
    )]
    pub memlock: Option<u64>,
    /// Partition to run in (default: the site's default partition).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition: Option<String>,
    /// Account to charge (default: the user's default account).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub account: Option<String>,
    /// Quality of service (default: none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub qos: Option<String>,
    /// GPU type (`h100` in `--gpus h100:2`); none: any type.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_type: Option<String>,
    /// Slurm's nice: subtracted from the priority; negative values are for admins.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nice: Option<i32>,
    /// Not before this time (`now+1h`, `2026-12-01T08:00` UTC).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub begin: Option<crate::forms::Begin>,
    /// Submit held: the job waits until its owner releases it (`wharf release`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hold: Option<bool>,
    /// Start only after other jobs (`afterok:12`, `after:12:13,afterany:14`, `singleton`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dependency: Option<crate::dependency::Dependency>,
    /// A job array: one job per task (`0-99`, `1,3,5`, `0-15:4`, `%8` at most 8 at once).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub array: Option<crate::array::ArraySpec>,
    /// Node features the job needs: `ib&nvme` (all), `a100|h100` (any).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub constraint: Option<String>,
    /// Host list of the nodes the job runs on, every one of them (`gpu[01-04]`: 4 nodes, its
    /// node count raised to theirs, as in Slurm); none: any node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodelist: Option<String>,
    /// Host list of nodes the job must not run on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exclude: Option<String>,
    /// The job takes its nodes whole: all their CPUs, memory and GPUs, shared with no job.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exclusive: Option<bool>,
    /// May be requeued when preempted or when a node of it is lost (default yes;
    /// `--no-requeue` makes a preemption in requeue mode end it PREEMPTED, a lost node
    /// NODE_FAIL).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requeue: Option<bool>,
    /// Its command runs once, as rank 0 on its first node, as sbatch runs a batch script; its
    /// other tasks run nothing and hold their share of their nodes for its steps (`srun`).
    /// Default no (the command runs in every task, as srun runs one); a script with `#SBATCH`
    /// lines says yes unless told otherwise (`--every-task`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub once: Option<bool>,
    /// The script's arguments, its `$1`, `$2`, ... (`wharf submit script.sh ARG...`, as
    /// sbatch passes them); only with `script`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// sbatch options read but not honoured, each with why (`--mail-type (Wharf sends no
    /// mail)`): `wharf submit` warns of them once. Never sent.
    #[serde(skip)]
    pub ignored: Vec<String>,
    /// `--parsable`: `wharf submit` prints only the job's id. Never sent.
    #[serde(skip)]
    pub parsable: bool,
    /// `--wait`: `wharf submit` returns once the job has ended, with its exit status. Never
    /// sent.
    #[serde(skip)]
    pub wait: bool,
}

fn de_memlock<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    de_quantity(d, None, parse_memlock)
}

/// A quantity written as a number or as text (`"4G"`, `"30m"`): numbers must be at least 1
/// unless `zero_msg` is `None`, text goes through `parse`.
fn de_quantity<'de, D: serde::Deserializer<'de>>(
    d: D,
    zero_msg: Option<&str>,
    parse: fn(&str) -> Result<u64, String>,
) -> Result<Option<u64>, D::Error> {
    enum Raw {
        Int(u64),
        Text(String),
    }
    /// A whole number of at least 0 or text; anything else is refused naming what it was
    /// (before, "did not match any variant of untagged enum").
    struct Quantity;
    impl<'de> serde::de::Visitor<'de> for Quantity {
        type Value = Option<Raw>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a whole number, or text such as \"30m\" or \"4G\"")
        }
        fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Self::Value, E> {
            Ok(Some(Raw::Int(v)))
        }
        fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Self::Value, E> {
            u64::try_from(v).map(|v| Some(Raw::Int(v))).map_err(|_| {
                E::custom(format!(
                    "{v} is negative; give a whole number of at least 0, or text such as \"30m\" \
                     or \"4G\""
                ))
            })
        }
        fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Self::Value, E> {
            Err(E::custom(format!(
                "{v} is not a whole number; give one, or text such as \"1.5G\" or \"90m\""
            )))
        }
        fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Self::Value, E> {
            Ok(Some(Raw::Text(v.to_string())))
        }
        fn visit_none<E: serde::de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_unit<E: serde::de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_some<D2: serde::Deserializer<'de>>(self, d: D2) -> Result<Self::Value, D2::Error> {
            d.deserialize_any(Quantity)
        }
    }
    match d.deserialize_option(Quantity)? {
        None => Ok(None),
        Some(Raw::Int(0)) if zero_msg.is_some() => {
            Err(serde::de::Error::custom(zero_msg.unwrap_or_default()))
        }
        Some(Raw::Int(v)) => Ok(Some(v)),
        Some(Raw::Text(t)) => parse(&t).map(Some).map_err(serde::de::Error::custom),
    }
}

/// Parses a memlock need: `unlimited` or a size.
pub fn parse_memlock(text: &str) -> Result<u64, String> {
    parse_limit(text).map_err(|e| format!("memlock: {e}"))
}

/// Parses a resource limit: `unlimited` (or `infinity`, as ulimit says it; `u64::MAX`) or a
/// size.
pub fn parse_limit(text: &str) -> Result<u64, String> {
    let word = text.trim();
    if word.eq_ignore_ascii_case("unlimited") || word.eq_ignore_ascii_case("infinity") {
        Ok(u64::MAX)
    } else {
        parse_memory(text).map_err(|e| format!("{e} (or \"unlimited\")"))
    }
}

fn de_memory<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    de_quantity(d, None, parse_memory_or_whole)
}

fn de_time<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    de_quantity(d, Some("time must be greater than zero"), parse_time_limit)
}

/// Site defaults and ceilings applied when a request is resolved.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobDefaults {
    /// CPUs when the job names none.
    pub cpus: u32,
    /// Memory when the job names none.
    pub memory: u64,
    /// Time limit when the job names none.
    pub time: u64,
    /// Longest time limit accepted.
    pub max_time: u64,
    /// Image when the job names none.
    pub image: String,
    /// Most CPUs, memory and GPUs one job may ask for; an axis left `None` is bounded by the
    /// largest node ever registered (see [`crate::limits::fits_some_node`]).
    #[serde(default)]
    pub max_resources: crate::limits::Ceiling,
    /// Most bytes of environment (names and values) a job may set.
    #[serde(default = "crate::limits::default_env_bytes")]
    pub max_env_bytes: usize,
    /// Most bytes of command (all words together) or script a job may have.
    #[serde(default = "crate::limits::default_command_bytes")]
    pub max_command_bytes: usize,
}

impl JobDefaults {
    /// The time limit of a job that gives none, before its partition's DefaultTime: the
    /// site's default, never over its maximum. Seconds.
    pub fn site_time(&self) -> u64 {
        self.time.min(self.max_time)
    }
}

impl Default for JobDefaults {
    fn default() -> Self {
        JobDefaults {
            cpus: 1,
            memory: 1 << 30,
            time: 3600,
            max_time: 7 * 86400,
            image: "host".into(),
            max_resources: crate::limits::Ceiling::default(),
            max_env_bytes: crate::limits::default_env_bytes(),
            max_command_bytes: crate::limits::default_command_bytes(),
        }
    }
}

/// A validated job, as stored and as sent to agents.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobSpec {
    /// Job name.
    pub name: String,
    /// Image name, or `host`.
    pub image: String,
    /// Argument vector of the job's first process.
    pub argv: Vec<String>,
    /// Absolute working directory.
    pub workdir: String,
    /// The directory the job was submitted from (`SLURM_SUBMIT_DIR`), which `--chdir` does
    /// not change; empty in jobs stored before it was kept: their working directory.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub submit_dir: String,
    /// Environment set by the job (Wharf adds its own `WHARF_*` variables at launch).
    pub env: BTreeMap<String, String>,
    /// Resources per node (all its tasks together).
    pub resources: Resources,
    /// Number of nodes.
    pub nodes: u32,
    /// Tasks on each node, each in its own sandbox (a spec stored before tasks per node
    /// existed has 1).
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub tasks_per_node: u32,
    /// GPUs each task has to itself; `None`: every task of a node sees all the job's GPUs
    /// there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpus_per_task: Option<u32>,
    /// Time limit in seconds.
    pub time_limit: u64,
    /// The job gave no time limit: `time_limit` is its partition's default, set again when
    /// it moves to another partition.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub time_defaulted: bool,
    /// The job asked for `UNLIMITED`: `time_limit` is its partition's maximum (the site's
    /// where the partition sets none), set again when it moves to another partition.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub time_unlimited: bool,
    /// The job gave no memory: `resources.memory` is its partition's default, set again when
    /// it moves to another partition.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub memory_defaulted: bool,
    /// The job asked for all of each node's memory (`--mem=0`): `resources.memory` is the
    /// least a job may ask for until it starts, when its run holds each node's whole memory.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub memory_whole: bool,
    /// Output file pattern (absolute or relative to `workdir`).
    pub output: String,
    /// Error file pattern; `None` means the output file.
    pub error: Option<String>,
    /// Needs RDMA devices.
    #[serde(default)]
    pub rdma: bool,
    /// Extra binds asked for by the user, `SOURCE:DEST[:ro]` (checked by the node).
    #[serde(default)]
    pub mounts: Vec<String>,
    /// Root inside, the user outside.
    #[serde(default)]
    pub remap_root: bool,
    /// The root is writable (a per-job layer over the image).
    #[serde(default)]
    pub writable: bool,
    /// Locked memory needed, bytes (`u64::MAX` = unlimited).
    #[serde(default)]
    pub memlock: Option<u64>,
    /// Partition asked for; `None` runs in the default partition.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition: Option<String>,
    /// Account asked for; `None` charges the user's default account.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub account: Option<String>,
    /// QoS asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub qos: Option<String>,
    /// An admin named `qos` (at submit or by an update): it holds whether or not the owner's
    /// association grants it. Otherwise a QoS no longer granted holds the job (InvalidQOS).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub qos_by_admin: bool,
    /// The job named no QoS: `qos` is the default QoS at submit, fixed then (as the
    /// partition and account are), and it holds while that QoS exists, whether or not it is
    /// still the default or granted.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub qos_defaulted: bool,
    /// GPU type asked for, lower case; `None` takes any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_type: Option<String>,
    /// Nice, subtracted from the priority.
    #[serde(default)]
    pub nice: i32,
    /// A priority an admin fixed (`wharf update --priority`, Slurm's `scontrol update
    /// priority=`): it replaces the computed one, nice and all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<u64>,
    /// The array task this job is, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub array: Option<crate::array::ArrayTask>,
    /// Node features it needs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub constraint: Option<crate::features::Constraint>,
    /// Nodes it may run on; empty: any.
    #[serde(default, skip_serializing_if = "HostList::is_empty")]
    pub nodelist: HostList,
    /// Nodes it must not run on.
    #[serde(default, skip_serializing_if = "HostList::is_empty")]
    pub exclude: HostList,
    /// It takes whole nodes.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub exclusive: bool,
    /// May be put back in the queue when preempted or by `wharf requeue` (a job stored
    /// before this field existed is).
    #[serde(default = "yes")]
    pub requeue: bool,
    /// Its command runs once, as rank 0 ([`JobRequest::once`]); its other tasks run nothing.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub once: bool,
}

fn yes() -> bool {
    true
}

fn one() -> u32 {
    1
}

fn is_one(n: &u32) -> bool {
    *n == 1
}

impl JobRequest {
    /// Overlays `other` on `self`: fields set in `other` win (CLI flags over `#WHARF` lines).
    pub fn overlay(mut self, other: JobRequest) -> JobRequest {
        macro_rules! take {
            ($($f:ident),*) => { $( if other.$f.is_some() { self.$f = other.$f; } )* };
        }
        // The three ways of asking for memory are one choice: the later one replaces it.
        if other.memory.is_some() || other.mem_per_cpu.is_some() || other.mem_per_gpu.is_some() {
            (self.memory, self.mem_per_cpu, self.mem_per_gpu) = (None, None, None);
        }
        // So are the job's GPUs and each node's (`--gpus`, `--gpus-per-node`), with their type.
        if other.gpus.is_some() || other.gpus_total.is_some() {
            (self.gpus, self.gpus_total, self.gpu_type) = (None, None, None);
        }
        take!(
            name,
            image,
            command,
            script,
            cpus,
            memory,
            mem_per_cpu,
            mem_per_gpu,
            gpus,
            gpus_total,
            gpus_per_task,
            time,
            nodes,
            ntasks,
            ntasks_per_node,
            workdir,
            output,
            error,
            rdma,
            memlock,
            remap_root,
            writable,
            partition,
            account,
            qos,
            nice,
            gpu_type,
            begin,
            hold,
            dependency,
            array,
            constraint,
            nodelist,
            exclude,
            exclusive,
            requeue,
            once
        );
        if !other.args.is_empty() {
            self.args = other.args;
        }
        self.env.extend(other.env);
        self.mounts.extend(other.mounts);
        for note in other.ignored {
            if !self.ignored.contains(&note) {
                self.ignored.push(note);
            }
        }
        self.parsable |= other.parsable;
        self.wait |= other.wait;
        self
    }

    /// Validates the request and fills defaults. `cwd` is where the user submitted from. The
    /// error names the offending field.
    pub fn resolve(&self, cwd: &str, defaults: &JobDefaults) -> Result<JobSpec, String> {
        crate::limits::check_sizes(self, cwd, defaults)?;
        let argv = match (&self.command, &self.script) {
            (Some(_), Some(_)) => return Err("set either `command` or `script`, not both".into()),
            (Some(_), None) if !self.args.is_empty() => {
                return Err("`args` are a script's; give a command's arguments in `command`".into())
            }
            (None, None) => return Err("nothing to run: set `command` or `script`".into()),
            (Some(cmd), None) => {
                if cmd.is_empty() || cmd[0].is_empty() {
                    return Err("`command` is empty; give the program to run first".into());
                }
                if cmd.len() > MAX_ARGS {
                    return Err(format!(
                        "`command` has {} words; the limit is {MAX_ARGS}",
                        cmd.len()
                    ));
                }
                if cmd.iter().any(|a| a.contains('\0')) {
                    return Err("`command` contains a NUL byte".into());
                }
                cmd.clone()
            }
            (None, Some(script)) => {
                if script.len() > MAX_SCRIPT_BYTES {
                    return Err(format!(
                        "`script` is {} bytes; the limit is {MAX_SCRIPT_BYTES}",
                        script.len()
                    ));
                }
                if script.contains('\0') {
                    return Err("`script` contains a NUL byte".into());
                }
                if self.args.len() > MAX_ARGS {
                    return Err(format!(
                        "`args` has {} words; the limit is {MAX_ARGS}",
                        self.args.len()
                    ));
                }
                if self.args.iter().any(|a| a.contains('\0')) {
                    return Err("`args` contains a NUL byte".into());
                }
                script_argv(script, &self.args)?
            }
        };
        let name = match &self.name {
            Some(n) => n.clone(),
            None => default_name(&argv, self.script.is_some()),
        };
        check_job_name(&name)?;
        let image = self.image.clone().unwrap_or_else(|| defaults.image.clone());
        validate_image_name(&image)?;
        // A path names an Apptainer SIF file; a node runs nothing else from a path.
        if image.starts_with('/') && !image.ends_with(".sif") {
            return Err(format!(
                "`image` {image:?} is a path but not a .sif file; name an imported image, \
                 \"host\", or an Apptainer SIF file"
            ));
        }
        if self.writable == Some(true) && image == "host" {
            return Err(
                "`writable` needs an image: the node's own filesystem (image \"host\") is never \
                 writable; name an image, or write to /tmp or a shared path"
                    .into(),
            );
        }
        let cpus_per_task = self.cpus.unwrap_or(defaults.cpus);
        if cpus_per_task == 0 {
            return Err("`cpus` must be at least 1".into());
        }
        // As in Slurm, a job gets every node its --nodelist names: its node count is raised to
        // theirs, and a node both listed and excluded is a mistake.
        let nodelist = host_list("nodelist", &self.nodelist)?;
        let exclude = host_list("exclude", &self.exclude)?;
        let listed: std::collections::BTreeSet<&str> =
            nodelist.names().iter().map(String::as_str).collect();
        if let Some(both) = listed.iter().find(|n| exclude.contains(n)) {
            return Err(format!(
                "node {both} is both in --nodelist and in --exclude; leave it out of one"
            ));
        }
        let asked = match (self.nodes, u32::try_from(listed.len()).unwrap_or(u32::MAX)) {
            (n, 0) => n,
            (Some(n), k) if n > k => {
                return Err(format!(
                    "--nodes {n} but --nodelist names {k} node{}: a job runs on exactly the \
                     nodes it lists; list all {n}, or leave --nodelist out",
                    if k == 1 { "" } else { "s" }
                ))
            }
            (_, k) => Some(k),
        };
        let (nodes, tasks_per_node) = check_tasks(asked, self.ntasks, self.ntasks_per_node)?;
        let cpus = cpus_per_task.checked_mul(tasks_per_node).ok_or_else(|| {
            format!("`cpus` = {cpus_per_task} per task times {tasks_per_node} tasks per node is too many")
        })?;
        let per_node = match self.gpus_total {
            None => self.gpus,
            Some(t) if t % nodes != 0 => {
                return Err(format!(
                    "--gpus {t} is the job's GPUs, and {t} does not split evenly over its {nodes} \
                     nodes (every node gets the same here); ask --gpus-per-node instead"
                ))
            }
            Some(t) => match self.gpus {
                Some(n) if n != t / nodes => {
                    return Err(format!(
                        "--gpus {t} over {nodes} nodes is {} per node, but --gpus-per-node says \
                         {n}; give one of them",
                        t / nodes
                    ))
                }
                _ => Some(t / nodes),
            },
        };
        let gpus = match (per_node, self.gpus_per_task) {
            (_, Some(0)) => return Err("`gpus_per_task` must be at least 1".into()),
            (None, Some(g)) => g.checked_mul(tasks_per_node).ok_or_else(|| {
                format!("`gpus_per_task` = {g} times {tasks_per_node} tasks per node is too many")
            })?,
            (Some(n), Some(g)) if Some(n) != g.checked_mul(tasks_per_node) => {
                return Err(format!(
                    "`gpus` = {n} per node but `gpus_per_task` = {g} with {tasks_per_node} \
                     task{} per node makes {}; give one of them",
                    if tasks_per_node == 1 { "" } else { "s" },
                    u64::from(g) * u64::from(tasks_per_node)
                ))
            }
            (n, _) => n.unwrap_or(0),
        };
        // A job that gives no time limit gets its partition's default when it is admitted;
        // the site's default stands in until then.
        let time_limit = match self.time {
            Some(UNLIMITED_TIME) => defaults.max_time,
            Some(t) if t > defaults.max_time => {
                return Err(format!(
                    "`time` {} is over the site's maximum of {}",
                    format_duration(t),
                    format_duration(defaults.max_time)
                ))
            }
            Some(t) => t,
            None => defaults.site_time(),
        };
        // Likewise memory: per CPU or per GPU becomes per node; none given, the partition's
        // default per CPU or per GPU, or the site's, applies at admission.
        let memory = match (self.memory, self.mem_per_cpu, self.mem_per_gpu) {
            (Some(_), Some(_), _) | (Some(_), _, Some(_)) | (_, Some(_), Some(_)) => {
                return Err(
                    "give one of `memory` (--mem), `mem_per_cpu` (--mem-per-cpu) and \
                     `mem_per_gpu` (--mem-per-gpu)"
                        .into(),
                )
            }
            // All of each node's: the least any job asks for, until it has its nodes.
            (Some(0), None, None) => MIN_MEMORY,
            (Some(m), None, None) => m,
            (None, Some(m), None) => m
                .checked_mul(u64::from(cpus))
                .ok_or_else(|| format!("`mem_per_cpu` {} is too large", format_memory(m)))?,
            (None, None, Some(_)) if gpus == 0 => {
                return Err("`mem_per_gpu` needs GPUs; ask for some with --gpus".into())
            }
            (None, None, Some(m)) => m
                .checked_mul(u64::from(gpus))
                .ok_or_else(|| format!("`mem_per_gpu` {} is too large", format_memory(m)))?,
            (None, None, None) => defaults.memory,
        };
        let memory_defaulted =
            self.memory.is_none() && self.mem_per_cpu.is_none() && self.mem_per_gpu.is_none();
        if memory < MIN_MEMORY {
            return Err(format!(
                "`memory` {} is too small; ask for at least 4M, or 0 for all of each node's",
                format_memory(memory)
            ));
        }
        let resources = Resources { cpus, memory, gpus };
        defaults.max_resources.check(&resources)?;
        if !cwd.starts_with('/') {
            return Err(format!("submit directory {cwd:?} is not absolute"));
        }
        let workdir = match &self.workdir {
            Some(w) if w.starts_with('/') => w.clone(),
            Some(w) => format!("{}/{}", cwd.trim_end_matches('/'), w),
            None => cwd.to_string(),
        };
        if cwd.contains('\0') {
            return Err(format!("submit directory {cwd:?} contains NUL"));
        }
        if workdir.contains('\0') || workdir.split('/').any(|c| c == "..") {
            return Err(format!("`workdir` {workdir:?} may not contain `..` or NUL"));
        }
        if self.env.len() > MAX_ENV {
            return Err(format!(
                "`env` has {} entries; the limit is {MAX_ENV}",
                self.env.len()
            ));
        }
        for (k, v) in &self.env {
            check_env_var(k, v).map_err(|e| format!("`env` {e}"))?;
        }
        for (field, path) in [("output", &self.output), ("error", &self.error)] {
            if let Some(p) = path {
                if p.is_empty() || p.contains('\0') || p.len() > 4096 {
                    return Err(format!("`{field}` must be a non-empty path"));
                }
            }
        }
        Ok(JobSpec {
            name,
            image,
            argv,
            workdir,
            submit_dir: cwd.to_string(),
            env: self.env.clone(),
            resources,
            nodes,
            tasks_per_node,
            gpus_per_task: self.gpus_per_task,
            time_limit,
            time_defaulted: self.time.is_none(),
            time_unlimited: self.time == Some(UNLIMITED_TIME),
            memory_defaulted,
            memory_whole: self.memory == Some(0),
            output: self.output.clone().unwrap_or_else(|| "wharf-%j.out".into()),
            error: self.error.clone(),
            // Required only when asked for: a gang is given the node's RDMA devices wherever
            // it has some, and runs over TCP where it has none.
            rdma: self.rdma.unwrap_or(false),
            mounts: validate_mounts(&self.mounts)?,
            remap_root: self.remap_root.unwrap_or(false),
            writable: self.writable.unwrap_or(false),
            memlock: self.memlock,
            partition: match &self.partition {
                Some(p) => Some(validate_name("partition", p)?),
                None => None,
            },
            account: match &self.account {
                Some(a) => Some(validate_name("account", a)?),
                None => None,
            },
            qos: match &self.qos {
                Some(q) => Some(validate_name("qos", q)?),
                None => None,
            },
            qos_by_admin: false,
            qos_defaulted: false,
            gpu_type: match &self.gpu_type {
                Some(_) if gpus == 0 => {
                    return Err("`gpu_type` needs `gpus` of at least 1, e.g. --gpus h100:2".into())
                }
                Some(t) => Some(validate_name("gpu_type", &t.to_ascii_lowercase())?),
                None => None,
            },
            nice: match self.nice.unwrap_or(0) {
                n if n.unsigned_abs() <= MAX_NICE.unsigned_abs() => n,
                n => {
                    return Err(format!(
                        "`nice` {n} is out of range; use -{MAX_NICE} to {MAX_NICE}"
                    ))
                }
            },
            priority: None,
            array: None,
            constraint: self
                .constraint
                .as_deref()
                .map(crate::features::Constraint::parse)
                .transpose()?,
            nodelist,
            exclude,
            exclusive: self.exclusive.unwrap_or(false),
            requeue: self.requeue.unwrap_or(true),
            once: self.once.unwrap_or(false),
        })
    }
}

/// Most nodes one job may ask for.
pub const MAX_NODES: u32 = 4096;

/// Most tasks one node may run for a job.
pub const MAX_TASKS_PER_NODE: u32 = 1024;

/// A job's shape from `nodes`, `ntasks` and `ntasks_per_node`, any of them left out, as Slurm
/// derives it: the nodes (1 to [`MAX_NODES`]) and the tasks on each (1 to
/// [`MAX_TASKS_PER_NODE`]), the same on every node. `ntasks` alone puts every task on one
/// node; with `nodes` it must divide evenly among them; with both, it must be their product.
fn check_tasks(
    nodes: Option<u32>,
    ntasks: Option<u32>,
    per_node: Option<u32>,
) -> Result<(u32, u32), String> {
    if let Some(n) = nodes.filter(|&n| n == 0 || n > MAX_NODES) {
        return Err(format!("`nodes` = {n}: ask for 1 to {MAX_NODES} nodes"));
    }
    if ntasks == Some(0) {
        return Err("`ntasks` must be at least 1".into());
    }
    match per_node {
        Some(0) => return Err("`ntasks_per_node` must be at least 1".into()),
        Some(n) if n > MAX_TASKS_PER_NODE => {
            return Err(format!(
                "`ntasks_per_node` = {n}: ask for 1 to {MAX_TASKS_PER_NODE} tasks per node"
            ))
        }
        _ => {}
    }
    let s = |n: u32| if n == 1 { "" } else { "s" };
    let (nodes, per_node) = match (nodes, ntasks, per_node) {
        (Some(nodes), Some(n), Some(per)) => {
            let make = u64::from(nodes) * u64::from(per);
            if u64::from(n) != make {
                return Err(format!(
                    "`ntasks` = {n} but the job has {nodes} node{} with {per} task{} per node, \
                     which makes {make}; fix one of --ntasks, --nodes and --ntasks-per-node, or \
                     leave --ntasks out",
                    s(nodes),
                    s(per)
                ));
            }
            (nodes, per)
        }
        (Some(nodes), Some(n), None) => {
            if n % nodes != 0 {
                return Err(format!(
                    "`ntasks` = {n} but the job has {nodes} node{}: Wharf starts the same number \
                     of tasks on every node, so ask for a multiple of {nodes} tasks (or give \
                     --ntasks-per-node)",
                    s(nodes)
                ));
            }
            (nodes, n / nodes)
        }
        (None, Some(n), Some(per)) => {
            if n % per != 0 {
                return Err(format!(
                    "`ntasks` = {n} is not a whole number of nodes with {per} task{} per node; \
                     ask for a multiple of {per} tasks, or give --nodes",
                    s(per)
                ));
            }
            (n / per, per)
        }
        (None, Some(n), None) => (1, n),
        (nodes, None, per) => (nodes.unwrap_or(1), per.unwrap_or(1)),
    };
    if nodes == 0 || nodes > MAX_NODES {
        return Err(format!("`nodes` = {nodes}: ask for 1 to {MAX_NODES} nodes"));
    }
    if per_node > MAX_TASKS_PER_NODE {
        return Err(format!(
            "`ntasks` = {} puts {per_node} tasks on each node: ask for 1 to {MAX_TASKS_PER_NODE} \
             tasks per node",
            u64::from(nodes) * u64::from(per_node)
        ));
    }
    Ok((nodes, per_node))
}

/// Parses the host list given as `--{what}`; none: empty.
fn host_list(what: &str, text: &Option<String>) -> Result<HostList, String> {
    match text {
        Some(t) => HostList::parse(t).map_err(|e| format!("--{what}: {e}")),
        None => Ok(HostList::default()),
    }
}

/// The least memory a job may ask for on a node, bytes.
pub const MIN_MEMORY: u64 = 4 << 20;

/// The largest nice, either way (Slurm's limit).
pub const MAX_NICE: i32 = 2_147_483_645;

/// A job as commands and the API name it: `ID`, or `ARRAYID_TASKID` for one task of an
/// array; decimal digits only (no sign, space or escape), `None` for anything else.
pub fn parse_job_ref(text: &str) -> Option<(JobId, Option<u32>)> {
    let digits = |p: &str| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit());
    match text.split_once('_') {
        Some((a, t)) if digits(a) && digits(t) => Some((a.parse().ok()?, Some(t.parse().ok()?))),
        None if digits(text) => Some((text.parse().ok()?, None)),
        _ => None,
    }
}

/// Whether `(ID, TASK)` (a [`parse_job_ref`]) names job `id`, task `array` (`(array's id,
/// task id)`) when it is an array's: `ID` alone is job `ID` or any task of the array whose
/// id it is, `ID_TASK` that one task, as squeue's and sacct's `-j` take them.
pub fn job_ref_names(
    (n, task): (JobId, Option<u32>),
    id: JobId,
    array: Option<(JobId, u32)>,
) -> bool {
    match (task, array) {
        (None, Some((a, _))) => n == a || n == id,
        (None, None) => n == id,
        (Some(t), Some((a, at))) => n == a && t == at,
        (Some(_), None) => false,
    }
}

/// True for a name of the cluster's vocabulary (a partition, account, QoS, GPU type or node
/// feature): 1 to 64 letters, digits, `-`, `_` or `.`.
pub fn is_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// A partition or account name ([`is_name`]).
/// An environment variable a job may be given: a name of letters, digits and `_` not
/// starting with a digit, and a value without NUL.
pub fn check_env_var(name: &str, value: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !ok {
        return Err(format!("name {name:?} is not a valid variable name"));
    }
    if value.contains('\0') {
        return Err(format!("value of {name} contains a NUL byte"));
    }
    Ok(())
}

fn validate_name(what: &str, name: &str) -> Result<String, String> {
    if is_name(name) {
        Ok(name.to_string())
    } else {
        Err(format!(
            "`{what}` {name:?} is not a{} {what} name: use 1 to 64 letters, digits, '-', '_' or '.'",
            if what.starts_with('a') { "n" } else { "" }
        ))
    }
}

/// Runs a script with an interpreter of its own: copies the script (`$1`) into a directory
/// of its own that it makes under `/tmp` (`mkdir` is atomic and follows no link, so tasks
/// sharing a `/tmp`, or another user's planted file or FIFO where a user mounted a shared
/// directory there, get a fresh name, never someone else's), then runs the interpreter (`$2`)
/// with its one argument (`$3`, when not empty), that file and the script's arguments, as the
/// kernel runs a `#!` file. The job's umask is left as it was: the directory is private
/// by its own mode. An interpreter missing from the image says so.
const INTERPRETED: &str = "n=0; until d=/tmp/.wharf-script.$n; mkdir -m 700 \"$d\" 2>/dev/null; \
     do n=$((n+1)); if [ $n -ge 1000 ]; then \
     echo \"wharf: no directory for the script could be made under /tmp\" >&2; exit 126; fi; done; \
     f=$d/script; printf '%s' \"$1\" >\"$f\" || exit 126; i=$2; a=$3; shift 3; \
     command -v \"$i\" >/dev/null 2>&1 || { \
     echo \"wharf: the script's interpreter $i (its #! line) is not in the image\" >&2; exit 127; }; \
     if [ -n \"$a\" ]; then exec \"$i\" \"$a\" \"$f\" \"$@\"; fi; exec \"$i\" \"$f\" \"$@\"";

/// The command that runs `script` with `args` as its `$1`, `$2`, ...: a script whose first
/// line is `#!INTERPRETER [ARG]` runs under that interpreter, given its one optional argument
/// (the rest of the line, as the kernel reads it), the script's file and `args`, as sbatch
/// runs it; `#!/bin/sh` or no `#!` line at all (which sbatch refuses) is `/bin/sh -c SCRIPT`.
/// The interpreter is looked for in the image, as any command is.
pub fn script_argv(script: &str, args: &[String]) -> Result<Vec<String>, String> {
    let sh = |mut argv: Vec<String>| {
        if !args.is_empty() {
            // `$0`, then `$1`...
            argv.push("/bin/sh".into());
            argv.extend(args.iter().cloned());
        }
        Ok(argv)
    };
    let plain = vec!["/bin/sh".into(), "-c".into(), script.to_string()];
    let Some(line) = script.lines().next().and_then(|l| l.strip_prefix("#!")) else {
        return sh(plain);
    };
    let line = line.trim_matches([' ', '\t']);
    let (interpreter, arg) = match line.split_once([' ', '\t']) {
        Some((i, a)) => (i, a.trim_matches([' ', '\t'])),
        None => (line, ""),
    };
    if interpreter.is_empty() {
        return Err(
            "`script` starts with a #! line that names no interpreter; write e.g. #!/bin/bash"
                .into(),
        );
    }
    if interpreter == "/bin/sh" && arg.is_empty() {
        return sh(plain);
    }
    let mut argv: Vec<String> = ["/bin/sh", "-c", INTERPRETED, "wharf-script"]
        .map(String::from)
        .into();
    argv.extend([script.to_string(), interpreter.to_string(), arg.to_string()]);
    argv.extend(args.iter().cloned());
    Ok(argv)
}

/// A script a job's command runs (see [`script_argv`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Script<'a> {
    /// The script's text.
    pub text: &'a str,
    /// What runs it: its `#!` interpreter, or `/bin/sh` when it runs under `/bin/sh -c`.
    pub interpreter: &'a str,
    /// The arguments it is given, as its `$1`, `$2`, ...
    pub args: &'a [String],
}

/// The script a job's command runs (see [`script_argv`]); `None` for a command given
/// outright.
pub fn script_of(argv: &[String]) -> Option<Script<'_>> {
    match argv {
        [sh, c, wrapper, _, text, interpreter, _, args @ ..]
            if *sh == "/bin/sh" && *c == "-c" && *wrapper == INTERPRETED =>
        {
            Some(Script {
                text,
                interpreter,
                args,
            })
        }
        [sh, c, text, rest @ ..] if *sh == "/bin/sh" && *c == "-c" => Some(Script {
            text,
            interpreter: "/bin/sh",
            // After `$0`.
            args: rest.get(1..).unwrap_or_default(),
        }),
        _ => None,
    }
}

fn default_name(argv: &[String], script: bool) -> String {
    if script {
        return "script".into();
    }
    let base = argv[0].rsplit('/').next().unwrap_or("job");
    base.chars().take(MAX_NAME).collect()
}

/// Most extra binds a job may ask for.
pub const MAX_MOUNTS: usize = 64;

/// Checks the form of `SOURCE:DEST[:ro|rw]` binds (whether a node allows them is its call).
fn validate_mounts(mounts: &[String]) -> Result<Vec<String>, String> {
    if mounts.len() > MAX_MOUNTS {
        return Err(format!(
            "`mounts` has {} entries; the limit is {MAX_MOUNTS}",
            mounts.len()
        ));
    }
    for m in mounts {
        parse_mount(m, false).map_err(|e| format!("`mounts` entry {e}"))?;
    }
    Ok(mounts.to_vec())
}

/// A bind as written: `SOURCE:DEST[:ro|rw]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountSpec {
    /// Host path.
    pub source: String,
    /// Path inside the container.
    pub destination: String,
    /// Bound read-only (`:ro`).
    pub read_only: bool,
}

/// Directories the sandbox makes itself, with what it puts under them: its own proc, the host's
/// read-only `/sys` with paths masked, a private `/dev` with its device nodes and symlinks.
/// No bind may land at or under one, nor at `/`: it would hide them, or have the sandbox
/// make its mount points and symlinks in the bound host directory. `/tmp`, the sandbox's
/// private tmpfs, is not here: nothing is made in it, so a bind over it simply replaces it
/// (a user's scratch as `/tmp`, as Slurm sites do).
pub const RESERVED_DESTINATIONS: [&str; 3] = ["/proc", "/sys", "/dev"];

/// The reserved directory (or `/`) that `destination`, an absolute path, lands at or under.
pub fn reserved_destination(destination: &str) -> Option<&'static str> {
    let mut parts = destination
        .split('/')
        .filter(|c| !c.is_empty() && *c != ".");
    match parts.next() {
        None => Some("/"),
        Some(top) => RESERVED_DESTINATIONS
            .into_iter()
            .find(|r| r.trim_start_matches('/') == top),
    }
}

/// Parses `SOURCE:DEST[:ro|rw]`, and with `path_alone` also `PATH[:ro|rw]` (bound at the
/// same path). Paths are absolute, not `/`, without `..` or NUL; the destination is not at or
/// under one of [`RESERVED_DESTINATIONS`]. The one rule for a user's `--mount`, the node's
/// check of it, and `[agent] mounts`.
pub fn parse_mount(text: &str, path_alone: bool) -> Result<MountSpec, String> {
    let form = if path_alone {
        "PATH[:ro] or SOURCE:DEST[:ro]"
    } else {
        "SOURCE:DEST[:ro]"
    };
    let bad = || format!("{text:?} is not {form} with absolute paths (not `/`, no `..`)");
    let mut parts: Vec<&str> = text.split(':').collect();
    let read_only = parts.last() == Some(&"ro");
    if read_only || parts.last() == Some(&"rw") {
        parts.pop();
    }
    let (source, destination) = match parts.as_slice() {
        [p] if path_alone => (*p, *p),
        [s, d] => (*s, *d),
        _ => return Err(bad()),
    };
    let ok = |p: &str| {
        p.starts_with('/') && p != "/" && !p.split('/').any(|c| c == "..") && !p.contains('\0')
    };
    if !ok(source) || !ok(destination) {
        return Err(bad());
    }
    if let Some(reserved) = reserved_destination(destination) {
        let what = if reserved == "/" {
            "/ (the whole root)".to_string()
        } else {
            format!("{reserved}, which the sandbox makes itself")
        };
        return Err(format!(
            "{text:?} cannot be mounted at {destination}: it lies at or under {what}; \
             mount it elsewhere (for example /mnt{})",
            source
                .rsplit('/')
                .find(|c| !c.is_empty())
                .map(|c| format!("/{c}"))
                .unwrap_or_default()
        ));
    }
    Ok(MountSpec {
        source: source.into(),
        destination: destination.into(),
        read_only,
    })
}

/// Image names are `host`, a registry reference written so that it can only be one
/// (`docker://...`, `REGISTRY#PATH`, `REGISTRY/PATH`; see [`crate::image_ref`]), which must
/// parse, or a plain name (letters, digits, `._-:/@`): an imported image's, or else a Docker
/// Hub reference.
pub fn validate_image_name(image: &str) -> Result<(), String> {
    if !image.starts_with('/') && crate::image_ref::ImageRef::is_explicit(image) {
        return image
            .parse::<crate::image_ref::ImageRef>()
            .map(drop)
            .map_err(|why| format!("`image`: {why}"));
    }
    let ok = !image.is_empty()
        && image.len() <= 255
        && image
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "._-:/@".contains(c))
        && !image.split('/').any(|c| c == ".." || c == ".");
    if ok {
        Ok(())
    } else {
        Err(format!(
            "`image` {image:?} is not a valid image name (letters, digits and ._-:/@, or \"host\")"
        ))
    }
}

/// Whom and where a job's file names are made for: what `%u`, `%N` and `%n` stand for (see
/// [`crate::pattern`]). A letter whose value is not known here stays as written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FilePlace<'a> {
    /// The job's user's name (`%u`).
    pub user: Option<&'a str>,
    /// The job's first node (`%N`, its short name).
    pub first_node: Option<&'a str>,
    /// The index of the node the file is written on, among the job's (`%n`).
    pub node_index: Option<u32>,
}

/// `%a` outside an array: sbatch's NO_VAL.
pub const NO_ARRAY_TASK: u32 = 4_294_967_294;

impl JobSpec {
    /// The output file of job `id`'s rank 0 (the job's own file), every letter known at
    /// `place` expanded, absolute.
    pub fn output_path(&self, id: JobId, place: &FilePlace) -> String {
        self.rank_output_path(id, 0, place)
    }

    /// The error file of job `id`'s rank 0; `None` when errors go to the output file.
    pub fn error_path(&self, id: JobId, place: &FilePlace) -> Option<String> {
        self.rank_error_path(id, 0, place)
    }

    /// The output file name of job `id` with the job's letters known at `place` expanded and
    /// `%t` and `%%` left for each task ([`crate::pattern`]'s first stage), absolute.
    pub fn output_pattern(&self, id: JobId, place: &FilePlace) -> String {
        self.expand(&self.output, id, place)
    }

    /// The error file name as [`JobSpec::output_pattern`] makes it; `None` when errors go to
    /// the output file.
    pub fn error_pattern(&self, id: JobId, place: &FilePlace) -> Option<String> {
        self.error.as_ref().map(|p| self.expand(p, id, place))
    }

    /// Tasks in all: nodes times tasks per node.
    pub fn tasks(&self) -> u32 {
        self.nodes.saturating_mul(self.tasks_per_node.max(1))
    }

    /// CPUs each task has: the node's CPUs shared evenly among its tasks.
    pub fn cpus_per_task(&self) -> u32 {
        (self.resources.cpus / self.tasks_per_node.max(1)).max(1)
    }

    /// The output file rank `rank` of job `id` writes (see [`crate::alloc::rank_path`]).
    pub fn rank_output_path(&self, id: JobId, rank: u32, place: &FilePlace) -> String {
        crate::alloc::rank_path(&self.output_pattern(id, place), rank)
    }

    /// The error file rank `rank` of job `id` writes; `None` when its errors go to its output
    /// file.
    pub fn rank_error_path(&self, id: JobId, rank: u32, place: &FilePlace) -> Option<String> {
        self.error_pattern(id, place)
            .map(|p| crate::alloc::rank_path(&p, rank))
    }

    /// The job's letters in `pattern`, as sbatch gives them for a batch job's files (see
    /// [`crate::pattern`]); relative to the working directory.
    fn expand(&self, pattern: &str, id: JobId, place: &FilePlace) -> String {
        use crate::pattern::Value::{Num, Text};
        // Outside an array, %A is the job id and %a sbatch's NO_VAL.
        let (array_id, task) = self
            .array
            .map_or((id, NO_ARRAY_TASK), |a| (a.job_id, a.task_id));
        let p = crate::pattern::expand(pattern, |c| match c {
            'j' => Some(Num(id)),
            'J' => Some(Text(format!("{id}.batch"))),
            's' => Some(Text("batch".into())),
            'x' => Some(Text(self.name.clone())),
            'A' => Some(Num(array_id)),
            'a' => Some(Num(task.into())),
            'u' => place.user.map(|u| Text(u.into())),
            'N' => place
                .first_node
                .map(|n| Text(crate::pattern::short_name(n).into())),
            'n' => place.node_index.map(|n| Num(n.into())),
            _ => None,
        });
        if p.starts_with('/') {
            p
        } else {
            let dir = crate::pattern::escape(self.workdir.trim_end_matches('/'));
            format!("{dir}/{p}")
        }
    }
}

/// Where a job is in its life. See the diagram in the module documentation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum JobState {
    /// Waiting for resources, priority or a dependency.
    Pending,
    /// Allocated to a node; the launch order is on its way.
    Starting,
    /// The agent has confirmed the job's sandbox.
    Running,
    /// Exited with status 0.
    Completed,
    /// Exited non-zero, was killed by a signal, or could not start.
    Failed,
    /// Cancelled by its owner or an admin.
    Cancelled,
    /// Killed at its time limit.
    Timeout,
    /// Killed by the kernel for going over its memory limit.
    OutOfMemory,
    /// Its node stopped answering or lost the job.
    NodeFail,
    /// Stopped for good to make room for a job of higher precedence.
    Preempted,
}

impl JobState {
    /// Every state, in display order.
    pub const ALL: [JobState; 10] = [
        JobState::Pending,
        JobState::Starting,
        JobState::Running,
        JobState::Completed,
        JobState::Failed,
        JobState::Cancelled,
        JobState::Timeout,
        JobState::OutOfMemory,
        JobState::NodeFail,
        JobState::Preempted,
    ];

    /// True once the job can change no more.
    pub fn is_terminal(self) -> bool {
        !matches!(
            self,
            JobState::Pending | JobState::Starting | JobState::Running
        )
    }

    /// True while the job holds resources on a node.
    pub fn holds_resources(self) -> bool {
        matches!(self, JobState::Starting | JobState::Running)
    }

    /// Whether the life cycle allows `self -> next`.
    pub fn can_become(self, next: JobState) -> bool {
        use JobState::*;
        match self {
            Pending => matches!(next, Starting | Cancelled | Failed),
            // Back to Pending: requeued (preempted, or by `wharf requeue`).
            Starting => matches!(next, Running | Pending) || next.is_terminal(),
            Running => next == Pending || next.is_terminal(),
            _ => false,
        }
    }

    /// Upper-case name, as shown in tables and stored.
    pub fn as_str(self) -> &'static str {
        use JobState::*;
        match self {
            Pending => "PENDING",
            Starting => "STARTING",
            Running => "RUNNING",
            Completed => "COMPLETED",
            Failed => "FAILED",
            Cancelled => "CANCELLED",
            Timeout => "TIMEOUT",
            OutOfMemory => "OUT_OF_MEMORY",
            NodeFail => "NODE_FAIL",
            Preempted => "PREEMPTED",
        }
    }

    /// Parses [`JobState::as_str`] output (case-insensitive).
    pub fn parse(text: &str) -> Option<JobState> {
        let text = text.trim();
        Self::ALL
            .into_iter()
            .find(|s| s.as_str().eq_ignore_ascii_case(text) || s.code().eq_ignore_ascii_case(text))
    }

    /// Slurm's compact code of the state (`squeue -t PD`, `R`, `CD`, ...).
    pub fn code(self) -> &'static str {
        match self {
            JobState::Pending => "PD",
            JobState::Starting => "CF",
            JobState::Running => "R",
            JobState::Completed => "CD",
            JobState::Failed => "F",
            JobState::Cancelled => "CA",
            JobState::Timeout => "TO",
            JobState::OutOfMemory => "OOM",
            JobState::NodeFail => "NF",
            JobState::Preempted => "PR",
        }
    }
}

impl std::fmt::Display for JobState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl JobRecord {
    /// What the job's file names' `%u`, `%N` and `%n` are for its rank 0: its user, its
    /// first node once it has one, node 0.
    pub fn file_place(&self) -> FilePlace<'_> {
        FilePlace {
            user: Some(&self.owner.user),
            first_node: self.allocs.first().map(|a| a.node.as_str()),
            node_index: Some(0),
        }
    }
}

/// Who submitted a job, as the kernel told the controller.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Owner {
    /// User id.
    pub uid: u32,
    /// Primary group id.
    pub gid: u32,
    /// User name (the uid in decimal when it has none).
    pub user: String,
}

/// How a job's process ended, as the agent saw it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExitInfo {
    /// Exit status when it exited.
    pub code: Option<i32>,
    /// Signal number when a signal ended it.
    pub signal: Option<i32>,
    /// The kernel's OOM killer ran in the job's cgroup.
    pub oom: bool,
    /// It was killed at its time limit.
    pub timed_out: bool,
    /// It was killed because it was cancelled.
    pub cancelled: bool,
    /// Why it could not start, or other words from the agent.
    pub message: Option<String>,
    /// When it could not start: whose fault that was and the step that failed (an older
    /// agent sends none; the job then fails as it did).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fault: Option<crate::fault::LaunchFault>,
    /// What it used, as its node measured it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<crate::usage::JobUsage>,
    /// The digest of the image it ran (a pulled image's manifest digest, an imported one's
    /// content digest); absent for the host's filesystem, a SIF file, or an older agent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_digest: Option<String>,
    /// On a node that runs several tasks of the job: the one (its local index) whose end
    /// this is, the first that failed when any did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task: Option<u32>,
}

impl ExitInfo {
    /// The final state this exit means.
    pub fn final_state(&self) -> JobState {
        if self.cancelled {
            JobState::Cancelled
        } else if self.timed_out {
            JobState::Timeout
        } else if self.oom {
            JobState::OutOfMemory
        } else if self.code == Some(0) && self.signal.is_none() {
            JobState::Completed
        } else {
            JobState::Failed
        }
    }

    /// Slurm-style `code:signal`.
    pub fn code_signal(&self) -> String {
        format!("{}:{}", self.code.unwrap_or(0), self.signal.unwrap_or(0))
    }
}

/// Everything known about one job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobRecord {
    /// Job id.
    pub id: JobId,
    /// Submitting user.
    pub owner: Owner,
    /// The accepted job. `None` in views where it is private to its owner.
    pub spec: Option<JobSpec>,
    /// Name (public even when `spec` is hidden).
    pub name: String,
    /// Resources per node (public).
    pub resources: Resources,
    /// Time limit in seconds (public).
    pub time_limit: u64,
    /// Current state.
    pub state: JobState,
    /// Why it is pending, in words; or why it ended, for failures.
    pub reason: Option<String>,
    /// Why a pending job waits, as a typed value: Slurm's code with the numbers behind it, of
    /// which `reason` is the sentence. Shown to whoever sees that sentence (other users see a
    /// pending job's as it is: it names resources, limits, partitions, job ids and, for
    /// [`PendingReason::NoNodeMatches`], the nodes and features the job asked for). Set while
    /// the scheduler or a hold keeps it pending; `None` in every other state, while no pass
    /// has looked at it yet, and while words of the controller's own (a requeue's, a
    /// release's) stand in the sentence. A kind this build does not know (from a newer
    /// controller), or a malformed value, reads as `None`.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "known_reason"
    )]
    pub pending_reason: Option<PendingReason>,
    /// Submit time, ms since the Unix epoch.
    pub submit_time: u64,
    /// Start time, ms since the Unix epoch.
    pub start_time: Option<u64>,
    /// End time, ms since the Unix epoch.
    pub end_time: Option<u64>,
    /// The nodes it runs or ran on, in rank order, with what it holds on each and how each
    /// rank is doing; empty while it has none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allocs: Vec<crate::alloc::NodeAlloc>,
    /// How it ended.
    pub exit: Option<ExitInfo>,
    /// A cancel was asked for and the node has not confirmed yet.
    pub cancel_requested: bool,
    /// A pending job's priority at the last scheduling pass, factor by factor (public).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<PriorityView>,
    /// When the last scheduling pass expects a pending job to start, ms since the Unix epoch
    /// (public); set for jobs holding a reservation and for the next ones the pass placed
    /// after them (the controller's `start_estimates`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected_start: Option<u64>,
    /// A pending job may not start before this time, ms since the Unix epoch (public).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub begin_time: Option<u64>,
    /// Who holds a pending job back, if anyone (public).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hold: Option<crate::forms::Hold>,
    /// What a pending job waits for (public, as Slurm's squeue shows it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dependency: Option<crate::dependency::Dependency>,
    /// The array task this job is, if any (public).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub array: Option<crate::array::ArrayTask>,
    /// How often it was put back in the queue (Slurm's restart count; public).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub restarts: u32,
    /// Its rendezvous port (`MASTER_PORT`), held from its start to its end.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    /// A stop the controller sent that ends other than in a cancel: a preemption or a
    /// requeue (public).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop: Option<Stop>,
    /// A requeued job's last nodes, each until its agent has let go of that run (its report
    /// no longer lists the job): the job does not start again before, so that run's end can
    /// never be taken for the next one's.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub requeued_from: Vec<String>,
    /// Why a requeued job went back to the queue (the stop that ended its last run), until
    /// it starts again (public: made of node, rank and fault code).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requeued_after: Option<Stop>,
    /// The words its node gave for that stop, if any (private to its owner and admins, as
    /// every message from a node is).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requeued_message: Option<String>,
    /// How many of its launches failed through no fault of its own (a node fault, an outage):
    /// it is requeued after each, up to [`MAX_LAUNCH_FAULTS`] (public).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub launch_faults: u32,
    /// While it is STARTING: its nodes' pulls of its image, as their agents last reported
    /// them (private to its owner and admins, as the image is). Kept by the controller in
    /// memory only: never in the store, and empty in every other state.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pulling: Vec<crate::pull::PullProgress>,
    /// The steps it started from inside (`wharf step`), by id (public, as sacct shows them).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub steps: Vec<crate::step::StepRecord>,
    /// The newest signals sent to it while it ran (`wharf cancel --signal`), oldest first,
    /// at most [`crate::signal::JobSignal::KEPT`]; owner's and admins' only.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub signals: Vec<crate::signal::JobSignal>,
}

/// How many failed launches that were not the job's fault requeue it; the next one ends it
/// (NODE_FAIL for a node fault, FAILED for an outage). A failure misread as a node's thus
/// drains at most this many nodes for one job.
pub const MAX_LAUNCH_FAULTS: u32 = 3;

/// A pending reason, or `None` for one this build does not know (a kind or a limit's rule
/// added later) or cannot read: a client older than its controller still reads the job, and
/// the reason's sentence (`reason`) still says it.
fn known_reason<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<PendingReason>, D::Error> {
    let value = Option::<serde_json::Value>::deserialize(d)?;
    Ok(value.and_then(|v| serde_json::from_value(v).ok()))
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// Why the controller stops a running job, and what becomes of it once it has ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Stop {
    /// Preempted by a waiting job; requeued or ended PREEMPTED as `requeue` says.
    Preempt {
        /// The job it makes room for.
        by: JobId,
        /// Back to the queue (else it ends PREEMPTED).
        requeue: bool,
    },
    /// `wharf requeue` by its owner or an admin.
    Requeue {
        /// Who asked.
        by_user: String,
    },
    /// One rank of a gang job ended badly (non-zero exit, signal, out of memory, time limit):
    /// the others are stopped and the job ends as that rank did.
    RankFailed {
        /// The node the rank ran on.
        node: String,
        /// Its rank.
        rank: u32,
    },
    /// One of the job's nodes stopped answering: the ranks on the others are stopped, and the
    /// job is requeued when it allows it, else it ends NODE_FAIL.
    NodeLost {
        /// The node.
        node: String,
        /// Back to the queue (else it ends NODE_FAIL).
        requeue: bool,
    },
    /// A rank's launch failed through no fault of the job (a node fault: the node is drained;
    /// or an outage): the ranks on the other nodes are stopped, and the job is requeued when
    /// it allows it, else it ends NODE_FAIL (node) or FAILED (outage).
    LaunchFault {
        /// The node.
        node: String,
        /// The rank whose launch failed.
        rank: u32,
        /// Whose fault, and the step that failed.
        fault: crate::fault::LaunchFault,
        /// Back to the queue.
        requeue: bool,
    },
    /// The command of a job that runs it once (a batch script) ended on the job's first node:
    /// what holds its other nodes is stopped, and the job ends as the command did (as Slurm
    /// ends a batch job's allocation when its script ends).
    BatchEnded {
        /// The first node.
        node: String,
    },
}

impl Stop {
    /// Why a job this stop requeued is back in the queue, in words (public: node, rank and
    /// fault code only).
    pub fn requeue_words(&self) -> String {
        match self {
            Stop::LaunchFault { node, fault, .. } => {
                format!("requeued after node {node} failed ({fault})")
            }
            Stop::NodeLost { node, .. } => {
                format!("requeued after node {node} stopped responding")
            }
            Stop::Preempt { by, .. } => format!("requeued: preempted by job {by}"),
            Stop::Requeue { by_user } => format!("requeued by {by_user}"),
            Stop::RankFailed { .. } | Stop::BatchEnded { .. } => format!("requeued after {self}"),
        }
    }

    /// Whether the job goes back to the queue once stopped.
    pub fn requeues(&self) -> bool {
        match self {
            Stop::Preempt { requeue, .. } => *requeue,
            Stop::Requeue { .. } => true,
            Stop::RankFailed { .. } => false,
            Stop::NodeLost { requeue, .. } => *requeue,
            Stop::LaunchFault { requeue, .. } => *requeue,
            Stop::BatchEnded { .. } => false,
        }
    }
}

impl std::fmt::Display for Stop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Stop::Preempt { by, .. } => write!(f, "preempted by job {by}"),
            Stop::Requeue { by_user } => write!(f, "requeued by {by_user}"),
            Stop::RankFailed { node, rank } => write!(f, "rank {rank} on node {node} failed"),
            Stop::BatchEnded { node } => write!(f, "the batch script ended on node {node}"),
            Stop::NodeLost { node, .. } => write!(f, "node {node} stopped responding"),
            Stop::LaunchFault {
                node, rank, fault, ..
            } => write!(f, "launch of rank {rank} on node {node} failed ({fault})"),
        }
    }
}

impl JobRecord {
    /// A new pending job of `owner`, not yet stored (id 0), with nothing decided about it.
    pub fn pending(
        owner: Owner,
        name: String,
        resources: Resources,
        time_limit: u64,
        submit_time: u64,
    ) -> JobRecord {
        JobRecord {
            id: 0,
            owner,
            spec: None,
            name,
            resources,
            time_limit,
            state: JobState::Pending,
            reason: None,
            pending_reason: None,
            submit_time,
            start_time: None,
            end_time: None,
            allocs: vec![],
            exit: None,
            cancel_requested: false,
            priority: None,
            expected_start: None,
            begin_time: None,
            hold: None,
            dependency: None,
            array: None,
            restarts: 0,
            stop: None,
            requeued_from: vec![],
            requeued_after: None,
            requeued_message: None,
            port: None,
            launch_faults: 0,
            pulling: vec![],
            steps: vec![],
            signals: vec![],
        }
    }

    /// A copy without the spec (the spec is never copied).
    pub fn without_spec(&self) -> JobRecord {
        JobRecord {
            id: self.id,
            owner: self.owner.clone(),
            spec: None,
            name: self.name.clone(),
            resources: self.resources,
            time_limit: self.time_limit,
            state: self.state,
            reason: self.reason.clone(),
            pending_reason: self.pending_reason.clone(),
            submit_time: self.submit_time,
            start_time: self.start_time,
            end_time: self.end_time,
            allocs: self.allocs.clone(),
            exit: self.exit.clone(),
            cancel_requested: self.cancel_requested,
            priority: self.priority,
            expected_start: self.expected_start,
            begin_time: self.begin_time,
            hold: self.hold,
            dependency: self.dependency.clone(),
            array: self.array,
            restarts: self.restarts,
            stop: self.stop.clone(),
            requeued_from: self.requeued_from.clone(),
            requeued_after: self.requeued_after.clone(),
            requeued_message: self.requeued_message.clone(),
            port: self.port,
            launch_faults: self.launch_faults,
            pulling: self.pulling.clone(),
            steps: self.steps.clone(),
            signals: self.signals.clone(),
        }
    }
}

/// A multifactor priority as Slurm's `sprio` shows it: each factor already multiplied by its
/// weight, so `total` is their sum less nice, up to rounding (each is rounded on its own).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct PriorityView {
    /// The priority.
    pub total: u64,
    /// Age factor times its weight.
    pub age: u64,
    /// Fair-share factor times its weight.
    pub fairshare: u64,
    /// Job size factor times its weight.
    pub job_size: u64,
    /// Width factor times its weight (absent from records of before the factor: 0).
    #[serde(default)]
    pub width: u64,
    /// Partition factor times its weight.
    pub partition: u64,
    /// QoS factor times its weight.
    pub qos: u64,
    /// Nice, subtracted.
    pub nice: i64,
    /// `total` is a priority an admin fixed, not the sum of the factors.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub fixed: bool,
}

impl JobRecord {
    /// What it used with its steps: its own tasks' usage, with the CPU time of its steps
    /// added and the highest memory peak of any (as seff counts a job whose work runs in
    /// `srun` steps); `None` when nothing was measured.
    pub fn usage_with_steps(&self) -> Option<crate::usage::JobUsage> {
        let own = self.exit.as_ref().and_then(|e| e.usage.clone());
        let steps = (self.steps.iter()).filter_map(|s| s.exit.as_ref()?.usage.as_ref());
        crate::usage::JobUsage::sum(own, steps)
    }

    /// Whether its command runs once, as rank 0 on its first node (as sbatch runs a script).
    pub fn runs_once(&self) -> bool {
        self.spec.as_ref().is_some_and(|s| s.once)
    }

    /// Its id as `squeue` shows it: `ARRAYID_TASKID` for an array's task.
    pub fn label(&self) -> String {
        self.array
            .as_ref()
            .map_or_else(|| self.id.to_string(), crate::array::ArrayTask::label)
    }

    /// Wall time used so far (or in all), in ms.
    pub fn elapsed_ms(&self, now: u64) -> u64 {
        elapsed_ms(self.start_time, self.end_time, now)
    }

    /// The job's nodes, in rank order.
    pub fn nodes(&self) -> impl Iterator<Item = &str> + '_ {
        self.allocs.iter().map(|a| a.node.as_str())
    }

    /// Its first node (rank 0), if it has any.
    pub fn first_node(&self) -> Option<&str> {
        self.allocs.first().map(|a| a.node.as_str())
    }

    /// The rank it has on `node`, if it runs there.
    pub fn rank_on(&self, node: &str) -> Option<u32> {
        self.allocs
            .iter()
            .position(|a| a.node == node)
            .map(|r| r as u32)
    }

    /// How many nodes it has, or asks for while it has none (1 when its spec is hidden).
    pub fn node_count(&self) -> u32 {
        match self.allocs.len() {
            0 => self.spec.as_ref().map_or(1, |s| s.nodes.max(1)),
            n => n as u32,
        }
    }

    /// Tasks on each of its nodes (1 when its spec is hidden).
    pub fn tasks_per_node(&self) -> u32 {
        self.spec.as_ref().map_or(1, |s| s.tasks_per_node.max(1))
    }

    /// Its nodes as a compressed host list (`gpu[01-04]`); empty when it has none.
    pub fn nodelist(&self) -> String {
        let names: Vec<&str> = self.nodes().collect();
        crate::hostlist::compress(&names)
    }
}

/// How long a job that started at `start` and ended at `end` (ms since the epoch, each if
/// so) has run by `now`: 0 before it started.
pub fn elapsed_ms(start: Option<u64>, end: Option<u64>, now: u64) -> u64 {
    match (start, end) {
        (Some(s), Some(e)) => e.saturating_sub(s),
        (Some(s), None) => now.saturating_sub(s),
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req() -> JobRequest {
        JobRequest {
            command: Some(vec!["/bin/true".into()]),
            ..Default::default()
        }
    }

    #[test]
    fn the_submit_directory_is_kept_beside_the_working_directory() {
        let d = JobDefaults::default();
        let mut r = req();
        r.workdir = Some("run/1".into());
        let spec = r.resolve("/home/ann/exp", &d).unwrap();
        assert_eq!(
            (spec.workdir.as_str(), spec.submit_dir.as_str()),
            ("/home/ann/exp/run/1", "/home/ann/exp")
        );
        let err = req().resolve("/home/a\0b", &d).unwrap_err();
        assert!(err.contains("NUL"), "{err}");
    }

    #[test]
    fn a_partition_is_a_plain_name() {
        let d = JobDefaults::default();
        let mut r = req();
        crate::jobfile::set_option(&mut r, "p", "gpu-a100").unwrap();
        assert_eq!(
            r.resolve("/tmp", &d).unwrap().partition.as_deref(),
            Some("gpu-a100")
        );
        for bad in ["", "a b", "../x", &"p".repeat(65)] {
            r.partition = Some(bad.to_string());
            let err = r.resolve("/tmp", &d).unwrap_err();
            assert!(err.contains("is not a partition name"), "{err}");
        }
        assert_eq!(req().resolve("/tmp", &d).unwrap().partition, None);
    }

    #[test]
    fn gpus_take_a_type_as_slurm_writes_it() {
        let d = JobDefaults::default();
        for (key, value, gpus, kind) in [
            ("gpus", "2", 2, None),
            ("gpus", "H100:2", 2, Some("h100")),
            ("gres", "gpu:a100:4", 4, Some("a100")),
            ("gres", "gpu:1", 1, None),
            ("gres", "gpu", 1, None),
            ("gres", "gpu:H100", 1, Some("h100")),
        ] {
            let mut r = req();
            crate::jobfile::set_option(&mut r, key, value).unwrap();
            let spec = r.resolve("/tmp", &d).unwrap();
            assert_eq!(spec.resources.gpus, gpus, "{value}");
            assert_eq!(spec.gpu_type.as_deref(), kind, "{value}");
        }
        for (key, value) in [
            ("gpus", "h100:x"),
            ("gres", "nic:1"),
            ("gpus", "a:b:c"),
            ("gres", "gpus"),
            ("gres", "gpu:h100:x"),
            ("gres", "gpu:a:b:2"),
            ("gres", "gpu:"),
        ] {
            let mut r = req();
            assert!(
                crate::jobfile::set_option(&mut r, key, value).is_err(),
                "{value}"
            );
        }
        let mut r = req();
        crate::jobfile::set_option(&mut r, "gpus", "h100:0").unwrap();
        assert!(r.resolve("/tmp", &d).unwrap_err().contains("needs `gpus`"));
    }

    #[test]
    fn gpus_is_the_jobs_split_over_its_nodes_and_gpus_per_node_each_nodes() {
        let d = JobDefaults::default();
        let with = |opts: &[(&str, &str)]| {
            let mut r = req();
            for (k, v) in opts {
                crate::jobfile::set_option(&mut r, k, v).unwrap();
            }
            r.resolve("/tmp", &d)
        };
        let gpus = |opts: &[(&str, &str)]| with(opts).unwrap().resources.gpus;
        assert_eq!(
            gpus(&[("nodes", "2"), ("gpus", "8")]),
            4,
            "Slurm's --gpus is the job's"
        );
        assert_eq!(gpus(&[("nodes", "2"), ("G", "h100:8")]), 4);
        assert_eq!(gpus(&[("nodes", "2"), ("gpus-per-node", "8")]), 8);
        assert_eq!(gpus(&[("nodes", "2"), ("gres", "gpu:8")]), 8);
        assert_eq!(gpus(&[("gpus", "3")]), 3, "one node: the same either way");
        assert_eq!(
            gpus(&[("nodes", "2"), ("gpus", "8"), ("gpus-per-node", "4")]),
            4,
            "both, agreeing"
        );
        for (opts, says) in [
            (
                &[("nodes", "4"), ("gpus", "6")][..],
                "does not split evenly over its 4 nodes",
            ),
            (
                &[("nodes", "2"), ("gpus", "8"), ("gpus-per-node", "2")][..],
                "is 4 per node, but --gpus-per-node says 2",
            ),
        ] {
            let err = with(opts).unwrap_err();
            assert!(err.contains(says), "{opts:?}: {err}");
        }
        // One option may name the type for both.
        let spec = with(&[("nodes", "2"), ("gpus", "h100:8"), ("gpus-per-node", "4")]).unwrap();
        assert_eq!(
            (spec.resources.gpus, spec.gpu_type.as_deref()),
            (4, Some("h100"))
        );
        let mut r = req();
        crate::jobfile::set_option(&mut r, "gpus", "h100:8").unwrap();
        let err = crate::jobfile::set_option(&mut r, "gpus-per-node", "a100:4").unwrap_err();
        assert!(err.contains("of one type"), "{err}");
        // The same option again replaces itself, type and all: the last line wins.
        let spec = with(&[("gpus", "h100:2"), ("gpus", "a100:4")]).unwrap();
        assert_eq!(
            (spec.resources.gpus, spec.gpu_type.as_deref()),
            (4, Some("a100"))
        );
        let spec = with(&[("gpus", "h100:2"), ("gpus", "4")]).unwrap();
        assert_eq!((spec.resources.gpus, spec.gpu_type), (4, None));
        // The command line's GPUs replace a script's, whichever way each asked.
        let mut script = req();
        for (k, v) in [("nodes", "2"), ("gpus", "h100:8")] {
            crate::jobfile::set_option(&mut script, k, v).unwrap();
        }
        let mut cli = JobRequest::default();
        crate::jobfile::set_option(&mut cli, "gpus-per-node", "2").unwrap();
        let spec = script.overlay(cli).resolve("/tmp", &d).unwrap();
        assert_eq!((spec.resources.gpus, spec.gpu_type), (2, None));
        // Job files keep `gpus` per node (`gpus_per_node`), as documented.
        let r: JobRequest = toml::from_str("command = [\"true\"]\nnodes = 2\ngpus = 2\n").unwrap();
        assert_eq!(r.resolve("/tmp", &d).unwrap().resources.gpus, 2);
    }

    #[test]
    fn a_nodelist_is_every_node_of_the_job_as_in_slurm() {
        let d = JobDefaults::default();
        let with = |opts: &[(&str, &str)]| {
            let mut r = req();
            for (k, v) in opts {
                crate::jobfile::set_option(&mut r, k, v).unwrap();
            }
            r.resolve("/tmp", &d)
        };
        let nodes = |opts: &[(&str, &str)]| with(opts).unwrap().nodes;
        assert_eq!(
            nodes(&[("nodelist", "gpu[01-04]")]),
            4,
            "raised to the list"
        );
        assert_eq!(nodes(&[("nodes", "1"), ("nodelist", "a,b")]), 2);
        assert_eq!(
            nodes(&[("nodes", "2"), ("nodelist", "a,b,a")]),
            2,
            "once each"
        );
        assert_eq!(nodes(&[("nodelist", "a")]), 1);
        assert_eq!(
            nodes(&[("exclude", "a,b")]),
            1,
            "an exclude list is no count"
        );
        let spec = with(&[("ntasks", "4"), ("nodelist", "a,b")]).unwrap();
        assert_eq!((spec.nodes, spec.tasks_per_node), (2, 2));
        for (opts, says) in [
            (
                &[("nodes", "3"), ("nodelist", "a,b")][..],
                "--nodes 3 but --nodelist names 2 nodes",
            ),
            (
                &[("nodelist", "a,b"), ("exclude", "b")][..],
                "node b is both in --nodelist and in --exclude",
            ),
        ] {
            let err = with(opts).unwrap_err();
            assert!(err.contains(says), "{opts:?}: {err}");
        }
    }

    #[test]
    fn mounts_have_one_form_everywhere() {
        let m = parse_mount("/data/a:/in:ro", false).unwrap();
        assert_eq!(
            (m.source.as_str(), m.destination.as_str(), m.read_only),
            ("/data/a", "/in", true)
        );
        assert!(!parse_mount("/a:/b:rw", false).unwrap().read_only);
        assert_eq!(parse_mount("/home", true).unwrap().destination, "/home");
        assert!(parse_mount("/data:ro", true).unwrap().read_only);
        for bad in [
            "/home",
            "/a:/b:rx",
            "a:/b",
            "/a:/",
            "/a/../b:/c",
            "/a:/b:ro:x",
            "/a\0:/b",
        ] {
            let e = parse_mount(bad, false).unwrap_err();
            assert!(e.contains("is not SOURCE:DEST[:ro]"), "{bad}: {e}");
        }
        assert!(parse_mount("/", true).is_err());
    }

    #[test]
    fn mounts_never_land_on_what_the_sandbox_makes() {
        for (dest, under) in [
            ("//", "/ (the whole root)"),
            ("/.", "/ (the whole root)"),
            ("/dev", "/dev, which"),
            ("/dev/", "/dev, which"),
            ("/dev/x", "/dev, which"),
            ("//dev/shm", "/dev, which"),
            ("/./dev", "/dev, which"),
            ("/proc", "/proc, which"),
            ("/proc/1/root", "/proc, which"),
            ("/sys", "/sys, which"),
            ("/sys/fs/cgroup", "/sys, which"),
        ] {
            let e = parse_mount(&format!("/data/a:{dest}"), false).unwrap_err();
            assert!(
                e.contains(&format!("at or under {under}")) && e.contains("/mnt/a"),
                "{dest}: {e}"
            );
            // The node's own shared paths follow the same rule.
            assert!(
                parse_mount(&format!("/data/a:{dest}"), true).is_err(),
                "{dest}"
            );
        }
        // Near misses, and the sandbox's /tmp (nothing is made in it: a bind replaces it).
        for dest in [
            "/devices",
            "/proc2",
            "/system",
            "/tmp",
            "/tmp/scratch",
            "/mnt/dev",
        ] {
            assert!(
                parse_mount(&format!("/data/a:{dest}"), false).is_ok(),
                "{dest}"
            );
        }
        assert!(parse_mount("/dev/infiniband", true).is_err());
    }

    #[test]
    fn resolve_fills_defaults() {
        let spec = req().resolve("/home/a", &JobDefaults::default()).unwrap();
        assert_eq!(spec.name, "true");
        assert_eq!(spec.image, "host");
        assert_eq!(spec.resources.cpus, 1);
        let place = FilePlace::default();
        assert_eq!(spec.output_path(7, &place), "/home/a/wharf-7.out");
        assert_eq!(spec.error_path(7, &place), None);
    }

    #[test]
    fn a_script_runs_under_its_own_interpreter_with_its_arguments() {
        let d = JobDefaults::default();
        let argv = |script: &str, args: &[&str]| {
            let r = JobRequest {
                script: Some(script.into()),
                args: args.iter().map(|a| a.to_string()).collect(),
                ..Default::default()
            };
            r.resolve("/tmp", &d).map(|s| s.argv)
        };
        // No #! line, or /bin/sh: as before.
        assert_eq!(
            argv("echo hi\n", &[]).unwrap(),
            ["/bin/sh", "-c", "echo hi\n"]
        );
        let sh = "#!/bin/sh\necho \"$1\"\n";
        assert_eq!(argv(sh, &[]).unwrap(), ["/bin/sh", "-c", sh]);
        assert_eq!(
            argv(sh, &["a 1", "-x"]).unwrap(),
            ["/bin/sh", "-c", sh, "/bin/sh", "a 1", "-x"]
        );
        // Any other: its interpreter and its one argument, then the script and its arguments.
        for (script, interpreter, arg) in [
            ("#!/bin/bash\n[[ -n x ]]\n", "/bin/bash", ""),
            (
                "#! /usr/bin/python3 -u  \nprint(1)\n",
                "/usr/bin/python3",
                "-u",
            ),
            (
                "#!/usr/bin/env python3\nprint(1)\n",
                "/usr/bin/env",
                "python3",
            ),
            ("#!/bin/sh -e\nfalse\n", "/bin/sh", "-e"),
            ("#!/usr/bin/perl -w -s\n", "/usr/bin/perl", "-w -s"),
        ] {
            let a = argv(script, &["a1", "a2"]).unwrap();
            assert_eq!(a[..2], ["/bin/sh", "-c"], "{script}");
            assert_eq!(a[4..], [script, interpreter, arg, "a1", "a2"], "{script}");
            let of = script_of(&a).unwrap();
            assert_eq!(
                (of.text, of.interpreter, of.args),
                (script, interpreter, &a[7..])
            );
            assert_eq!(of.args, ["a1", "a2"]);
        }
        let plain = argv("echo $1\n", &["a1"]).unwrap();
        let of = script_of(&plain).unwrap();
        assert_eq!((of.text, of.interpreter), ("echo $1\n", "/bin/sh"));
        assert_eq!(of.args, ["a1"]);
        let bare: Vec<String> = vec!["/bin/sh".into(), "-c".into(), "x".into()];
        let of = script_of(&bare).unwrap();
        assert_eq!(
            (of.text, of.interpreter, of.args),
            ("x", "/bin/sh", &[][..])
        );
        assert_eq!(script_of(&["/bin/bash".into()]), None);
        assert!(argv("#!\ntrue\n", &[])
            .unwrap_err()
            .contains("names no interpreter"));
        let mut r = req();
        r.args = vec!["x".into()];
        assert!(r
            .resolve("/tmp", &d)
            .unwrap_err()
            .contains("`args` are a script's"));
    }

    /// The wrapper runs as `/bin/sh` would: the script under its interpreter, from a private
    /// copy, with its arguments (`/tmp` is the sandbox's own there; any /tmp serves here).
    #[test]
    fn the_interpreter_gets_the_script_and_its_arguments() {
        if !std::path::Path::new("/bin/bash").exists() {
            let why = "the_interpreter_gets_the_script_and_its_arguments needs /bin/bash";
            assert!(
                std::env::var("WHARF_TEST_STRICT").as_deref() != Ok("1"),
                "{why}"
            );
            eprintln!("SKIPPED {why}");
            return;
        }
        let script = "#!/bin/bash -e\nset -o pipefail\na=(\"$@\"); [[ ${#a[@]} == 2 ]]\n\
                      printf '%s|' \"$0\" \"${a[@]}\" \"$(umask)\"; stat -c %a \"$(dirname \"$0\")\"\n";
        let argv = script_argv(script, &["x y".into(), "-z".into()]).unwrap();
        let run = || {
            let out = std::process::Command::new("/bin/sh")
                .arg("-c")
                .arg("umask 022; exec \"$@\"")
                .arg("sh")
                .args(&argv)
                .output()
                .unwrap();
            assert!(out.status.success(), "{out:?}");
            String::from_utf8(out.stdout).unwrap()
        };
        // Twice, each run keeping its copy: the second gets a directory of its own.
        let (first, second) = (run(), run());
        let mut files = Vec::new();
        for text in [&first, &second] {
            let (file, rest) = text.split_once('|').unwrap();
            assert!(file.starts_with("/tmp/.wharf-script."), "{text}");
            assert!(file.ends_with("/script"), "{text}");
            // The job's umask is its own; the copy's directory is private by its mode.
            assert_eq!(rest, "x y|-z|0022|700\n");
            files.push(file.to_string());
        }
        assert_ne!(files[0], files[1]);
        for f in &files {
            let dir = std::path::Path::new(f).parent().unwrap();
            let _ = std::fs::remove_dir_all(dir);
        }

        // An interpreter the image lacks is named.
        let argv = script_argv("#!/no/such/shell\ntrue\n", &[]).unwrap();
        let out = std::process::Command::new(&argv[0])
            .args(&argv[1..])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(127));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("interpreter /no/such/shell"), "{err}");
        // Its copy is left in its private directory, as a job's is in its private /tmp.
        if let Some(n) = (0..1000)
            .find(|n| std::path::Path::new(&format!("/tmp/.wharf-script.{n}/script")).exists())
        {
            let _ = std::fs::remove_dir_all(format!("/tmp/.wharf-script.{n}"));
        }
    }

    #[test]
    fn file_names_take_sbatchs_letters() {
        let mut r = req();
        r.output = Some("p_%A_%a_%u_%N_%%_%n_%t_%s_%J_%x_%5j_%q.out".into());
        r.error = Some("/e/%j-%t".into());
        r.name = Some("50%t".into());
        let mut spec = r.resolve("/home/a", &JobDefaults::default()).unwrap();
        let place = FilePlace {
            user: Some("ann"),
            first_node: Some("gpu01.lab.example"),
            node_index: Some(1),
        };
        assert_eq!(
            spec.output_path(195, &place),
            "/home/a/p_195_4294967294_ann_gpu01_%_1_0_batch_195.batch_50%t_00195_%q.out"
        );
        assert_eq!(
            spec.rank_output_path(195, 3, &place),
            "/home/a/p_195_4294967294_ann_gpu01_%_1_3_batch_195.batch_50%t_00195_%q.out"
        );
        assert_eq!(spec.rank_error_path(195, 2, &place).unwrap(), "/e/195-2");
        spec.array = Some(crate::array::ArrayTask {
            job_id: 190,
            task_id: 7,
            throttle: None,
            shape: Default::default(),
        });
        spec.output = "%A_%a_%3a.out".into();
        assert_eq!(spec.output_path(195, &place), "/home/a/190_7_007.out");
        // What is not known (a pending job's node) stays as written.
        spec.output = "%N_%u".into();
        assert_eq!(
            spec.output_path(195, &FilePlace::default()),
            "/home/a/%N_%u"
        );
        // A working directory with a % in it is taken as it is.
        spec.workdir = "/w/100%t".into();
        assert_eq!(
            spec.rank_output_path(1, 2, &place),
            "/w/100%t/gpu01_ann.rank2"
        );
    }

    #[test]
    fn memory_per_cpu_or_gpu_is_memory_per_node_and_one_way_is_given() {
        let d = JobDefaults::default();
        let spec = req().resolve("/", &d).unwrap();
        assert!(spec.time_defaulted && spec.memory_defaulted);
        assert_eq!((spec.time_limit, spec.resources.memory), (d.time, d.memory));
        let r = JobRequest {
            cpus: Some(2),
            ntasks_per_node: Some(2),
            mem_per_cpu: Some(1 << 30),
            time: Some(60),
            ..req()
        };
        let spec = r.resolve("/", &d).unwrap();
        assert_eq!(
            spec.resources.memory,
            4 << 30,
            "1G times 2 CPUs times 2 tasks"
        );
        assert!(!spec.time_defaulted && !spec.memory_defaulted);
        let r = JobRequest {
            gpus: Some(3),
            mem_per_gpu: Some(2 << 30),
            ..req()
        };
        assert_eq!(r.resolve("/", &d).unwrap().resources.memory, 6 << 30);
        let e = JobRequest {
            mem_per_gpu: Some(2 << 30),
            ..req()
        }
        .resolve("/", &d)
        .unwrap_err();
        assert!(e.contains("`mem_per_gpu` needs GPUs"), "{e}");
        for (memory, per_cpu, per_gpu) in [
            (Some(1 << 30), Some(1 << 30), None),
            (Some(1 << 30), None, Some(1 << 30)),
            (None, Some(1 << 30), Some(1 << 30)),
        ] {
            let r = JobRequest {
                memory,
                mem_per_cpu: per_cpu,
                mem_per_gpu: per_gpu,
                gpus: Some(1),
                ..req()
            };
            let e = r.resolve("/", &d).unwrap_err();
            assert!(e.contains("give one of `memory` (--mem)"), "{e}");
        }
        // Flags over #WHARF lines: the later way of asking for memory replaces the earlier.
        let lines = JobRequest {
            mem_per_cpu: Some(1 << 30),
            ..req()
        };
        let flags = JobRequest {
            memory: Some(3 << 30),
            ..Default::default()
        };
        let both = lines.overlay(flags);
        assert_eq!((both.memory, both.mem_per_cpu), (Some(3 << 30), None));
    }

    #[test]
    fn resolve_rejects_bad_fields() {
        let d = JobDefaults::default();
        let both = JobRequest {
            script: Some("x".into()),
            ..req()
        };
        assert!(both.resolve("/", &d).unwrap_err().contains("either"));
        let none = JobRequest::default();
        assert!(none
            .resolve("/", &d)
            .unwrap_err()
            .contains("nothing to run"));
        let img = JobRequest {
            image: Some("../etc".into()),
            ..req()
        };
        assert!(img.resolve("/", &d).unwrap_err().contains("`image`"));
        let writable_host = JobRequest {
            writable: Some(true),
            ..req()
        };
        assert!(writable_host
            .resolve("/", &d)
            .unwrap_err()
            .contains("`writable` needs an image"));
        let writable_image = JobRequest {
            writable: Some(true),
            image: Some("tiny".into()),
            ..req()
        };
        assert!(writable_image.resolve("/", &d).unwrap().writable);
        let not_sif = JobRequest {
            image: Some("/shared/images/pytorch".into()),
            ..req()
        };
        assert!(not_sif
            .resolve("/", &d)
            .unwrap_err()
            .contains("is a path but not a .sif file"));
        let sif = JobRequest {
            image: Some("/shared/images/pytorch.sif".into()),
            ..req()
        };
        assert!(sif.resolve("/", &d).is_ok());
        let env = JobRequest {
            env: [("1X".into(), "v".into())].into(),
            ..req()
        };
        assert!(env.resolve("/", &d).unwrap_err().contains("`env`"));
        let time = JobRequest {
            time: Some(d.max_time + 1),
            ..req()
        };
        assert!(time.resolve("/", &d).unwrap_err().contains("maximum"));
        assert!(req().resolve("rel", &d).is_err());
    }

    #[test]
    fn life_cycle() {
        use JobState::*;
        assert!(Pending.can_become(Starting));
        assert!(!Pending.can_become(Running));
        assert!(Running.can_become(Timeout));
        assert!(!Completed.can_become(Running));
        for s in JobState::ALL {
            assert_eq!(JobState::parse(s.as_str()), Some(s));
        }
    }

    #[test]
    fn exit_maps_to_state() {
        let ok = ExitInfo {
            code: Some(0),
            ..Default::default()
        };
        assert_eq!(ok.final_state(), JobState::Completed);
        let oom = ExitInfo {
            signal: Some(9),
            oom: true,
            ..Default::default()
        };
        assert_eq!(oom.final_state(), JobState::OutOfMemory);
        let to = ExitInfo {
            signal: Some(15),
            timed_out: true,
            ..Default::default()
        };
        assert_eq!(to.final_state(), JobState::Timeout);
    }
}
