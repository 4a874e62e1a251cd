//! `wharf agent`: the node daemon. Registers the node, long-polls the controller for orders,
//! launches each job's sandbox through a detached shim, and reports what it holds.
//!
//! The agent keeps no job state in memory: the job directories under `state_dir/jobs` are the
//! truth, so an agent restart (or crash) loses nothing — running shims carry on, and their
//! outcomes are reported on the next poll.

pub mod cdi;
pub mod discover;
pub mod engine;
pub mod env;
pub mod images;
pub mod launch;
pub mod node_key;
pub mod prepull;
pub mod signal;
pub mod step;
pub mod step_input;
pub mod step_output;
pub mod usage;
pub mod watch;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use std::sync::Arc;
use wharf_api::text::bound_message;
use wharf_api::wire::{
    AgentJob, LaunchOrder, PollRequest, PollResponse, RegisterRequest, RegisterResponse,
};
use wharf_api::{ExitInfo, JobState, NodeInfo};
use wharf_client::{Client, ClientError, Endpoint};

use wharf_runtime::{Backend, JobDir, JobStatus, Launcher, Outcome};

/// Agent settings.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    /// The controller.
    pub controller: Endpoint,
    /// How a TCP controller's certificate is checked (its authority); `None` on a socket.
    pub controller_tls: Option<wharf_client::Tls>,
    /// Join token.
    pub token: String,
    /// This node's name.
    pub node_name: String,
    /// Directory for job directories.
    pub state_dir: PathBuf,
    /// The node's image store.
    pub image_store: PathBuf,
    /// How registry images are pulled (`[images]`).
    pub registry: wharf_images::registry::RegistryOptions,
    /// Bytes pulled images may take in the store (`[images] cache_quota`); `None`: no limit.
    pub cache_quota: Option<u64>,
    /// The cluster-wide layer cache pulls look in first and publish to
    /// (`[images] shared_cache`), checked when the settings were read.
    pub shared_cache: Option<wharf_images::SharedCache>,
    /// The binary that runs `shim` (normally this one).
    pub shim_exe: PathBuf,
    /// Host id container root maps to.
    pub root_host_id: u32,
    /// Seconds between SIGTERM and SIGKILL.
    pub grace_secs: u64,
    /// Private /tmp size, bytes.
    pub tmp_size: u64,
    /// /dev/shm size, bytes.
    pub shm_size: u64,
    /// Task limit per job.
    pub pids_limit: Option<i64>,
    /// cgroup under which job cgroups are made.
    pub cgroup_parent: String,
    /// Memory kept back for the system, bytes.
    pub reserved_memory: u64,
    /// Where GPU device nodes are looked for.
    pub dev_root: PathBuf,
    /// Whether GPUs are described and measured through NVML (else described from the
    /// driver's `/proc` files, and not measured).
    pub nvml: bool,
    /// How often running jobs' usage is sampled; zero turns sampling off.
    pub sample_interval: Duration,
    /// Which sandbox runs jobs.
    pub backend: BackendKind,
    /// RLIMIT_MEMLOCK for jobs, bytes; `None` = unlimited.
    pub memlock: Option<u64>,
    /// RLIMIT_STACK for jobs, bytes (`u64::MAX` = unlimited); `None` keeps the agent's.
    pub stack: Option<u64>,
    /// Shared paths bound into every job (those that exist on the node).
    pub binds: Vec<wharf_runtime::Bind>,
    /// Directories under which users may ask for their own binds (`--mount`).
    pub allowed_mounts: Vec<PathBuf>,
    /// Where CDI specs are looked for (driver libraries and tools for GPU jobs).
    pub cdi_dirs: Vec<PathBuf>,
    /// Without a CDI spec: where NVIDIA's libraries and tools are looked for.
    pub driver_lib_dirs: Vec<PathBuf>,
    /// Without a CDI spec: where NVIDIA's tools are looked for.
    pub driver_bin_dirs: Vec<PathBuf>,
    /// Features reported with the node, for jobs' `--constraint`.
    pub features: Vec<String>,
    /// The interface jobs talk to each other over (`ib0`); its address is `MASTER_ADDR`.
    pub fabric_interface: Option<String>,
    /// Environment every job on this node starts with (`NCCL_SOCKET_IFNAME`, `FI_PROVIDER`,
    /// ...); a job's own `--env` wins.
    pub job_env: Vec<(String, String)>,
}

/// The sandbox backend an agent uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BackendKind {
    /// Wharf's own sandbox through `wharf shim` (images from the store, SIF files, the host).
    Oci,
    /// The Docker engine at this socket (images from the engine).
    Docker(PathBuf),
}

/// An agent failure that stops it.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// Setup failed.
    #[error("{0}")]
    Setup(String),
}

/// What this node has, found once: the registration and every launch use the same GPUs.
pub fn probe(cfg: &AgentConfig) -> discover::Machine {
    let cpus = discover::cpus();
    discover::Machine {
        cpu_numa: discover::cpu_numa(Path::new("/sys"), &cpus),
        cpus,
        gpus: discover::gpus(&cfg.dev_root, cfg.nvml),
    }
}

/// The node's description, of the machine `probe` found.
pub fn node_info(cfg: &AgentConfig, machine: &discover::Machine) -> NodeInfo {
    NodeInfo {
        name: cfg.node_name.clone(),
        address: cfg.node_name.clone(),
        cpus: machine.cpus.len() as u32,
        memory: discover::memory_total().saturating_sub(cfg.reserved_memory),
        gpus: machine.gpus.clone(),
        cpu_numa: machine.cpu_numa.clone(),
        version: env!("CARGO_PKG_VERSION").into(),
        features: cfg.features.clone(),
        fabric_address: cfg
            .fabric_interface
            .as_deref()
            .and_then(discover::interface_address),
    }
}

impl AgentConfig {
    /// A client for the controller that sends `credential` (the join token or the node's key).
    pub fn client(&self, credential: String) -> Client {
        let client = Client::new(self.controller.clone(), Some(credential));
        match &self.controller_tls {
            Some(tls) => client.with_tls(tls.clone()),
            None => client,
        }
    }
}

/// Runs the agent until the task is dropped. Controller outages are waited out.
pub async fn run(cfg: AgentConfig) -> Result<(), AgentError> {
    // Held while the agent runs: no second agent on this machine makes jobs' cgroups here.
    let _cgroups = match cfg.backend {
        BackendKind::Oci => Some(
            wharf_runtime::claim_cgroup_parent(&cfg.cgroup_parent).map_err(AgentError::Setup)?,
        ),
        BackendKind::Docker(_) => None,
    };
    for dir in [cfg.state_dir.clone(), cfg.state_dir.join("jobs")] {
        traverse_only_dir(&dir)
            .map_err(|e| AgentError::Setup(format!("securing {}: {e}", dir.display())))?;
    }
    let images = wharf_images::ImageStore::open(cfg.image_store.clone())
        .map_err(|e| AgentError::Setup(format!("image store {}: {e}", cfg.image_store.display())))?
        .with_quota(cfg.cache_quota)
        .with_shared_cache(cfg.shared_cache.clone());
    // Every request carries the node's own key; the join token only gets it.
    let key = node_key::obtain(&cfg, false).await;
    let client = cfg.client(key);
    // `wharf step` inside this node's jobs reaches the agent here.
    if let Err(e) = step::listen(&cfg, client.clone()) {
        tracing::error!(error = %e, socket = %step::socket_env(&cfg), "cannot open the step socket; `wharf step` will not work in this node's jobs");
    }
    // The sandbox backend: Wharf's own OCI sandbox (through `wharf shim`), or Docker.
    let launcher: Arc<dyn Backend> = match &cfg.backend {
        BackendKind::Oci => Arc::new(Launcher::new(cfg.shim_exe.clone())),
        BackendKind::Docker(_) => Arc::new(wharf_runtime::DockerBackend::new(cfg.shim_exe.clone())),
    };
    // Launches then fork a warm shim spawner; without it they start shims directly.
    if let Err(e) = launcher.warm_up() {
        tracing::warn!(error = %e, "cannot start the shim spawner");
    }
    // The Docker engine's images are listed at each poll; the store's are watched.
    let images_dir = (cfg.backend == BackendKind::Oci).then(|| images.images_dir());
    let changes = watch::Changes::new(&cfg.state_dir.join("jobs"), images_dir.as_deref())
        .map_err(|e| AgentError::Setup(format!("watching {}: {e}", cfg.state_dir.display())))?;
    let machine = probe(&cfg);
    usage::spawn(
        cfg.state_dir.join("jobs"),
        cfg.sample_interval,
        machine.clone(),
    );
    step_output::spawn(&cfg, client.clone(), launcher.clone());
    step_input::spawn(&cfg, client.clone(), launcher.clone());
    let pulls = images::Pulls::default();
    let mut wait_ms = 0;
    let mut registered = false;
    let mut detail = Detail::default();
    // This run's reports are counted, so that the controller takes none older than one it
    // took: a report is given up on (not its request) when something changes here.
    let boot = run_id();
    let mut polls = 0u64;
    // Signal orders passed on, remembered here as well as on disk (see `signal::Passed`).
    let passed = signal::Passed::default();
    loop {
        if !registered {
            let req = RegisterRequest {
                node: node_info(&cfg, &machine),
            };
            match client
                .post::<_, RegisterResponse>("/v1/agent/register", &req)
                .await
            {
                Ok(r) => {
                    tracing::info!(node = %cfg.node_name, cpus = req.node.cpus, gpus = req.node.gpus.len(), "registered");
                    wait_ms = r.poll_wait_ms;
                    registered = true;
                }
                Err(ClientError::Api { status: 401, .. }) => {
                    rejoin(&cfg, &client).await;
                    continue;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "registration failed; retrying");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                }
            }
        }
        let ((mut jobs, shims), image_names) =
            local_state(&cfg, launcher.as_ref(), &images, &pulls);
        let steps = step::report(&cfg, launcher.as_ref());
        detail.apply(&mut jobs);
        polls += 1;
        let signalled = passed.report(&cfg, &jobs);
        let req = PollRequest {
            seq: Some(wharf_api::wire::PollSeq { boot, n: polls }),
            node: cfg.node_name.clone(),
            jobs,
            wait_ms,
            images: image_names,
            pulling: pulls.progress(),
            prepulls: pulls.prepulls().reports(),
            steps,
            signalled,
        };
        let poll = client.post::<_, PollResponse>("/v1/agent/poll", &req);
        // What changes here (a job starts or ends, an image is imported) is reported at once,
        // not at the end of a long poll.
        let result = tokio::select! {
            r = poll => r,
            () = local_change(&cfg, launcher.as_ref(), &images, &pulls, &changes, &req, shims) => continue,
        };
        match result {
            Ok(orders) => {
                let (c, i) = (cfg.clone(), images.clone());
                pulls
                    .prepulls()
                    .take(&orders.pull, move |reference, progress| {
                        prepull::pull_on_node(&c, &i, reference, progress)
                    });
                let (c, l, i, m, p, sp) = (
                    cfg.clone(),
                    launcher.clone(),
                    images.clone(),
                    machine.clone(),
                    pulls.clone(),
                    passed.clone(),
                );
                let _ =
                    tokio::task::spawn_blocking(move || carry_out(&c, &l, &i, &m, &p, &sp, orders))
                        .await;
            }
            Err(ClientError::Api { status: 404, .. }) => registered = false,
            Err(ClientError::Api { status: 401, .. }) => {
                rejoin(&cfg, &client).await;
                registered = false;
            }
            // The report itself was refused (too large for the controller): registering
            // again would not help, and would make the node look alive while its reports are
            // lost. Send less detail until the controller takes it.
            Err(
                e @ ClientError::Api {
                    status: 400 | 413, ..
                },
            ) => {
                detail = detail.refused(&req.jobs);
                tracing::error!(error = %e, ?detail, "the controller refused this node's report; sending less of each ended job's message");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Err(e) => {
                tracing::warn!(error = %e, "poll failed; retrying");
                if !e.is_transient() {
                    registered = false;
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
}

/// The controller does not know the node's key (401: an admin forgot it, or its database is
/// new): the agent joins again with a new one, which every clone of `client` sends from then
/// on (the node's other requests wait and retry meanwhile).
async fn rejoin(cfg: &AgentConfig, client: &Client) {
    tracing::warn!(node = %cfg.node_name, "the controller refused this node's key; joining again");
    client.set_token(node_key::obtain(cfg, true).await);
}

/// A number for this run of the agent, unlike any earlier run's on this node: the time it
/// started, in nanoseconds, mixed with its process id.
fn run_id() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    nanos ^ (u64::from(std::process::id()) << 40)
}

/// How much of each ended job's message a poll carries. Full unless the controller refused a
/// report; then shorter until the jobs whose reports were refused are gone.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
enum Detail {
    /// Messages as recorded (each at most [`wharf_api::text::MAX_MESSAGE`] bytes).
    #[default]
    Full,
    /// Messages cut to [`SHORT_MESSAGE`] bytes while any of these jobs is reported.
    Short(BTreeSet<u64>),
    /// No messages while any of these jobs is reported.
    Bare(BTreeSet<u64>),
}

/// A message's length once a report was refused.
const SHORT_MESSAGE: usize = 256;

impl Detail {
    /// The next step down after the controller refused a report of `jobs`.
    fn refused(&self, jobs: &[AgentJob]) -> Detail {
        let ended = jobs
            .iter()
            .filter(|j| j.exit.is_some())
            .map(|j| j.id)
            .collect();
        match self {
            Detail::Full => Detail::Short(ended),
            Detail::Short(_) | Detail::Bare(_) => Detail::Bare(ended),
        }
    }

    /// Cuts the messages of `jobs` to this detail; back to full once the jobs of the refused
    /// report are all gone.
    fn apply(&mut self, jobs: &mut [AgentJob]) {
        let (Detail::Short(refused) | Detail::Bare(refused)) = &*self else {
            return;
        };
        if !jobs.iter().any(|j| refused.contains(&j.id)) {
            *self = Detail::Full;
            return;
        }
        let short = matches!(self, Detail::Short(_));
        for exit in jobs.iter_mut().filter_map(|j| j.exit.as_mut()) {
            exit.message = match exit.message.take() {
                Some(m) if short => Some(wharf_api::text::bounded(&m, SHORT_MESSAGE).into_owned()),
                _ => None,
            };
        }
    }
}

/// The jobs (with the pids of their live shims) and images this node has now.
fn local_state(
    cfg: &AgentConfig,
    launcher: &dyn Backend,
    images: &wharf_images::ImageStore,
    pulls: &images::Pulls,
) -> ((Vec<AgentJob>, Vec<u32>), Vec<String>) {
    (report(cfg, launcher, pulls, true), image_names(cfg, images))
}

/// The images this node can run: its store's, or the Docker engine's.
fn image_names(cfg: &AgentConfig, images: &wharf_images::ImageStore) -> Vec<String> {
    match &cfg.backend {
        BackendKind::Oci => images.names().unwrap_or_default(),
        // The client runs its own small runtime: call it from a plain thread.
        BackendKind::Docker(socket) => std::thread::scope(|s| {
            s.spawn(|| wharf_runtime::docker::list_images(socket))
                .join()
        })
        .unwrap_or_else(|_| Ok(vec![]))
        .unwrap_or_else(|e| {
            tracing::warn!(error = %e, "cannot list the engine's images");
            vec![]
        }),
    }
}

/// The least time between two reports sent because a pull made progress: a pull of many
/// layers does not send a report per layer.
pub const PROGRESS_EVERY: Duration = Duration::from_secs(1);

/// Resolves once the progress of the pulls and pre-pulls under way differs from what `sent`,
/// the report sent at `sent_at`, carried, and [`PROGRESS_EVERY`] has passed since.
async fn progress_to_report(
    pulls: &images::Pulls,
    sent: &PollRequest,
    sent_at: tokio::time::Instant,
) {
    loop {
        pulls.progressed().await;
        tokio::time::sleep_until(sent_at + PROGRESS_EVERY).await;
        if pulls.progress() != sent.pulling || pulls.prepulls().reports() != sent.prepulls {
            return;
        }
    }
}

/// Resolves when a job started or ended, or the image list changed, since `sent`, whose live
/// shims are `shims`: woken by what [`watch::Changes`] sees, never by a timer. Also when the
/// progress of the pulls under way differs from `sent`'s, but not before [`PROGRESS_EVERY`]
/// has passed since this wait began (when `sent` went out).
async fn local_change(
    cfg: &AgentConfig,
    launcher: &dyn Backend,
    images: &wharf_images::ImageStore,
    pulls: &images::Pulls,
    changes: &watch::Changes,
    sent: &PollRequest,
    mut shims: Vec<u32>,
) {
    let shape = |jobs: &[AgentJob]| -> Vec<(u64, bool, bool, bool)> {
        jobs.iter()
            .map(|j| (j.id, j.ready, j.start_time.is_some(), j.exit.is_some()))
            .collect()
    };
    let step_shape = |steps: &[wharf_api::step::AgentStep]| -> Vec<_> {
        steps
            .iter()
            .map(|s| (s.key, s.start_time.is_some(), s.exit.is_some()))
            .collect()
    };
    let before = shape(&sent.jobs);
    let steps_before = step_shape(&sent.steps);
    let progressed = progress_to_report(pulls, sent, tokio::time::Instant::now());
    tokio::pin!(progressed);
    loop {
        tokio::select! {
            () = changes.next(&shims) => {}
            // A step task's output is all passed on: its end may be reported now.
            () = step_output::DRAINED.notified() => {}
            () = &mut progressed => return,
        }
        // Only the jobs' shapes are compared: their usage is not read here.
        let (jobs, live) = report(cfg, launcher, pulls, false);
        let images_changed =
            cfg.backend == BackendKind::Oci && image_names(cfg, images) != sent.images;
        let steps_changed = step_shape(&step::report(cfg, launcher)) != steps_before;
        if shape(&jobs) != before || images_changed || steps_changed {
            return;
        }
        shims = live;
    }
}

/// Every job this node holds, from its directories, and the pids of the live shims; ended
/// jobs' measured usage only when `usage` (it is read from their files). A job whose image is
/// being pulled is left out until its launch is over: its directory may exist without its
/// shim yet, which would read as a lost job (its pull's progress goes in the poll's
/// `pulling` instead). A job with several tasks here is one entry
/// ([`node_report`]); once one of its tasks has ended badly, the others are stopped.
fn report(
    cfg: &AgentConfig,
    launcher: &dyn Backend,
    pulls: &images::Pulls,
    usage: bool,
) -> (Vec<AgentJob>, Vec<u32>) {
    let Ok(entries) = std::fs::read_dir(cfg.state_dir.join("jobs")) else {
        return (vec![], vec![]);
    };
    let mut by_job: std::collections::BTreeMap<u64, Vec<(u32, JobDir)>> = Default::default();
    let mut prepared = BTreeSet::new();
    for entry in entries.flatten() {
        let name = entry.file_name();
        if let Some(id) = name.to_str().and_then(launch::parse_ready_name) {
            prepared.insert(id);
            continue;
        }
        let Some((id, local)) = name.to_str().and_then(launch::parse_task_dir_name) else {
            continue;
        };
        if pulls.pulling(id) {
            continue;
        }
        by_job
            .entry(id)
            .or_default()
            .push((local, JobDir::new(entry.path())));
    }
    let mut out = Vec::new();
    let mut shims = Vec::new();
    let mut running = BTreeSet::new();
    let by_job_ids: BTreeSet<u64> = by_job.keys().copied().collect();
    for (id, mut dirs) in by_job {
        dirs.sort_by_key(|(local, _)| *local);
        let tasks: Vec<TaskReport> = dirs
            .iter()
            .map(|(local, dir)| {
                let (task, shim) = task_report(launcher, *local, dir, usage);
                shims.extend(shim);
                task
            })
            .collect();
        if let Some((failed, reason)) = siblings_to_stop(&tasks, &cfg.node_name) {
            for (local, dir) in &dirs {
                let t = tasks.iter().find(|t| t.local == *local);
                if *local == failed || t.is_some_and(|t| t.exit.is_some() || t.stopping) {
                    continue;
                }
                tracing::info!(job = id, task = local, %reason, "stopping the job's other tasks on this node");
                step::stop_task(launcher, dir, &reason);
            }
        }
        let job = node_report(id, &tasks);
        if job.exit.is_none() {
            running.insert(id);
        }
        out.push(job);
    }
    // Prepared here, waiting for its release (its tasks are not launched yet).
    for id in prepared {
        if by_job_ids.contains(&id) || pulls.pulling(id) {
            continue;
        }
        running.insert(id);
        out.push(AgentJob {
            id,
            start_time: None,
            exit: None,
            end_time: None,
            stopping: false,
            ready: true,
            time_limit: None,
        });
    }
    // A job's image stays pinned while it runs or waits (its shims pin it too).
    pulls.keep_pins(&running);
    (out, shims)
}

/// What the agent knows of one task of a job on this node (its own sandbox).
#[derive(Debug, Clone, Default, PartialEq)]
struct TaskReport {
    /// Its index on the node.
    local: u32,
    /// When its first process started.
    start_time: Option<u64>,
    /// How it ended, once it has.
    exit: Option<ExitInfo>,
    /// When it ended.
    end_time: Option<u64>,
    /// A stop was passed on to it.
    stopping: bool,
    /// While it runs: the time limit its shim holds it to (a changed one, else the launch's).
    time_limit: Option<u64>,
}

/// A task that ended badly on its own (not stopped by a cancel), if any, the first to end,
/// with the words its still-running siblings are stopped with.
fn siblings_to_stop(tasks: &[TaskReport], node: &str) -> Option<(u32, String)> {
    if tasks.len() < 2 {
        return None;
    }
    let failed = tasks
        .iter()
        .filter(|t| {
            t.exit
                .as_ref()
                .is_some_and(|e| e.final_state() != JobState::Completed && !e.cancelled)
        })
        .min_by_key(|t| (t.end_time, t.local))?;
    let running = tasks.iter().any(|t| t.exit.is_none() && !t.stopping);
    running.then(|| {
        (
            failed.local,
            format!(
                "task {} of the job on node {node} failed; stopping the others",
                failed.local
            ),
        )
    })
}

/// One job's entry in the report, from its tasks on this node: started once every task has
/// (or has ended), ended once every task has, as the deciding task ended (the first that
/// failed on its own, else the first that did not complete, else the first task), with
/// what they all used. A job whose first task's directory is not there yet is still being
/// launched (tasks are launched last to first) and has neither.
fn node_report(id: u64, tasks: &[TaskReport]) -> AgentJob {
    let launching = tasks.first().is_none_or(|t| t.local != 0);
    let all_started = tasks
        .iter()
        .all(|t| t.start_time.is_some() || t.exit.is_some());
    let start_time = tasks
        .iter()
        .filter_map(|t| t.start_time)
        .min()
        .filter(|_| all_started && !launching);
    let all_ended = !launching && tasks.iter().all(|t| t.exit.is_some());
    let stopping = !all_ended && tasks.iter().any(|t| t.stopping);
    if !all_ended {
        return AgentJob {
            id,
            start_time,
            exit: None,
            end_time: None,
            stopping,
            ready: false,
            // The agent writes a changed limit to every task's directory at once.
            time_limit: tasks.iter().find_map(|t| t.time_limit),
        };
    }
    let bad = |t: &&TaskReport| {
        t.exit
            .as_ref()
            .is_some_and(|e| e.final_state() != JobState::Completed)
    };
    let by_end = |t: &&TaskReport| (t.end_time, t.local);
    let deciding = tasks
        .iter()
        .filter(bad)
        .filter(|t| t.exit.as_ref().is_some_and(|e| !e.cancelled))
        .min_by_key(by_end)
        .or_else(|| tasks.iter().filter(bad).min_by_key(by_end))
        .unwrap_or(&tasks[0]);
    let mut exit = deciding.exit.clone().unwrap_or_default();
    if tasks.len() > 1 {
        exit.task = Some(deciding.local);
        exit.usage = merged_usage(tasks.iter().filter_map(|t| t.exit.as_ref()?.usage.as_ref()));
    }
    AgentJob {
        id,
        start_time: tasks.iter().filter_map(|t| t.start_time).min(),
        exit: Some(exit),
        end_time: tasks.iter().filter_map(|t| t.end_time).max(),
        stopping: false,
        ready: false,
        time_limit: None,
    }
}

/// What the tasks of a job on one node used together: CPU time, I/O and memory summed (they
/// ran side by side, each in its own cgroup), every task's GPUs (a GPU seen by several tasks
/// once, with its highest figures). `None` when none measured anything.
fn merged_usage<'a>(
    usages: impl Iterator<Item = &'a wharf_api::usage::JobUsage>,
) -> Option<wharf_api::usage::JobUsage> {
    let mut out: Option<wharf_api::usage::JobUsage> = None;
    let sum = |a: Option<u64>, b: Option<u64>| match (a, b) {
        (Some(a), Some(b)) => Some(a + b),
        (a, b) => a.or(b),
    };
    for u in usages {
        let Some(o) = out.as_mut() else {
            out = Some(u.clone());
            continue;
        };
        o.cpu_time_ms = sum(o.cpu_time_ms, u.cpu_time_ms);
        o.io_read = sum(o.io_read, u.io_read);
        o.io_write = sum(o.io_write, u.io_write);
        o.memory_peak = sum(o.memory_peak, u.memory_peak);
        o.memory_avg = sum(o.memory_avg, u.memory_avg);
        o.samples = o.samples.min(u.samples);
        for g in &u.gpus {
            match o.gpus.iter_mut().find(|h| h.id == g.id) {
                Some(h) => {
                    h.util_avg = h.util_avg.max(g.util_avg);
                    h.util_peak = h.util_peak.max(g.util_peak);
                    h.memory_peak = h.memory_peak.max(g.memory_peak);
                    h.energy_j = h.energy_j.max(g.energy_j);
                }
                None => o.gpus.push(g.clone()),
            }
        }
    }
    out
}

/// What the task of `dir` (local index `local`) is doing, as its report says it, with its
/// shim's pid while it runs; with `usage`, an ended task's usage summary and image digest.
pub(crate) fn task_report(
    launcher: &dyn Backend,
    local: u32,
    dir: &JobDir,
    usage: bool,
) -> (TaskReport, Option<u32>) {
    let mut time_limit = None;
    let (exit, end_time, start_time, shim) = match launcher.status(dir) {
        JobStatus::Running { pid, started_ms } => {
            time_limit = dir.held_time_limit();
            (None, None, started_ms, Some(pid))
        }
        JobStatus::Exited(o) => {
            let mut exit = exit_info(&o);
            if usage {
                exit.usage = usage::summary(dir, &o);
                exit.image_digest = dir.read_spec().ok().and_then(|s| s.image_digest);
            }
            (Some(exit), Some(o.ended_ms), o.started_ms, None)
        }
        JobStatus::Lost(why) => (
            Some(ExitInfo {
                message: Some(bound_message(why)),
                ..Default::default()
            }),
            Some(wharf_runtime::now_ms()),
            None,
            None,
        ),
    };
    let task = TaskReport {
        local,
        start_time,
        exit,
        end_time,
        stopping: dir.stop().exists(),
        time_limit,
    };
    (task, shim)
}

fn exit_info(o: &Outcome) -> ExitInfo {
    ExitInfo {
        code: o.exit_code,
        signal: o.signal,
        oom: o.oom,
        timed_out: o.timed_out,
        cancelled: o.cancelled,
        // An outcome written by an older shim may hold a message of any length; every
        // report carries it until the controller lets the job go.
        message: o.error.clone().map(bound_message),
        fault: o.fault,
        usage: None,
        image_digest: None,
        task: None,
    }
}

fn carry_out(
    cfg: &AgentConfig,
    launcher: &Arc<dyn Backend>,
    images: &wharf_images::ImageStore,
    machine: &discover::Machine,
    pulls: &images::Pulls,
    passed: &signal::Passed,
    orders: PollResponse,
) {
    for order in &orders.launch {
        start(cfg, launcher, images, machine, pulls, order);
    }
    let launcher = launcher.as_ref();
    for so in &orders.steps {
        step::launch(cfg, launcher, images, machine, so);
    }
    for k in &orders.kill_steps {
        step::kill(cfg, launcher, k.key, &k.reason);
    }
    for key in &orders.forget_steps {
        step::forget(cfg, launcher, *key);
    }
    for limit in &orders.limits {
        tracing::info!(
            job = limit.id,
            time_limit = limit.time_limit,
            "time limit changed"
        );
        // What its tasks held it to, by which its steps' limits move too.
        let dirs = task_dirs(&cfg.state_dir, limit.id);
        let held = dirs.first().and_then(JobDir::held_time_limit);
        if let Some(held) = held {
            let delta = i128::from(limit.time_limit) - i128::from(held);
            let delta = delta.clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64;
            step::shift_limits(cfg, limit.id, delta);
        }
        for dir in dirs {
            if !dir.path().exists() {
                continue;
            }
            if let Err(e) = dir.write_time_limit(limit.time_limit) {
                // The next report shows the old limit: the controller repeats the order.
                tracing::warn!(job = limit.id, error = %e, "cannot record the time limit");
            }
        }
    }
    // Before the kills: a signal ordered with a kill in the same answer (one taken before the
    // job was cancelled, say) reaches the job before its SIGTERM.
    for order in &orders.signals {
        passed.pass_on(cfg, launcher, order);
    }
    for kill in &orders.kill {
        tracing::info!(job = kill.id, reason = %kill.reason, "stopping job");
        // Prepared and never released: nothing ran; gone from the next report.
        let _ = std::fs::remove_file(launch::ready_mark(&cfg.state_dir, kill.id));
        // Its steps go with it.
        step::kill_job(cfg, launcher, kill.id, &kill.reason);
        for dir in task_dirs(&cfg.state_dir, kill.id) {
            if !dir.path().exists() {
                continue;
            }
            // Recorded first, so that the order is not repeated while the job winds down.
            let written = JobDir::write_private(&dir.stop(), kill.reason.as_bytes());
            if let Err(e) = written {
                tracing::warn!(job = kill.id, error = %e, "cannot record the stop order");
            }
            if let Err(e) = launcher.cancel(&dir) {
                tracing::warn!(job = kill.id, error = %e, "cancel failed");
                // Not passed on after all: let the controller repeat it.
                let _ = std::fs::remove_file(dir.stop());
            }
        }
    }
    let forget: BTreeSet<u64> = orders.forget.into_iter().collect();
    for id in forget {
        let _ = std::fs::remove_file(launch::ready_mark(&cfg.state_dir, id));
        // The first task's directory last: while it is there, the job is reported.
        let mut dirs = task_dirs(&cfg.state_dir, id);
        dirs.reverse();
        for dir in dirs {
            if let Err(e) = launcher.remove(&dir) {
                tracing::warn!(job = id, error = %e, "cannot remove job directory");
            }
        }
    }
}

/// The directories of job `id`'s tasks on this node, first task first (that one even when
/// missing, as the job's own).
fn task_dirs(state_dir: &Path, id: u64) -> Vec<JobDir> {
    let mut locals: Vec<u32> = std::fs::read_dir(state_dir.join("jobs"))
        .map(|entries| {
            entries
                .flatten()
                .filter_map(|e| launch::parse_task_dir_name(e.file_name().to_str()?))
                .filter(|(job, local)| *job == id && *local > 0)
                .map(|(_, local)| local)
                .collect()
        })
        .unwrap_or_default();
    locals.sort_unstable();
    std::iter::once(0)
        .chain(locals)
        .map(|local| launch::task_dir(state_dir, id, local))
        .collect()
}

/// Makes `dir` a directory of mode 0711 whatever the umask (and corrects an existing one):
/// a job's unprivileged ids must pass through the state directory to reach the root bound in
/// its job directory, but no one but root may list it, and the files that hold a job's
/// details are 0600.
fn traverse_only_dir(dir: &std::path::Path) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    match std::fs::DirBuilder::new().mode(0o711).create(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o755)
                .create(dir.parent().unwrap_or(dir))?;
            std::fs::DirBuilder::new().mode(0o711).create(dir)?;
        }
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => return Err(e),
        _ => {}
    }
    if !std::fs::symlink_metadata(dir)?.is_dir() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "not a directory",
        ));
    }
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o711))
}

/// Launches a job unless this node already has it (orders are repeated until confirmed); a
/// job whose registry image is not here yet is pulled first, on a thread of its own, and one
/// whose image is a private one cached here proves its access first, likewise.
fn start(
    cfg: &AgentConfig,
    launcher: &Arc<dyn Backend>,
    images: &wharf_images::ImageStore,
    machine: &discover::Machine,
    pulls: &images::Pulls,
    order: &LaunchOrder,
) {
    let dir = launch::job_dir(&cfg.state_dir, order.id);
    if dir.path().exists() || pulls.pulling(order.id) {
        return;
    }
    // Prepared already: a repeated order waits on, the release launches.
    if order.hold && launch::ready_mark(&cfg.state_dir, order.id).exists() {
        return;
    }
    // Work before the launch (a pull, a proof of access) runs on a thread of its own and
    // launches, or records why not, when it is done.
    let then_launch = |prepare: Prepare| {
        let (c, l, i, m, o, p) = (
            cfg.clone(),
            launcher.clone(),
            images.clone(),
            machine.clone(),
            order.clone(),
            pulls.clone(),
        );
        pulls.spawn(order.id, move || {
            let ready = prepare(&c, &p, &o);
            launch_now(&c, l.as_ref(), &i, &m, &p, &o, ready);
        });
    };
    if let Some(reference) = images::to_pull(cfg, images, &order.spec.image) {
        let i = images.clone();
        then_launch(Box::new(move |c, p, o| {
            images::pull_for(c, &i, p, o, &reference).map(Some)
        }));
        return;
    }
    // A registry image on a Docker node: the engine pulls it with the job's credential.
    if let Some(reference) = engine::to_engine_pull(cfg, &order.spec.image) {
        then_launch(Box::new(move |c, p, o| {
            engine::engine_pull_for(c, p, o, &reference).map(|()| None)
        }));
        return;
    }
    // A private image cached here: this job's credentials must prove access first.
    if let Some((reference, info)) = images::to_prove(cfg, images, &order.spec.image) {
        if !pulls.proven(order.owner.uid, &info.digest) {
            then_launch(Box::new(move |c, p, o| {
                images::prove_for(c, p, o, &reference, &info).map(|()| None)
            }));
            return;
        }
    }
    launch_now(
        cfg,
        launcher.as_ref(),
        images,
        machine,
        pulls,
        order,
        Ok(None),
    );
}

/// Whether a job may launch after the work before it: the pulled image's pin (none when
/// nothing was pulled here), or why not.
type Ready = Result<Option<wharf_images::Pin>, launch::LaunchError>;

/// Work a launch waits for (a pull, a proof of access), run on a thread of its own.
type Prepare = Box<dyn FnOnce(&AgentConfig, &images::Pulls, &LaunchOrder) -> Ready + Send>;

/// Launches `order` now, or records why it cannot run (`ready`'s error: a failed pull, and
/// whose fault that is; its value: the pulled image's pin): each of its tasks on this node in
/// a sandbox of its own. Every task's spec is built first (the preflight: user, image,
/// devices, RDMA, memlock), so that none starts when one cannot; then the tasks are
/// launched, the last first, so that the first task's directory (by which the job is known
/// here) comes once all the others are there. An order with `hold` stops after the
/// preflight: the job is marked ready ([`launch::ready_mark`]) and waits for its release.
/// A task that cannot start fails the job; the tasks not yet started are then recorded as
/// never started. A job on an image of the store keeps it pinned from here until it is seen
/// ended.
fn launch_now(
    cfg: &AgentConfig,
    launcher: &dyn Backend,
    images: &wharf_images::ImageStore,
    machine: &discover::Machine,
    pulls: &images::Pulls,
    order: &LaunchOrder,
    ready: Ready,
) {
    tracing::info!(job = order.id, user = %order.owner.user, image = %order.spec.image, tasks = order.spec.tasks_per_node, hold = order.hold, "launching");
    // The pulled image stays pinned until the launch holds its own pin.
    let (ready, _pulled) = match ready {
        Ok(pin) => (Ok(()), pin),
        Err(e) => (Err(e), None),
    };
    let locals: Vec<u32> = (0..order.spec.tasks_per_node.max(1))
        .rev()
        .filter(|&l| {
            !launch::task_dir(&cfg.state_dir, order.id, l)
                .path()
                .exists()
        })
        .collect();
    // The preflight: every task's spec, and the image pinned.
    let mut specs = Vec::new();
    let mut failed: Option<(u32, launch::LaunchError)> = None;
    for &local in &locals {
        let spec = ready.clone().and_then(|()| {
            let spec = launch::container_spec(cfg, images, order, local, machine)?;
            if specs.is_empty() {
                let pin = launch::pin_image(cfg, &spec).map_err(|e| {
                    launch::LaunchError::new(
                        launch::image_fault(&e),
                        format!(
                            "image {:?} on node {}: {e}",
                            order.spec.image, cfg.node_name
                        ),
                    )
                })?;
                if let Some(pin) = pin {
                    pulls.hold(order.id, pin);
                }
            }
            Ok(spec)
        });
        match spec {
            Ok(spec) => specs.push((local, spec)),
            Err(e) => {
                failed = Some((local, e));
                break;
            }
        }
    }
    let mark = launch::ready_mark(&cfg.state_dir, order.id);
    if failed.is_none() && order.hold {
        if let Err(e) = JobDir::write_atomic(&mark, &wharf_runtime::now_ms()) {
            tracing::error!(job = order.id, error = %e, "cannot record the job ready");
        } else {
            tracing::info!(job = order.id, "prepared; waiting for the release");
        }
        return;
    }
    let mut launched = BTreeSet::new();
    if failed.is_none() {
        for (local, spec) in &specs {
            let dir = launch::task_dir(&cfg.state_dir, order.id, *local);
            if let Err(e) = launcher.launch(&dir, spec) {
                failed = Some((*local, launch::LaunchError::from(e)));
                break;
            }
            launched.insert(*local);
        }
    }
    // Released (or failed): the job is known by its task directories from here on.
    let _ = std::fs::remove_file(&mark);
    let Some((task, error)) = failed else {
        return;
    };
    let fault = error.fault();
    tracing::warn!(job = order.id, task, error = %error.message, %fault, "launch failed");
    for &local in locals.iter().filter(|l| !launched.contains(l)) {
        // Why the task did not start: its launch failed (with whose fault that is), or
        // another task's did and it is never started (cancelled, no fault).
        let (message, fault) = if local == task {
            (error.message.clone(), Some(fault))
        } else {
            (
                format!("never started: task {task} of the job could not start"),
                None,
            )
        };
        let dir = launch::task_dir(&cfg.state_dir, order.id, local);
        record_not_started(&dir, order.id, message, fault);
    }
}

/// Records in `dir` (a task of job `job`, or of one of its steps) that it never ran: its
/// launch failed with `fault` (whose fault it is), or, without one, it was not started
/// because another task's launch failed (cancelled).
fn record_not_started(
    dir: &JobDir,
    job: wharf_api::JobId,
    message: String,
    fault: Option<wharf_api::fault::LaunchFault>,
) {
    let _ = traverse_only_dir(dir.path());
    let outcome = Outcome {
        error: Some(bound_message(message)),
        cancelled: fault.is_none(),
        fault,
        ended_ms: wharf_runtime::now_ms(),
        ..Default::default()
    };
    if let Err(e) = JobDir::write_atomic(&dir.outcome(), &outcome) {
        tracing::error!(job, dir = %dir.path().display(), error = %e, "cannot record a launch failure");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ended(id: u64, message: &str) -> AgentJob {
        AgentJob {
            id,
            start_time: None,
            exit: Some(ExitInfo {
                message: Some(message.into()),
                ..Default::default()
            }),
            end_time: Some(1),
            stopping: false,
            ready: false,
            time_limit: None,
        }
    }

    #[test]
    fn a_refused_report_is_sent_with_less_detail_until_its_jobs_are_gone() {
        let long = "x".repeat(4000);
        let mut detail = Detail::default();
        let mut jobs = vec![ended(1, &long), ended(2, "short")];
        detail.apply(&mut jobs);
        assert_eq!(
            jobs[0].exit.as_ref().unwrap().message.as_deref(),
            Some(&*long)
        );
        detail = detail.refused(&jobs);
        detail.apply(&mut jobs);
        let cut = jobs[0].exit.as_ref().unwrap().message.clone().unwrap();
        assert!(
            cut.len() <= SHORT_MESSAGE && cut.starts_with("xxx"),
            "{cut}"
        );
        detail = detail.refused(&jobs);
        let mut again = vec![ended(1, &long), ended(3, "new")];
        detail.apply(&mut again);
        assert!(again
            .iter()
            .all(|j| j.exit.as_ref().unwrap().message.is_none()));
        // Job 1 forgotten by the controller: the next report is whole again.
        let mut later = vec![ended(3, "new")];
        detail.apply(&mut later);
        assert_eq!(detail, Detail::Full);
        assert_eq!(
            later[0].exit.as_ref().unwrap().message.as_deref(),
            Some("new")
        );
    }

    #[tokio::test]
    async fn pull_progress_wakes_a_report_at_most_once_per_interval() {
        let pulls = images::Pulls::default();
        let sent_at = tokio::time::Instant::now();
        let poll = |pulls: &images::Pulls| PollRequest {
            seq: None,
            node: "n1".into(),
            jobs: vec![],
            pulling: pulls.progress(),
            prepulls: pulls.prepulls().reports(),
            ..Default::default()
        };
        let sent = poll(&pulls);
        let reference: wharf_images::ImageRef = "127.0.0.1:5000/test/app:v1".parse().unwrap();
        pulls.began(1, &reference);
        // Changed at once, but the report waits out the interval since the last one.
        let wait = progress_to_report(&pulls, &sent, sent_at);
        tokio::pin!(wait);
        let early = tokio::time::timeout(PROGRESS_EVERY * 8 / 10, &mut wait).await;
        assert!(early.is_err(), "a report came before the interval was over");
        tokio::time::timeout(PROGRESS_EVERY, &mut wait)
            .await
            .expect("the changed progress was never reported");
        // Woken, but nothing differs from what was sent: no report.
        let sent = poll(&pulls);
        pulls.stepped(
            1,
            &wharf_images::PullEvent::Layer {
                index: 9,
                digest: "sha256:x".into(),
                size: 1,
                fetched: true,
            },
        );
        let same = tokio::time::timeout(
            PROGRESS_EVERY * 2,
            progress_to_report(&pulls, &sent, tokio::time::Instant::now()),
        )
        .await;
        assert!(same.is_err(), "a report was sent for unchanged progress");
    }

    #[test]
    fn exit_messages_are_bounded_when_carried() {
        let o = Outcome {
            error: Some("\u{1}".repeat(131_000)),
            ..Default::default()
        };
        let m = exit_info(&o).message.unwrap();
        assert!(m.len() <= wharf_api::text::MAX_MESSAGE, "{}", m.len());
    }

    fn task(local: u32, start: Option<u64>, exit: Option<(i32, bool)>, end: u64) -> TaskReport {
        TaskReport {
            local,
            start_time: start,
            exit: exit.map(|(code, cancelled)| ExitInfo {
                code: Some(code),
                cancelled,
                usage: Some(wharf_api::usage::JobUsage {
                    cpu_time_ms: Some(100),
                    memory_peak: Some(1000),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            end_time: exit.map(|_| end),
            stopping: false,
            time_limit: None,
        }
    }

    #[test]
    fn a_node_with_several_tasks_reports_the_job_once_all_have_started_and_ended() {
        // One task running, one not started yet: not started.
        let r = node_report(5, &[task(0, Some(10), None, 0), task(1, None, None, 0)]);
        assert_eq!((r.start_time, r.exit.is_none()), (None, true));
        // Both running: started at the first start; one done with 0: still running.
        let r = node_report(5, &[task(0, Some(10), None, 0), task(1, Some(8), None, 0)]);
        assert_eq!((r.start_time, r.exit.is_none()), (Some(8), true));
        let r = node_report(
            5,
            &[
                task(0, Some(10), Some((0, false)), 20),
                task(1, Some(8), None, 0),
            ],
        );
        assert!(r.exit.is_none());
        // All ended with 0: the first task's exit, usage of both together.
        let r = node_report(
            5,
            &[
                task(0, Some(10), Some((0, false)), 20),
                task(1, Some(8), Some((0, false)), 30),
            ],
        );
        let exit = r.exit.unwrap();
        assert_eq!(
            (exit.code, exit.task, r.end_time),
            (Some(0), Some(0), Some(30))
        );
        let usage = exit.usage.unwrap();
        assert_eq!(
            (usage.cpu_time_ms, usage.memory_peak),
            (Some(200), Some(2000))
        );
        // Task 1 failed first; task 0 was stopped for it: task 1 decides.
        let r = node_report(
            5,
            &[
                task(0, Some(10), Some((143, true)), 25),
                task(1, Some(8), Some((3, false)), 20),
            ],
        );
        let exit = r.exit.unwrap();
        assert_eq!((exit.code, exit.task), (Some(3), Some(1)));
        // The first task's directory is not there yet: still launching.
        let r = node_report(5, &[task(1, Some(8), Some((0, false)), 9)]);
        assert_eq!((r.start_time, r.exit), (None, None));
        // One task alone: as before, no task named.
        let r = node_report(5, &[task(0, Some(1), Some((2, false)), 9)]);
        assert_eq!(r.exit.unwrap().task, None);
    }

    #[test]
    fn a_task_that_fails_stops_its_siblings_on_the_node() {
        let running = task(0, Some(1), None, 0);
        let failed = task(1, Some(1), Some((1, false)), 5);
        let (local, why) = siblings_to_stop(&[running.clone(), failed.clone()], "n1").unwrap();
        assert_eq!(local, 1);
        assert!(why.contains("task 1 of the job on node n1 failed"), "{why}");
        // Nothing left to stop: all ended, or already being stopped.
        let mut stopping = running.clone();
        stopping.stopping = true;
        assert_eq!(siblings_to_stop(&[stopping, failed.clone()], "n1"), None);
        // A task that completed, or one stopped by a cancel, stops nothing.
        let done = task(1, Some(1), Some((0, false)), 5);
        let cancelled = task(1, Some(1), Some((143, true)), 5);
        assert_eq!(siblings_to_stop(&[running.clone(), done], "n1"), None);
        assert_eq!(siblings_to_stop(&[running, cancelled], "n1"), None);
        assert_eq!(siblings_to_stop(&[failed], "n1"), None);
    }
}
