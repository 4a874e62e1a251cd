//! Request and response bodies of the `/v1` HTTP API. `docs/api.md` lists the routes.

use serde::{Deserialize, Serialize};

use crate::job::{ExitInfo, JobId, JobRecord, JobRequest, JobSpec, Owner};
use crate::node::{NodeInfo, NodeRecord};

/// What kind of failure an error is, so clients can decide to retry, fix input, or give up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// The request is wrong; fix it.
    InvalidInput,
    /// No such job, node or image.
    NotFound,
    /// The caller may not do this.
    PermissionDenied,
    /// The request conflicts with the current state (e.g. cancel of a finished job).
    Conflict,
    /// Try again later.
    Unavailable,
    /// A bug or a broken store.
    Internal,
}

/// Body of every non-2xx response.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApiError {
    /// What went wrong and what to do next.
    pub error: String,
    /// Its kind.
    pub kind: ErrorKind,
}

/// `POST /v1/jobs`. Unknown fields are refused, as in the job itself.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SubmitRequest {
    /// The job's options.
    pub job: JobRequest,
    /// The directory the user submitted from.
    pub cwd: String,
    /// A random token chosen by the client; a retried submit with the same token returns the
    /// first job instead of creating another.
    #[serde(default)]
    pub client_token: Option<String>,
    /// The submitting user's credential for the registry the job's image names, read by the
    /// CLI from the user's own auth file. The controller keeps it apart from the job (never
    /// in a listing, `show`, the ledger or a log), hands it only to the job's nodes in their
    /// launch orders, and deletes it when the job ends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub registry_auth: Option<RegistryCredential>,
}

/// A user name and password (or token) for one registry. Its `Debug` never shows the
/// password, so a logged request or order does not leak it.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RegistryCredential {
    /// The registry it is for, as references name it (`host` or `host:port`).
    pub registry: String,
    /// User name.
    pub username: String,
    /// Password or access token.
    pub password: String,
}

impl std::fmt::Debug for RegistryCredential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegistryCredential")
            .field("registry", &self.registry)
            .field("username", &self.username)
            .finish_non_exhaustive()
    }
}

impl RegistryCredential {
    /// Longest registry name, user name or password accepted.
    pub const MAX_LEN: usize = 4096;

    /// Checks the sizes and characters of the fields (no control characters: they would go
    /// into an HTTP header).
    pub fn validate(&self) -> Result<(), String> {
        for (what, value) in [
            ("registry", &self.registry),
            ("username", &self.username),
            ("password", &self.password),
        ] {
            if value.len() > Self::MAX_LEN {
                return Err(format!(
                    "registry_auth.{what} is longer than {} bytes",
                    Self::MAX_LEN
                ));
            }
            if value.chars().any(char::is_control) {
                return Err(format!("registry_auth.{what} holds a control character"));
            }
        }
        if self.registry.is_empty() || self.username.contains(':') {
            return Err("registry_auth needs a registry, and a user name without ':'".to_string());
        }
        Ok(())
    }
}

/// Answer to a submit: the job is committed to the store.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SubmitResponse {
    /// The new job's id.
    pub id: JobId,
}

/// `POST /v1/jobs/{id}/update`: new values for a pending job (Slurm's `scontrol update`).
/// Unset fields stay as they are.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpdateRequest {
    /// Time limit, seconds (its owner may only lower it).
    #[serde(default)]
    pub time: Option<u64>,
    /// Nice (negative: admins only).
    #[serde(default)]
    pub nice: Option<i32>,
    /// Partition.
    #[serde(default)]
    pub partition: Option<String>,
    /// QoS.
    #[serde(default)]
    pub qos: Option<String>,
    /// Account charged.
    #[serde(default)]
    pub account: Option<String>,
    /// Not before this time (`now+1h` counts from the update).
    #[serde(default)]
    pub begin: Option<crate::forms::Begin>,
    /// A fixed priority (admins only); 0 returns the job to its computed priority. Left out
    /// when unset, so that a controller that predates it still takes every other update.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<u64>,
    /// Seconds added to (or, negative, taken from) the time limit the job has, as `scontrol
    /// update TimeLimit=+30` (`wharf update --time +30`); not with `time`. Left out when
    /// unset, as `priority`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_delta: Option<i64>,
    /// New job name (as `scontrol update JobName=`). Left out when unset, as `priority`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// New dependency in `--dependency`'s form (as `scontrol update Dependency=`); empty
    /// clears it. Left out when unset, as `priority`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dependency: Option<String>,
}

impl UpdateRequest {
    /// Whether it changes the time limit and nothing else: all that may change of a running
    /// job.
    pub fn only_time(&self) -> bool {
        // Every field named: one added later must be placed here, or it would pass as
        // "time only" and reach running jobs.
        let UpdateRequest {
            time,
            time_delta,
            nice,
            partition,
            qos,
            account,
            begin,
            priority,
            name,
            dependency,
        } = self;
        let other = nice.is_some()
            || partition.is_some()
            || qos.is_some()
            || account.is_some()
            || begin.is_some()
            || priority.is_some()
            || name.is_some()
            || dependency.is_some();
        !other && (time.is_some() || time_delta.is_some())
    }

    /// The time limit it gives a job whose limit is `current` seconds: `time`, or `current`
    /// moved by `time_delta`; `None` when it changes none; an error for both at once, or a
    /// limit a delta would take to zero or below.
    pub fn new_time(&self, current: u64) -> Result<Option<u64>, String> {
        match (self.time, self.time_delta) {
            (Some(_), Some(_)) => Err("give a time limit or a change of it (+/-), not both".into()),
            (t, None) => Ok(t),
            (None, Some(d)) => {
                let t = i128::from(current) + i128::from(d);
                if t <= 0 {
                    return Err(format!(
                        "the time limit of {} less {} leaves none",
                        crate::resources::format_duration(current),
                        crate::resources::format_duration(d.unsigned_abs())
                    ));
                }
                Ok(Some(u64::try_from(t).unwrap_or(u64::MAX)))
            }
        }
    }
}

/// `GET /v1/jobs`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobList {
    /// Jobs, oldest first.
    pub jobs: Vec<JobRecord>,
}

/// `GET /v1/nodes`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeList {
    /// Nodes by name.
    pub nodes: Vec<NodeRecord>,
}

/// `GET /v1/partitions`: each partition's settings, nodes and jobs (Slurm's `sinfo -s`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionList {
    /// In the order they are configured.
    pub partitions: Vec<PartitionSummary>,
}

/// One partition as `wharf nodes --partitions` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionSummary {
    /// Name.
    pub name: String,
    /// `UP`, `DOWN`, `DRAIN` or `INACTIVE`.
    pub state: String,
    /// Jobs that name no partition go here.
    pub default: bool,
    /// Its priority tier.
    pub tier: u32,
    /// Longest time limit a job may have here, seconds (none: no limit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_time_s: Option<u64>,
    /// Its nodes: all CPUs allocated, some, none, and the rest (down, drained and running
    /// nothing, or named here and never registered). A drained node still running jobs counts
    /// by its CPUs allocated, as sinfo counts a draining node.
    pub nodes: NodeCounts,
    /// CPUs allocated and in all, on its nodes that are up or drained.
    pub cpus: (u32, u32),
    /// GPUs allocated and in all, on its nodes that are up or drained.
    pub gpus: (u32, u32),
    /// Its jobs running or starting.
    pub running: u32,
    /// Its pending jobs.
    pub pending: u32,
    /// Its nodes by name, sorted: those it names, registered or not, or every registered node
    /// when it names none (`sinfo` groups them by state). `None` from a controller older than
    /// this field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_names: Option<Vec<String>>,
}

/// How many nodes of a partition are in each state, as `sinfo` counts them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct NodeCounts {
    /// Every CPU allocated.
    pub allocated: u32,
    /// Some CPUs allocated.
    pub mixed: u32,
    /// Nothing allocated.
    pub idle: u32,
    /// Down, drained and running nothing, or never registered.
    pub other: u32,
}

/// `POST /v1/nodes/{name}/state` (admins): drain a node with a reason, or resume it. Answered
/// with the node's record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeStateRequest {
    /// What to do.
    pub state: NodeStateChange,
    /// Why (a drain needs one; a resume takes none).
    #[serde(default)]
    pub reason: Option<String>,
}

/// A change of a node's state asked for by an admin.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NodeStateChange {
    /// Keep its running jobs, start no new ones.
    Drain,
    /// Take new jobs again.
    Resume,
}

/// `GET /v1/nodes/keys` (admins): every node that holds a key, by name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeKeyList {
    /// The nodes.
    pub keys: Vec<NodeKeyEntry>,
}

/// A node that holds a key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeKeyEntry {
    /// Its name.
    pub node: String,
    /// When it joined, ms since the epoch.
    pub joined: u64,
    /// When its agent first registered the node with this key, ms since the epoch; `None`:
    /// never (a name that joined and never registered is one to look at: its key may be in
    /// the hands of anyone who held the join token).
    pub registered: Option<u64>,
}

/// Answer to `POST /v1/nodes/{name}/forget-key` (admins): the node's key is forgotten, and
/// its agent must join again with the join token (a reinstalled node that lost its key; or,
/// with a new join token, one no longer trusted).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyForgotten {
    /// The node.
    pub node: String,
}

/// `GET /v1/whoami`: how the controller sees the caller.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WhoAmI {
    /// The caller.
    pub owner: Owner,
    /// Whether the caller is an administrator.
    pub admin: bool,
}

/// The name in the certificate of the controller's TCP port, which agents check it against
/// whatever address they dial: the certificate authority that signs it is the controller's
/// own and signs nothing else, so the name is a role, not a host.
pub const CONTROLLER_TLS_NAME: &str = "wharf-controller";

/// The reason of a [`KillOrder`] for a run the controller has moved on from (its node was
/// taken for lost and came back): another run of the job may own its output by then.
pub const NOT_ACTIVE_HERE: &str = "job is not active on this node";

/// What a node key starts with, so that it is never taken for a join token.
pub const NODE_KEY_PREFIX: &str = "wnk_";

/// Whether `key` has a node key's form: [`NODE_KEY_PREFIX`] and 64 lower-case hex digits (32
/// bytes, which the agent takes from the kernel's random source).
pub fn is_node_key(key: &str) -> bool {
    key.strip_prefix(NODE_KEY_PREFIX).is_some_and(|hex| {
        hex.len() == 64
            && hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

/// `POST /v1/agent/join`, with the cluster's join token: the key the node's agent made for
/// itself, which every other agent route takes instead of the token.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JoinRequest {
    /// The node's name (one that holds no key yet, or holds this one).
    pub node: String,
    /// `wnk_` and 32 random bytes as 64 lower-case hex digits; sent as
    /// `authorization: Bearer KEY` from now on.
    pub key: String,
}

impl std::fmt::Debug for JoinRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JoinRequest")
            .field("node", &self.node)
            .field("key", &"(hidden)")
            .finish()
    }
}

/// Answer to a join.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JoinResponse {
    /// The node that joined.
    pub node: String,
}

/// `POST /v1/agent/register`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegisterRequest {
    /// The node.
    pub node: NodeInfo,
}

/// Answer to a registration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegisterResponse {
    /// How long the controller may hold a poll open, ms.
    pub poll_wait_ms: u64,
}

/// What an agent knows about one job it holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentJob {
    /// Job id.
    pub id: JobId,
    /// When the job's first process started, ms since the epoch; `None` while its sandbox is
    /// being prepared (or when it never started).
    pub start_time: Option<u64>,
    /// Set once the job has ended.
    pub exit: Option<ExitInfo>,
    /// End time, ms since the epoch, once ended.
    pub end_time: Option<u64>,
    /// The agent has already passed a stop order to this job (it is in its grace period);
    /// the controller does not repeat the order.
    #[serde(default)]
    pub stopping: bool,
    /// The job's tasks here are prepared (image ready, preflight passed) and wait for the
    /// controller to release them: a gang's first phase (see [`LaunchOrder::hold`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub ready: bool,
    /// The time limit, seconds from its start, that its tasks here hold it to now (while it
    /// runs): the launch's, or one changed since ([`PollResponse::limits`]). Absent from an
    /// agent from before limits could change.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_limit: Option<u64>,
}

/// `POST /v1/agent/poll`: heartbeat, job report, and a request for orders.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PollRequest {
    /// Which report of the agent's this is: one older than a report already taken (the
    /// agent stopped waiting on it and sent a newer one) is not taken. Absent from an agent
    /// from before it was sent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seq: Option<PollSeq>,
    /// Node name.
    pub node: String,
    /// Every job the agent holds, running or ended but not yet forgotten.
    pub jobs: Vec<AgentJob>,
    /// Hold the answer up to this long when there are no orders, ms.
    pub wait_ms: u64,
    /// Images in the node's store.
    #[serde(default)]
    pub images: Vec<String>,
    /// The jobs whose image this node is pulling, and how far each pull has come (their
    /// `node` left empty). Left out when there are none; an older controller ignores it, and
    /// an older agent never sends it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pulling: Vec<crate::pull::PullProgress>,
    /// This node's parts of admins' pre-pulls (`wharf image pull --nodes`): those under way
    /// and those finished since the controller last ordered them. Left out when none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub prepulls: Vec<crate::prepull::NodePull>,
    /// The steps of its jobs that the node holds (`wharf step`), each once for all its
    /// tasks here.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub steps: Vec<crate::step::AgentStep>,
    /// For each job running here, the newest of its signals passed on (see
    /// [`crate::signal`]). Left out when the node runs none; an older agent never sends it,
    /// and gets no signal orders.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub signalled: Vec<crate::signal::Signalled>,
}

/// An agent's report's place: the agent's run (a number drawn when it starts) and the
/// report's count within that run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PollSeq {
    /// The agent's run.
    pub boot: u64,
    /// The report's count in that run, from 1.
    pub n: u64,
}

/// A job for the agent to start.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LaunchOrder {
    /// Job id.
    pub id: JobId,
    /// Who it runs as.
    pub owner: Owner,
    /// What to run.
    pub spec: JobSpec,
    /// CPU indices to pin to.
    pub cpu_ids: Vec<u32>,
    /// GPU indices to expose.
    pub gpu_ids: Vec<u32>,
    /// How often the job was requeued before this run: its output files are appended to
    /// instead of truncated when more than 0, and it sees the count in
    /// `WHARF_RESTART_COUNT` and `SLURM_RESTART_COUNT`.
    #[serde(default)]
    pub restarts: u32,
    /// Where its ranks find each other.
    #[serde(default)]
    pub rendezvous: Rendezvous,
    /// The job's user's credential for its image's registry, when they sent one with the
    /// submit: used by the node for this job's pull (and to prove access to an image it holds
    /// already), kept in memory only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub registry_auth: Option<RegistryCredential>,
    /// Prepare only: pull the image and run the preflight of every task here, then report
    /// the job `ready` and start nothing until the same order comes without `hold`. A gang's
    /// ranks start only once every node is ready; a one-node job is never held.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub hold: bool,
    /// The controller stops the job's other nodes when its command, run once on the first
    /// node, ends (`Stop::BatchEnded`): the node's first idle task may then wait there to be
    /// stopped. A controller from before that sends none, and idle tasks end at once.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub stops_holders: bool,
}

/// Where a job's ranks find each other: its nodes in rank order, which one an order is for,
/// and the port the first node listens on. The agent turns it into `MASTER_ADDR`,
/// `WORLD_SIZE`, `SLURM_JOB_NODELIST` and the rest.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rendezvous {
    /// The job's nodes; the node rank is the index.
    pub nodes: Vec<Peer>,
    /// The rank of the node this order is for.
    pub node_rank: u32,
    /// `MASTER_PORT`: free on every one of its nodes; `None` when the range ran out.
    pub port: Option<u16>,
    /// In a step's order only (`nodes` are then the step's): the step and the job it runs
    /// in, whose values `SLURM_JOB_NODELIST`, `SLURM_JOB_NUM_NODES` and
    /// `SLURM_RESTART_COUNT` keep inside the step, as in Slurm.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<StepPlace>,
}

/// A step's place in its job, for its tasks' environment.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepPlace {
    /// The step's id within its job.
    pub id: u32,
    /// The job's nodes, in rank order.
    pub job_nodes: Vec<String>,
    /// How many times the job has been requeued.
    pub job_restarts: u32,
}

/// One node of a job, as its peers reach it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Peer {
    /// Node name.
    pub name: String,
    /// Address on the node's fabric interface, else its name.
    pub address: String,
}

/// A job for the agent to stop.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KillOrder {
    /// Job id.
    pub id: JobId,
    /// Why, in words (recorded by the agent).
    pub reason: String,
}

/// Orders for an agent.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PollResponse {
    /// Jobs to start.
    pub launch: Vec<LaunchOrder>,
    /// Jobs to stop (SIGTERM, grace, SIGKILL).
    pub kill: Vec<KillOrder>,
    /// Ended jobs whose results are committed: the agent may delete its records of them.
    pub forget: Vec<JobId>,
    /// Images to pull into the node's store (admins' pre-pulls), repeated until the agent
    /// reports each finished; one it no longer finds here is over for it. Left out when none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pull: Vec<crate::prepull::PullOrder>,
    /// Steps of running jobs to start here.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub steps: Vec<crate::step::StepOrder>,
    /// Steps to stop here.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kill_steps: Vec<crate::step::StepKill>,
    /// Ended steps whose end here is committed: the agent may delete their directories.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub forget_steps: Vec<crate::step::StepKey>,
    /// Running jobs here whose time limit changed (an admin's `wharf update --time`): their
    /// tasks take it up, counted from the job's start. Repeated until the agent reports it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub limits: Vec<LimitOrder>,
    /// Signals to pass on to running jobs' processes here, repeated until the agent reports
    /// each passed on ([`PollRequest::signalled`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub signals: Vec<crate::signal::SignalOrder>,
}

/// A running job's new time limit ([`PollResponse::limits`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LimitOrder {
    /// Job id.
    pub id: JobId,
    /// Its time limit, seconds from its start.
    pub time_limit: u64,
}

/// `GET /v1/acct`: jobs, ended or not, that were in the system during a time window (as
/// Slurm's `sacct`). Lists are comma-separated.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AcctQuery {
    /// Only these jobs: `ID` (that job, or every task of the array whose job id it is) or
    /// `ARRAYID_TASKID` (one task of an array); then no time window applies unless one is
    /// given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jobs: Option<String>,
    /// Only these users (names); a user who is not an admin sees only their own jobs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub users: Option<String>,
    /// Every user's jobs (admins).
    #[serde(default)]
    pub all_users: bool,
    /// Only jobs charged to these accounts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accounts: Option<String>,
    /// Only jobs of these partitions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partitions: Option<String>,
    /// Only jobs in these states (Slurm's names: `COMPLETED,FAILED`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub states: Option<String>,
    /// Window start, ms since the epoch: jobs that had not ended by then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<u64>,
    /// Window end, ms: jobs submitted by then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until: Option<u64>,
    /// Every run of a requeued job, each as it ended, instead of its last only (sacct's
    /// `--duplicates`): the earlier runs come first.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub duplicates: bool,
}
