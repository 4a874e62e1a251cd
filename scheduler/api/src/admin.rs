//! Associations managed at run time (`wharf admin`, Slurm's `sacctmgr`): accounts, users'
//! associations, QoS and partitions as the controller keeps and shows them, the changes asked
//! of it, and the audit of every change.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// What a change is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AdminKind {
    /// An account in the fair-share tree.
    Account,
    /// A user's association with one account.
    User,
    /// A quality of service.
    Qos,
    /// A partition.
    Partition,
    /// A node drained or resumed (`wharf nodes --drain/--resume`): audited only, never an
    /// association to change through `wharf admin`.
    Node,
}

impl AdminKind {
    /// The word the CLI and the audit use.
    pub fn as_str(self) -> &'static str {
        match self {
            AdminKind::Account => "account",
            AdminKind::User => "user",
            AdminKind::Qos => "qos",
            AdminKind::Partition => "partition",
            AdminKind::Node => "node",
        }
    }
}

/// What a change does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AdminAction {
    /// Creates the object; refused when it exists.
    Add,
    /// Changes the given settings of an existing object.
    Modify,
    /// Removes the object; refused while something depends on it.
    Remove,
}

impl AdminAction {
    /// The word the CLI and the audit use.
    pub fn as_str(self) -> &'static str {
        match self {
            AdminAction::Add => "add",
            AdminAction::Modify => "modify",
            AdminAction::Remove => "rm",
        }
    }
}

/// `POST /v1/admin/change`: one change. Settings are `key = value` texts, parsed and checked
/// by the controller (docs/configuration.md lists the keys of each kind); `none` clears an
/// optional value, and in a TRES list (`gpu=16,cpu=64`) `KEY=none` clears that one TRES.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdminChange {
    /// Kind of object.
    pub kind: AdminKind,
    /// Add, modify or remove.
    pub action: AdminAction,
    /// The account, QoS or partition name, or the user name.
    pub name: String,
    /// The account of a user association (kind `user` only).
    #[serde(default)]
    pub account: Option<String>,
    /// New values.
    #[serde(default)]
    pub settings: BTreeMap<String, String>,
}

/// A cap per TRES; a missing key is no cap.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TresCaps {
    /// CPUs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<u64>,
    /// Memory, bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mem: Option<u64>,
    /// GPUs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<u64>,
}

/// A budget per TRES in TRES-minutes (GrpTRESMins); a missing key is no budget.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TresMinsCaps {
    /// CPU-minutes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<u64>,
    /// GPU-minutes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<u64>,
    /// Billing-minutes (billing units of the partition's weights, times minutes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub billing: Option<u64>,
}

impl TresMinsCaps {
    /// True when no TRES has a budget.
    pub fn is_empty(&self) -> bool {
        self.cpu.is_none() && self.gpu.is_none() && self.billing.is_none()
    }
}

/// Limits of an account or of a user's association (Slurm's association limits).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AssocCaps {
    /// GrpTRES: all running jobs together (an account: every job below it).
    #[serde(default)]
    pub grp_tres: TresCaps,
    /// GrpJobs: running jobs together.
    #[serde(default)]
    pub grp_jobs: Option<u64>,
    /// MaxJobs: running jobs of one user association.
    #[serde(default)]
    pub max_jobs: Option<u64>,
    /// MaxSubmitJobs: pending and running jobs of one user association.
    #[serde(default)]
    pub max_submit_jobs: Option<u64>,
    /// MaxTRESPerJob.
    #[serde(default)]
    pub max_tres_per_job: TresCaps,
    /// GrpTRESMins: TRES-minutes all its jobs together may use in a budget period.
    #[serde(default, skip_serializing_if = "TresMinsCaps::is_empty")]
    pub grp_tres_mins: TresMinsCaps,
    /// The QoS its users may name (Slurm's association `QOS`); `None`: the parent
    /// account's, and where none sets any, only the default QoS.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub qos: Option<Vec<String>>,
}

/// An account.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AccountDef {
    /// Name, unique.
    pub name: String,
    /// Parent account; `None`: under the root.
    #[serde(default)]
    pub parent: Option<String>,
    /// Shares against its siblings, at least 1.
    pub shares: u32,
    /// Limits.
    #[serde(default)]
    pub limits: AssocCaps,
    /// Users who may add and remove users of this account and its sub-accounts and change
    /// their limits.
    #[serde(default)]
    pub coordinators: Vec<String>,
}

/// A user's association with one account.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UserDef {
    /// User name.
    pub user: String,
    /// Account.
    pub account: String,
    /// Shares against the other users of the account, at least 1.
    pub shares: u32,
    /// The account of the user's jobs that name none; one per user.
    #[serde(default)]
    pub default: bool,
    /// Limits.
    #[serde(default)]
    pub limits: AssocCaps,
}

impl AccountDef {
    /// An account under the root with 1 share, no limits and no coordinators.
    pub fn new(name: &str) -> AccountDef {
        AccountDef {
            name: name.into(),
            parent: None,
            shares: 1,
            limits: AssocCaps::default(),
            coordinators: vec![],
        }
    }
}

/// A quality of service.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QosDef {
    /// Name, unique.
    pub name: String,
    /// Priority; normalised against the largest of all QoS.
    #[serde(default)]
    pub priority: u32,
    /// MaxTRESPerUser.
    #[serde(default)]
    pub max_tres_per_user: TresCaps,
    /// MaxJobsPerUser (running).
    #[serde(default)]
    pub max_jobs_per_user: Option<u64>,
    /// MaxSubmitJobsPerUser (pending and running).
    #[serde(default)]
    pub max_submit_jobs_per_user: Option<u64>,
    /// MaxWall, seconds.
    #[serde(default)]
    pub max_wall: Option<u64>,
    /// GrpTRES of the whole QoS.
    #[serde(default)]
    pub grp_tres: TresCaps,
    /// GrpJobs of the whole QoS.
    #[serde(default)]
    pub grp_jobs: Option<u64>,
    /// QoS whose jobs this one may preempt.
    #[serde(default)]
    pub preempt: Vec<String>,
    /// What becomes of this QoS's jobs when preempted: `requeue` (the default) or `cancel`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preempt_mode: Option<String>,
}

impl QosDef {
    /// A QoS of priority 0 with no limits.
    pub fn new(name: &str) -> QosDef {
        QosDef {
            name: name.into(),
            priority: 0,
            max_tres_per_user: TresCaps::default(),
            max_jobs_per_user: None,
            max_submit_jobs_per_user: None,
            max_wall: None,
            grp_tres: TresCaps::default(),
            grp_jobs: None,
            preempt: vec![],
            preempt_mode: None,
        }
    }
}

/// A partition.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PartitionDef {
    /// Name, unique.
    pub name: String,
    /// Its nodes; empty: every node.
    #[serde(default)]
    pub nodes: Vec<String>,
    /// `UP`, `DOWN`, `DRAIN` or `INACTIVE`.
    pub state: String,
    /// Jobs of higher tiers are scheduled first.
    #[serde(default)]
    pub priority_tier: u32,
    /// Longest time limit, seconds.
    #[serde(default)]
    pub max_time: Option<u64>,
    /// Time limit of jobs that give none, seconds.
    #[serde(default)]
    pub default_time: Option<u64>,
    /// Most nodes one job may use.
    #[serde(default)]
    pub max_nodes: Option<u32>,
    /// Memory per CPU, bytes, of jobs that ask for none (DefMemPerCPU).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub def_mem_per_cpu: Option<u64>,
    /// Memory per GPU, bytes, of jobs with GPUs that ask for none (DefMemPerGPU).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub def_mem_per_gpu: Option<u64>,
    /// Most memory per CPU, bytes (MaxMemPerCPU).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_mem_per_cpu: Option<u64>,
    /// Most memory per GPU, bytes (MaxMemPerGPU).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_mem_per_gpu: Option<u64>,
    /// Billing weight per CPU.
    pub billing_cpu: f64,
    /// Billing weight per GiB of memory.
    pub billing_memory_gib: f64,
    /// Billing weight per GPU.
    pub billing_gpu: f64,
    /// The partition of jobs that name none (one at most).
    #[serde(default)]
    pub default: bool,
    /// What becomes of its jobs when a higher tier needs their nodes: `off` (the default),
    /// `requeue` or `cancel`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preempt_mode: Option<String>,
    /// Accounts whose jobs may run here (AllowAccounts); empty: all.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow_accounts: Vec<String>,
    /// Unix groups whose members may run jobs here (AllowGroups); empty: everyone.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow_groups: Vec<String>,
}

impl PartitionDef {
    /// An up partition over every node, tier 0, no time limits, billing CPUs only.
    pub fn new(name: &str) -> PartitionDef {
        PartitionDef {
            name: name.into(),
            nodes: vec![],
            state: "UP".into(),
            priority_tier: 0,
            max_time: None,
            default_time: None,
            max_nodes: None,
            def_mem_per_cpu: None,
            def_mem_per_gpu: None,
            max_mem_per_cpu: None,
            max_mem_per_gpu: None,
            billing_cpu: 1.0,
            billing_memory_gib: 0.0,
            billing_gpu: 0.0,
            default: false,
            preempt_mode: None,
            allow_accounts: vec![],
            allow_groups: vec![],
        }
    }
}

/// Where an object's current definition comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    /// The config file; no `wharf admin` change has touched it.
    Config,
    /// A `wharf admin` change, kept in the controller's database (it wins over the file).
    Database,
}

impl Source {
    /// The word `wharf admin show` prints.
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Config => "config",
            Source::Database => "database",
        }
    }
}

/// An object and where it comes from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Sourced<T> {
    /// The definition.
    #[serde(flatten)]
    pub def: T,
    /// Its source.
    pub source: Source,
}

/// `GET /v1/admin/associations`: everything, in the order the scheduler sees it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Associations {
    /// Accounts.
    pub accounts: Vec<Sourced<AccountDef>>,
    /// Users' associations, each user's default first.
    pub users: Vec<Sourced<UserDef>>,
    /// QoS.
    pub qos: Vec<Sourced<QosDef>>,
    /// Partitions.
    pub partitions: Vec<Sourced<PartitionDef>>,
}

/// One audited change.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AuditEntry {
    /// Sequence number.
    pub id: u64,
    /// When, ms since the Unix epoch.
    pub time: u64,
    /// Who: uid.
    pub uid: u32,
    /// Who: user name.
    pub user: String,
    /// The change as a command line (`account modify lab grp_tres=gpu=16`).
    pub command: String,
    /// Kind of object.
    pub kind: AdminKind,
    /// The object (`USER@ACCOUNT` for a user association).
    pub name: String,
    /// The definition before (none for an add).
    pub old: Option<serde_json::Value>,
    /// The definition after (none for a removal).
    pub new: Option<serde_json::Value>,
}

/// `GET /v1/admin/audit`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct AuditList {
    /// Oldest first.
    pub entries: Vec<AuditEntry>,
}

/// `GET /v1/admin/ledger`: the accounting ledger's state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LedgerStatus {
    /// The engine (`sqlite` or `postgres`).
    pub engine: String,
    /// Runs the database refused for good (a constraint or encoding error), set aside in
    /// `<state_dir>/ledger.deadletter` with the error instead of holding up the runs behind
    /// them; always 0 for SQLite.
    pub dead_letters: u64,
}
