//! The neutral container description and its result.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// Everything needed to run one job's container. Backend-neutral: no OCI or Docker types.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerSpec {
    /// Container id, unique on the node (e.g. `wharf-42`).
    pub id: String,
    /// Root filesystem directory (an image in the store, or `/` for the host).
    pub rootfs: PathBuf,
    /// First process and its arguments.
    pub argv: Vec<String>,
    /// Environment, `NAME=value`.
    pub env: Vec<String>,
    /// Working directory inside the container.
    pub cwd: String,
    /// User the job runs as (mapped to itself in the user namespace).
    pub uid: u32,
    /// Primary group.
    pub gid: u32,
    /// Supplementary groups (also mapped to themselves).
    pub groups: Vec<u32>,
    /// Host id that container root maps to; owns nothing on the host.
    pub root_host_id: u32,
    /// Hostname inside the container.
    pub hostname: String,
    /// Memory limit, bytes.
    pub memory: Option<u64>,
    /// CPU bandwidth limit in CPUs (quota = cpus × period).
    pub cpus: Option<u32>,
    /// Host CPU ids the job is pinned to.
    pub cpuset: Vec<u32>,
    /// Maximum number of tasks.
    pub pids: Option<i64>,
    /// Size of the private `/tmp`, bytes.
    pub tmp_size: u64,
    /// Size of `/dev/shm`, bytes.
    pub shm_size: u64,
    /// File that receives standard output (created as the user).
    pub stdout: PathBuf,
    /// File that receives standard error; equal to `stdout` for one combined file.
    pub stderr: PathBuf,
    /// Append to the output files instead of truncating them (a requeued job's next run).
    #[serde(default)]
    pub append_output: bool,
    /// Standard output goes to the job directory's [`crate::JobDir::captured`] file instead
    /// of `stdout` (a step's task whose caller takes its output: the agent passes it on).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub capture_stdout: bool,
    /// The same for standard error.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub capture_stderr: bool,
    /// Standard input is the job directory's [`crate::JobDir::stdin_pipe`], which the agent
    /// writes into (a step's task that takes its caller's input), instead of `/dev/null`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub capture_stdin: bool,
    /// Time limit, seconds.
    pub time_limit: Option<u64>,
    /// Seconds between SIGTERM and SIGKILL.
    pub grace_secs: u64,
    /// Parent of the job's cgroup (e.g. `wharf`).
    pub cgroup_parent: String,
    /// RLIMIT_MEMLOCK for the job, bytes; `None` = unlimited (what RDMA and NCCL want). The shim
    /// clamps it to what it holds itself when it cannot raise its own limit.
    #[serde(default)]
    pub memlock: Option<u64>,
    /// When `rootfs` is a SIF file: the byte range of its squashfs root partition, which the
    /// shim mounts read-only through a loop device.
    #[serde(default)]
    pub rootfs_partition: Option<(u64, u64)>,
    /// The image's digest, when it is an image of the store (a pulled image's manifest
    /// digest, an imported one's content digest), for the job's record: the runtime does not
    /// use it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_digest: Option<String>,
    /// RLIMIT_STACK for the job, bytes (`u64::MAX` = unlimited); `None` keeps the node's.
    #[serde(default)]
    pub stack: Option<u64>,
    /// Run through the Docker engine instead of Wharf's own sandbox (the `docker` backend).
    #[serde(default)]
    pub docker: Option<DockerTarget>,
    /// The user is root inside (uid/gid 0 map to the user's ids); still no capabilities.
    #[serde(default)]
    pub remap_root: bool,
    /// The root is writable: an image under a per-job layer as large as the memory limit.
    #[serde(default)]
    pub writable: bool,
    /// The task runs no program: its sandbox is made as for any task (its cgroup, its share
    /// of the node held for the job's steps), then it ends at once with status 0, or with
    /// [`ContainerSpec::hold`] waits to be stopped. A rank past 0 of a job whose command runs
    /// once, as sbatch runs a batch script.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub idle: bool,
    /// An idle task runs nothing until the job is stopped (a cancel, the end of the job's
    /// command on its first node, or its time limit), holding its node for the job: the first
    /// task on each node but the first, so that the node's part of the job runs while the
    /// job does (its time limit can change there, its node's loss is the job's). Only with
    /// `idle`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub hold: bool,
    /// Host paths bound into the container (site shared storage: home, data, scratch).
    #[serde(default)]
    pub binds: Vec<Bind>,
    /// Who the user is, for the `/etc/passwd` and `/etc/group` entries written into an image's
    /// root (the host image has the node's own).
    #[serde(default)]
    pub identity: Option<Identity>,
    /// Device nodes the job may use (its GPUs and their control devices); every other device
    /// but the standard list is absent and denied.
    #[serde(default)]
    pub devices: Vec<DeviceNode>,
    /// Small files the job reads in its private `/tmp`, as `(name, contents)`: each is
    /// `TMP_FILES_DIR/name`, written by the sandbox into its own `/tmp` before any bind, owned by
    /// the container's root and read-only to the job (the agent's hostfile). A name is one
    /// plain path component. The Docker backend binds them read-only from the job directory
    /// instead, unless a bind replaces `/tmp`.
    #[serde(default)]
    pub tmp_files: Vec<(String, String)>,
    /// The job's cgroup on the node, when this container's cgroup is one of its leaves (a
    /// task of the job or of one of its steps); `None`: the container's cgroup sits directly
    /// under `cgroup_parent` (a spec written before job cgroups were shared).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_cgroup: Option<JobCgroupSpec>,
}

/// The job's cgroup on a node: it holds no process itself (cgroup v2 allows processes only in
/// leaves once controllers are enabled below), and its limits hold for all its leaves
/// together, the job's tasks and its steps' tasks, as Slurm's job cgroup holds its steps'.
/// Every leaf's shim writes the same values (they come from the job, not the task), so the
/// order in which tasks and steps start does not matter.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobCgroupSpec {
    /// Its name under `cgroup_parent` (`wharf-12`).
    pub name: String,
    /// Memory limit of the job on the node, bytes.
    pub memory: Option<u64>,
    /// Host CPU ids the job holds on the node.
    pub cpuset: Vec<u32>,
    /// Maximum number of tasks, all leaves together.
    pub pids: Option<i64>,
}

/// Where the sandbox puts a spec's `tmp_files`.
pub const TMP_FILES_DIR: &str = "/tmp/wharf";

/// Where and what the Docker backend runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DockerTarget {
    /// The engine's socket.
    pub socket: PathBuf,
    /// An image the engine has (e.g. made with `docker import`).
    pub image: String,
}

/// A host directory bound into the container (nosuid, nodev).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Bind {
    /// Host path.
    pub source: PathBuf,
    /// Path in the container.
    pub destination: String,
    /// Mounted read-only.
    pub read_only: bool,
    /// For a user's bind: the node's allowed directory `source` lies under. The shim then
    /// resolves `source` beneath it as the job's user, with no symlink on the way, and binds
    /// that descriptor ([`crate::shim`]). `None` for the node's own binds (shared paths, GPU
    /// driver files), which are bound by path.
    #[serde(default)]
    pub beneath: Option<PathBuf>,
}

/// The job user's names, for an image's `/etc/passwd` and `/etc/group`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Identity {
    /// User name.
    pub user: String,
    /// Home directory.
    pub home: String,
    /// Names of the primary and supplementary groups, by gid.
    pub groups: Vec<(u32, String)>,
}

/// A host character device passed into the container.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceNode {
    /// The device node on the host.
    pub host_path: PathBuf,
    /// Where the job sees it (e.g. `/dev/nvidia2`).
    pub path: String,
    /// Major number.
    pub major: i64,
    /// Minor number.
    pub minor: i64,
}

impl DeviceNode {
    /// Describes the character device at `host_path`, to appear at `path`.
    pub fn from_host(host_path: &std::path::Path, path: &str) -> std::io::Result<DeviceNode> {
        use std::os::unix::fs::{FileTypeExt, MetadataExt};
        let meta = std::fs::metadata(host_path)?;
        if !meta.file_type().is_char_device() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("{} is not a character device", host_path.display()),
            ));
        }
        let rdev = meta.rdev();
        Ok(DeviceNode {
            host_path: host_path.to_path_buf(),
            path: path.to_string(),
            major: i64::from(libc::major(rdev)),
            minor: i64::from(libc::minor(rdev)),
        })
    }
}

impl ContainerSpec {
    /// The cgroup path of this container, relative to each hierarchy's root.
    pub fn cgroup_path(&self) -> String {
        match self.job_cgroup_path() {
            Some(job) => format!("{job}/{}", self.id),
            None => format!("/{}/{}", self.cgroup_parent.trim_matches('/'), self.id),
        }
    }

    /// The cgroup path of the job's cgroup this container's is a leaf of, if any.
    pub fn job_cgroup_path(&self) -> Option<String> {
        self.job_cgroup
            .as_ref()
            .map(|j| format!("/{}/{}", self.cgroup_parent.trim_matches('/'), j.name))
    }
}

/// How a container ended, as written by the shim.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Outcome {
    /// Exit status when it exited.
    pub exit_code: Option<i32>,
    /// Signal that ended it.
    pub signal: Option<i32>,
    /// The OOM killer fired in its cgroup.
    pub oom: bool,
    /// Killed at the time limit.
    pub timed_out: bool,
    /// Killed because it was cancelled.
    pub cancelled: bool,
    /// When the user's process started, ms since the epoch (`None` if it never did).
    pub started_ms: Option<u64>,
    /// When everything was gone, ms since the epoch.
    pub ended_ms: u64,
    /// Why it could not start, or what went wrong while cleaning up.
    pub error: Option<String>,
    /// When it could not start: whose fault that was and the step that failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fault: Option<wharf_api::fault::LaunchFault>,
    /// What the kernel counted in its cgroup, read at its end.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<crate::CgroupUsage>,
}
