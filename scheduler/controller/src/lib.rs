//! `wharf controller`: the API server, the scheduling loop and the durable store.
//!
//! One [`cluster::Cluster`] holds the state under a mutex; handlers run its methods on the
//! blocking pool because each change commits to SQLite before the client is answered
//! (submits go through one writer that commits them in groups, [`submits`]). A scheduling
//! pass runs whenever something changes (and every second), spaced by the length of the last
//! one, and wakes the long-polling agents that got work: the submit writer runs it itself
//! with a group when no spacing is owed (no thread is woken between a submit and its start,
//! and one sync makes both durable), else the scheduler task runs it once the spacing is
//! over.

pub mod admin;
pub mod api;
pub mod cluster;
pub mod groups;
pub mod kept;
pub mod ledger;
pub mod node_keys;
pub mod private;
pub mod registry_auth;
pub mod retention;
pub mod serve;
pub mod step_input;
pub mod step_output;
pub mod store;
pub mod submits;
pub mod tls;
pub mod user_names;
pub mod visibility;
pub mod watch;

/// QoS and association limits (`[[scheduler.qos]]`, `[[scheduler.account]]`, `[[scheduler.user]]`).
pub use wharf_core::limits as sched_limits;
pub use wharf_core::{
    Account as SchedulerAccount, Assoc as SchedulerAssoc, Billing as SchedulerBilling,
    Config as SchedulerConfig, Partition as SchedulerPartition, PartitionState,
    Policy as SchedulerPolicy, PreemptMode, Qos as SchedulerQos, UserShares as SchedulerUserShares,
};

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use wharf_api::JobDefaults;

/// Controller settings.
#[derive(Debug, Clone)]
pub struct ControllerConfig {
    /// Directory for the database.
    pub state_dir: PathBuf,
    /// Unix socket for users (and local agents).
    pub socket: PathBuf,
    /// TCP address for agents on other hosts.
    pub listen: Option<SocketAddr>,
    /// Token agents must present.
    pub join_token: String,
    /// Users (besides root) who may manage every job.
    pub admins: Vec<u32>,
    /// Job defaults and ceilings.
    pub defaults: JobDefaults,
    /// A node silent this long is down and its jobs fail.
    pub node_timeout: Duration,
    /// Longest an agent poll is held open.
    pub poll_wait: Duration,
    /// Most jobs one user may have pending.
    pub max_pending_per_user: u32,
    /// Largest request body accepted from a user, bytes.
    pub max_request_bytes: usize,
    /// Largest request body accepted from an agent (with the join token), bytes.
    pub max_agent_request_bytes: usize,
    /// Connection caps and timeouts (each listener has its own).
    pub connections: serve::ConnectionLimits,
    /// How the TCP listener admits connections before they show the join token.
    pub tcp: serve::TcpLimits,
    /// The scheduling policy and its weights.
    pub scheduler: SchedulerConfig,
    /// How job forms behave.
    pub forms: FormsConfig,
    /// How long ended jobs' records stay in the database; `None`: forever.
    pub retention: Option<retention::Retention>,
    /// Where the accounting ledger is kept.
    pub accounting: ledger::Engine,
}

/// How often the PostgreSQL ledger's spool is retried while the database is away.
const SPOOL_RETRY: Duration = Duration::from_secs(5);

/// How job forms (dependencies, arrays) behave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FormsConfig {
    /// Cancel a job whose dependency can never be met (`[scheduler] kill_invalid_dependency`,
    /// Slurm's kill_invalid_depend); otherwise it stays pending with reason
    /// DependencyNeverSatisfied.
    pub kill_invalid_dependency: bool,
    /// Task ids of an array must be below this (`[limits] max_array_size`, Slurm's
    /// MaxArraySize), which also bounds the tasks of one submit.
    pub max_array_size: u32,
}

impl Default for FormsConfig {
    fn default() -> Self {
        FormsConfig {
            kill_invalid_dependency: true,
            max_array_size: 10_001,
        }
    }
}

/// State shared by the handlers and the scheduler task.
#[derive(Debug)]
pub struct Shared {
    /// Settings.
    pub config: ControllerConfig,
    /// Jobs and nodes.
    pub cluster: Mutex<cluster::Cluster>,
    /// Submits waiting to be committed as a group.
    pub submits: submits::Submits,
    scheduler: Notify,
    /// No scheduling pass starts before this (see [`PASS_SPACING`]).
    next_pass: Mutex<std::time::Instant>,
    /// Callers' names by uid.
    pub user_names: user_names::UserNames,
    nodes: Mutex<BTreeMap<String, Arc<Notify>>>,
    /// Steps' output on its way to their callers (apart from the cluster's lock: it is
    /// bytes in flight, not state).
    pub step_output: Mutex<step_output::Relay>,
    /// Steps' input on its way from their callers to their tasks (bytes in flight too).
    pub step_input: Mutex<step_input::InputRelay>,
    /// The join token and each node's key (see [`node_keys`]).
    pub node_keys: Arc<node_keys::NodeKeys>,
    /// Woken when a node reports step tasks ended: step starts waiting for GPUs that the
    /// job's other steps hold look again.
    pub steps_ended: Notify,
}

impl Shared {
    /// Asks for a scheduling pass.
    pub fn wake_scheduler(&self) {
        self.scheduler.notify_one();
    }

    /// Wakes a node's pending poll.
    pub fn wake_node(&self, node: &str) {
        self.node_notify(node).notify_waiters();
    }

    /// Whether a scheduling pass may start now: the spacing after the last one is over.
    fn pass_due(&self) -> bool {
        std::time::Instant::now() >= *self.next_pass.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether the submit writer runs the pass with its group, over `cluster`, which it
    /// holds: one is due, and the last one was short (see [`INLINE_PASS_MAX`]).
    fn pass_with_submits(&self, cluster: &cluster::Cluster) -> bool {
        self.pass_due() && cluster.deciding() <= INLINE_PASS_MAX
    }

    /// Runs one scheduling pass on the calling thread (it takes the cluster's lock and
    /// commits the starts): nodes that got work are woken, and the next pass is spaced by
    /// this one's length.
    fn scheduling_pass(&self) {
        let woken = {
            let mut cluster = self.cluster.lock().unwrap_or_else(|p| p.into_inner());
            self.pass_on(&mut cluster)
        };
        woken.iter().for_each(|n| self.wake_node(n));
    }

    /// One scheduling pass over `cluster`, which the caller holds: returns the nodes that got
    /// work (to be woken once the starts are durable), and spaces the next pass by this
    /// one's length.
    fn pass_on(&self, cluster: &mut cluster::Cluster) -> std::collections::BTreeSet<String> {
        let started = std::time::Instant::now();
        let now = now_ms();
        let result = cluster.check_nodes(now).and_then(|mut woken| {
            woken.extend(cluster.schedule(now)?);
            Ok(woken)
        });
        *self.next_pass.lock().unwrap_or_else(|p| p.into_inner()) =
            std::time::Instant::now() + started.elapsed() * PASS_SPACING;
        result.unwrap_or_else(|e| {
            tracing::error!(error = %e.message, "scheduling pass failed");
            Default::default()
        })
    }

    fn node_notify(&self, node: &str) -> Arc<Notify> {
        let mut map = self.nodes.lock().unwrap_or_else(|p| p.into_inner());
        map.entry(node.to_string()).or_default().clone()
    }
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// A controller failed to start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The store could not be opened.
    #[error(transparent)]
    Store(#[from] store::StoreError),
    /// The accounting ledger could not be opened or filled.
    #[error(transparent)]
    Ledger(#[from] ledger::LedgerError),
    /// A socket could not be bound.
    #[error("{what}: {err}")]
    Io {
        /// What was being done.
        what: String,
        /// Why it failed.
        err: std::io::Error,
    },
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> StartError {
    let what = what.into();
    move |err| StartError::Io { what, err }
}

/// Opens the store, binds the listeners and serves until the task is dropped.
pub async fn run(config: ControllerConfig) -> Result<(), StartError> {
    // The database holds every job's command and environment: only root may reach it.
    if config.socket.starts_with(&config.state_dir) {
        return Err(StartError::Io {
            what: format!(
                "controller.socket {} lies inside controller.state_dir {}, which only root may \
                 enter; put the socket elsewhere (default /run/wharf/wharf.sock)",
                config.socket.display(),
                config.state_dir.display()
            ),
            err: std::io::ErrorKind::InvalidInput.into(),
        });
    }
    private::dir(&config.state_dir, 0o700)
        .map_err(io(format!("securing {}", config.state_dir.display())))?;
    let store = store::Store::open(&config.state_dir.join("wharf.db"))?;
    let node_keys = Arc::new(node_keys::NodeKeys::new(
        &config.join_token,
        store.node_keys()?,
    ));
    let ledger: Option<(Box<dyn ledger::Ledger>, &str)> = match &config.accounting {
        ledger::Engine::Sqlite => None,
        ledger::Engine::Postgres(pg) => {
            // Unreachable now is no reason not to start: what it cannot take is spooled.
            let spool = config.state_dir.join("ledger.spool");
            let l = ledger::postgres::PgLedger::open(pg, Some((spool, SPOOL_RETRY)))?;
            if let Err(e) = l.ping() {
                tracing::warn!(error = %e, "accounting database not answering; records are spooled until it does");
            }
            Some((Box::new(l), "postgres"))
        }
    };
    // The scheduler's config and the ledger come with the load: fair share is replayed once.
    let cluster = cluster::Cluster::load_with_ledger(
        store,
        config.defaults.clone(),
        config.node_timeout.as_millis() as u64,
        now_ms(),
        config.scheduler.clone(),
        ledger,
    )?
    .with_max_pending_per_user(config.max_pending_per_user)
    .with_forms(config.forms.clone());
    let (submits, queue) = submits::queue();
    let shared = Arc::new(Shared {
        config: config.clone(),
        cluster: Mutex::new(cluster),
        submits,
        scheduler: Notify::new(),
        next_pass: Mutex::new(std::time::Instant::now()),
        user_names: Default::default(),
        step_output: Default::default(),
        step_input: Default::default(),
        nodes: Mutex::default(),
        node_keys: node_keys.clone(),
        steps_ended: Notify::new(),
    });
    submits::start(&shared, queue).map_err(io("starting the submit writer"))?;

    // The TCP port's certificates are there before anything listens: whoever sees the
    // socket (an agent started beside it, a test) finds ca.pem too.
    let tls = match config.listen {
        Some(_) => Some(tls::server_config(&config.state_dir).map_err(io(format!(
            "setting up TLS for the TCP port in {}",
            config.state_dir.display()
        )))?),
        None => None,
    };
    if let Some(parent) = config.socket.parent() {
        // Users must reach the socket whatever the umask: a directory made here is 0755.
        private::public_dir(parent).map_err(io(format!("creating {}", parent.display())))?;
    }
    let _ = std::fs::remove_file(&config.socket);
    let unix = tokio::net::UnixListener::bind(&config.socket)
        .map_err(io(format!("binding {}", config.socket.display())))?;
    // Every local user may connect; who they are is read from the socket itself.
    std::fs::set_permissions(&config.socket, std::fs::Permissions::from_mode(0o666))
        .map_err(io(format!("chmod {}", config.socket.display())))?;
    let app = api::router(shared.clone());
    // Each listener has its own caps and counts, so that a flood on one cannot starve the
    // other: on the socket a peer is a uid; on TCP a connection counts as unauthenticated
    // until it shows the join token, then as an agent's (see serve::TcpLimits). With both
    // listening, each gets half of the descriptors.
    let nofile = serve::raise_nofile_limit();
    let share = if config.listen.is_some() {
        nofile / 2
    } else {
        nofile
    };
    let limits = config.connections.clone().within_descriptors(share);
    let unix_server = serve::serve(unix, app.clone(), limits.clone(), serve::Counts::new());
    let tcp_server = match (config.listen, tls) {
        (Some(addr), Some(tls)) => {
            let l = tokio::net::TcpListener::bind(addr)
                .await
                .map_err(io(format!("binding {addr}")))?;
            let mut agents = limits.clone();
            agents.max_connections = agents
                .max_connections
                .saturating_sub(config.tcp.max_unauthenticated)
                .max(16);
            let gate = serve::Gate::new(node_keys.clone(), config.tcp.clone(), agents);
            Some(serve::serve_tcp(l, app, limits.clone(), gate, tls))
        }
        _ => None,
    };
    tracing::info!(
        socket = %config.socket.display(),
        listen = ?config.listen,
        nofile,
        max_connections = limits.max_connections,
        max_connections_per_user = limits.max_per_peer,
        max_unauthenticated_connections = config.tcp.max_unauthenticated,
        "controller ready"
    );
    tokio::spawn(scheduler_loop(shared.clone()));
    if let Some(r) = config.retention.clone() {
        // Its own connection: moving records out never holds the cluster (the records are
        // of ended jobs, which the cluster does not keep).
        let db = config.state_dir.join("wharf.db");
        let store = store::Store::open(&db)?;
        let ledger = config.accounting.open_plain(&db)?;
        tokio::spawn(retention_loop(store, ledger, r));
    }
    let tcp = async move {
        match tcp_server {
            Some(s) => s.await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        r = unix_server => r.map_err(io("serving the Unix socket")),
        r = tcp => r.map_err(io("serving TCP")),
    }
}

/// Moves old records out at start and every hour after (housekeeping, not on any job's path),
/// through its own connection to the store.
async fn retention_loop(
    mut store: store::Store,
    mut ledger: Box<dyn ledger::Ledger>,
    r: retention::Retention,
) {
    loop {
        let r2 = r.clone();
        let result = tokio::task::spawn_blocking(move || {
            let moved = retention::purge(&mut store, ledger.as_mut(), &r2, now_ms());
            (store, ledger, moved)
        })
        .await;
        match result {
            Ok((s, l, moved)) => {
                store = s;
                ledger = l;
                match moved {
                    Ok(0) => {}
                    Ok(n) => {
                        tracing::info!(records = n, "old job records moved out of the database")
                    }
                    Err(e) => tracing::error!(error = %e, "moving old job records out failed"),
                }
            }
            Err(e) => {
                tracing::error!(error = %e, "moving old job records out panicked; no more are moved");
                return;
            }
        }
        tokio::time::sleep(Duration::from_secs(3600)).await;
    }
}

/// After a pass, the next waits this many times the pass's length.
///
/// A pass holds the cluster and costs time in proportion to the queue, while wake-ups (every
/// committed group of submits is one) come as fast as clients send. Spacing passes by their
/// own length keeps them to a fifth of the controller's time at any depth, so the submit rate
/// stays flat as the queue grows; with a short queue a pass takes microseconds and the next
/// follows its wake-up at once. Wake-ups during the wait are kept, and make one pass.
const PASS_SPACING: u32 = 4;

/// The longest the last pass may have taken to decide (its commit not counted) for the
/// submit writer to run the next one with its group (see `submits`).
///
/// Run with the group, a pass saves a sync and a wake-up of another thread: worth it while
/// the pass is short, as it is with a short queue, where it makes a job submitted to an idle
/// cluster start at once. With a long queue the pass takes tens of milliseconds, and every
/// client of the group would wait for it before hearing its submit was stored, with nothing
/// else done meanwhile; the writer then answers them first and leaves the pass to the
/// scheduler task, so that their next requests are read while it runs. The commit is left
/// out because a sync's length is the disk's, not the queue's: a pass that started a job on
/// a busy disk must not keep the next submit from starting the same way.
const INLINE_PASS_MAX: Duration = Duration::from_millis(5);

/// Runs the passes the submit writer leaves (it runs one itself when none is owed and the
/// last was short): those woken by other changes (an end, a cancel, a node), by submits
/// during the spacing or after a long pass, and every second (silent nodes are found by the
/// pass).
async fn scheduler_loop(shared: Arc<Shared>) {
    loop {
        let _ = tokio::time::timeout(Duration::from_secs(1), shared.scheduler.notified()).await;
        let next = *shared.next_pass.lock().unwrap_or_else(|p| p.into_inner());
        tokio::time::sleep_until(next.into()).await;
        let s = shared.clone();
        if let Err(e) = tokio::task::spawn_blocking(move || s.scheduling_pass()).await {
            tracing::error!(error = %e, "scheduling pass panicked");
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::cluster::{Caller, Cluster};
    use wharf_api::wire::SubmitRequest;
    use wharf_api::{JobId, JobRequest, JobState, NodeInfo, Owner};

    fn caller() -> Caller {
        Caller {
            owner: Owner {
                uid: 1000,
                gid: 1000,
                user: "ann".into(),
            },
            admin: false,
        }
    }

    /// A cluster with node n1 of 8 CPUs.
    fn cluster(dir: &tempfile::TempDir) -> Cluster {
        let store = store::Store::open(&dir.path().join("wharf.db")).unwrap();
        let mut c = Cluster::load(store, JobDefaults::default(), 60_000, now_ms()).unwrap();
        c.register(
            NodeInfo::new("n1", "127.0.0.1", 8, 16 << 30, vec![]),
            now_ms(),
        )
        .unwrap();
        c
    }

    /// A controller's settings, its state in `dir`, its join token `token`.
    pub(crate) fn config(dir: &std::path::Path) -> ControllerConfig {
        ControllerConfig {
            state_dir: dir.to_path_buf(),
            socket: dir.join("wharf.sock"),
            listen: None,
            join_token: "token".into(),
            admins: vec![],
            defaults: JobDefaults::default(),
            node_timeout: Duration::from_secs(60),
            poll_wait: Duration::from_secs(30),
            max_pending_per_user: 1_000,
            max_request_bytes: 1 << 20,
            max_agent_request_bytes: 1 << 20,
            connections: serve::ConnectionLimits::default(),
            tcp: serve::TcpLimits::default(),
            scheduler: SchedulerConfig::default(),
            forms: FormsConfig::default(),
            retention: None,
            accounting: ledger::Engine::Sqlite,
        }
    }

    /// A controller's state over `cluster` with the settings of [`config`] in `dir`, and
    /// the queue its submit writer would read (not started).
    pub(crate) fn shared(
        dir: &std::path::Path,
        cluster: crate::cluster::Cluster,
    ) -> (Arc<Shared>, submits::Queue) {
        let (submits, queue) = submits::queue();
        let shared = Arc::new(Shared {
            config: config(dir),
            cluster: Mutex::new(cluster),
            submits,
            scheduler: Notify::new(),
            next_pass: Mutex::new(std::time::Instant::now()),
            user_names: Default::default(),
            step_output: Default::default(),
            step_input: Default::default(),
            nodes: Mutex::default(),
            node_keys: Arc::new(node_keys::NodeKeys::new("token", vec![])),
            steps_ended: Notify::new(),
        });
        (shared, queue)
    }

    /// A controller's state over a one-node cluster, its submit writer running and no
    /// scheduler task: only the writer can start a job.
    fn controller(dir: &tempfile::TempDir) -> Arc<Shared> {
        let (shared, queue) = shared(dir.path(), cluster(dir));
        submits::start(&shared, queue).unwrap();
        shared
    }

    async fn submit(shared: &Shared) -> JobId {
        let req = SubmitRequest {
            job: JobRequest {
                command: Some(vec!["/bin/true".into()]),
                image: Some("host".into()),
                ..Default::default()
            },
            cwd: "/tmp".into(),
            client_token: None,
            registry_auth: None,
        };
        shared.submits.submit(caller(), req).await.unwrap()
    }

    fn state(shared: &Shared, id: JobId) -> JobState {
        let cluster = shared.cluster.lock().unwrap();
        cluster.job(&caller(), id).unwrap().state
    }

    #[tokio::test]
    async fn a_submit_to_an_idle_cluster_is_started_by_the_writer_and_both_commits_are_durable() {
        let dir = tempfile::tempdir().unwrap();
        let shared = controller(&dir);
        let node = shared.node_notify("n1");
        let woken = node.notified();
        tokio::pin!(woken);
        woken.as_mut().enable();
        let id = submit(&shared).await;
        tokio::time::timeout(Duration::from_secs(5), woken)
            .await
            .expect("the node was woken with the job's launch order");
        assert_eq!(state(&shared, id), JobState::Starting);
        // A controller started again from the database knows the job as starting, on n1.
        let store = store::Store::open(&dir.path().join("wharf.db")).unwrap();
        let job = store.job(id).unwrap().expect("stored");
        assert_eq!(job.state, JobState::Starting);
        assert_eq!(job.nodelist(), "n1");
    }

    /// Submits a job and checks the writer left its pass to the scheduler task: the task is
    /// woken, the job pending; then the task's pass (the spacing over) starts it.
    async fn submit_left_to_the_task(shared: &Arc<Shared>) {
        let id = submit(shared).await;
        // Its wake-up is kept until the task waits.
        tokio::time::timeout(Duration::from_secs(5), shared.scheduler.notified())
            .await
            .expect("the scheduler task was woken");
        assert_eq!(state(shared, id), JobState::Pending);
        *shared.next_pass.lock().unwrap() = std::time::Instant::now();
        let s = shared.clone();
        tokio::task::spawn_blocking(move || s.scheduling_pass())
            .await
            .unwrap();
        assert_eq!(state(shared, id), JobState::Starting);
    }

    #[tokio::test]
    async fn after_a_long_pass_the_writer_answers_first_and_leaves_the_next_to_the_task() {
        let dir = tempfile::tempdir().unwrap();
        let shared = controller(&dir);
        // Due, but the last one took longer to decide than the writer runs with a group.
        shared
            .cluster
            .lock()
            .unwrap()
            .set_deciding(INLINE_PASS_MAX * 2);
        submit_left_to_the_task(&shared).await;
    }

    #[tokio::test]
    async fn a_submit_while_a_pass_is_owed_leaves_it_to_the_scheduler_task() {
        let dir = tempfile::tempdir().unwrap();
        let shared = controller(&dir);
        *shared.next_pass.lock().unwrap() = std::time::Instant::now() + Duration::from_secs(3_600);
        submit_left_to_the_task(&shared).await;
    }
}
