//! `wharf admin`: accounts, users' associations, QoS and partitions changed at run time
//! (Slurm's `sacctmgr`), and the audit of every change. Values are sent as written; the
//! controller checks them, so `none` clears a value and errors name the setting.

mod show;

use std::collections::BTreeMap;

use anyhow::Result;
use clap::Subcommand;
use wharf_api::admin::{AdminAction, AdminChange, AdminKind, AuditEntry};
use wharf_client::{Client, ClientError, Endpoint};

/// `wharf admin` subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Accounts: the fair-share tree, shares, limits and coordinators.
    #[command(subcommand)]
    Account(AccountCmd),
    /// Users' associations with accounts (a user may be in several; one is their default).
    #[command(subcommand)]
    User(UserCmd),
    /// Qualities of service: priority and limits.
    #[command(subcommand)]
    Qos(QosCmd),
    /// Partitions: state, tier, time limits and nodes.
    #[command(subcommand)]
    Partition(PartitionCmd),
    /// List the audited changes (admins only).
    Audit(show::AuditArgs),
    /// The accounting ledger: its engine and the runs its database refused for good.
    Ledger {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

/// Association limits (`none` clears one).
#[derive(Debug, Clone, clap::Args)]
pub struct Limits {
    /// GrpTRES: all running jobs together, e.g. gpu=16,cpu=64,mem=256G (TRES=none clears one).
    #[arg(long, value_name = "TRES")]
    grp_tres: Option<String>,
    /// GrpJobs: running jobs together.
    #[arg(long, value_name = "N")]
    grp_jobs: Option<String>,
    /// MaxJobs: running jobs of one user association.
    #[arg(long, value_name = "N")]
    max_jobs: Option<String>,
    /// MaxSubmitJobs: pending and running jobs of one user association.
    #[arg(long, value_name = "N")]
    max_submit_jobs: Option<String>,
    /// MaxTRESPerJob, e.g. gpu=8.
    #[arg(long, value_name = "TRES")]
    max_tres_per_job: Option<String>,
    /// GrpTRESMins: a budget per period in TRES-minutes of all its jobs together, e.g.
    /// gpu=6000,billing=100000 (cpu, gpu, billing; TRES=none clears one).
    #[arg(long, value_name = "TRES=MINUTES")]
    grp_tres_mins: Option<String>,
    /// The QoS its users may name besides the default, e.g. normal,high (none: the parent
    /// account's; no list anywhere: the default QoS only). Admins only.
    #[arg(long, value_name = "QOS,...")]
    qos: Option<String>,
}

/// Any setting by its key (`--set billing_gpu=10`); docs/configuration.md lists them.
#[derive(Debug, Clone, clap::Args)]
pub struct Extra {
    /// Another setting, KEY=VALUE (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    set: Vec<String>,
}

/// Settings of an account.
#[derive(Debug, Clone, clap::Args)]
pub struct AccountSet {
    /// Parent account (none: under the root).
    #[arg(long)]
    parent: Option<String>,
    /// Shares against its siblings (at least 1).
    #[arg(long)]
    shares: Option<String>,
    /// Users who may manage this account's users (repeat or comma-separate; none clears).
    #[arg(long = "coordinator", value_name = "USER", num_args = 1..)]
    coordinators: Vec<String>,
    #[command(flatten)]
    limits: Limits,
    #[command(flatten)]
    extra: Extra,
}

/// `wharf admin account`.
#[derive(Debug, Subcommand)]
pub enum AccountCmd {
    /// Add an account.
    Add {
        /// Name.
        name: String,
        #[command(flatten)]
        set: AccountSet,
    },
    /// Change an account's settings.
    Modify {
        /// Name.
        name: String,
        #[command(flatten)]
        set: AccountSet,
    },
    /// Remove an account (refused while it has users, child accounts or active jobs).
    Rm {
        /// Name.
        name: String,
    },
    /// Show the account tree (or one account and what is below it).
    Show(show::ShowArgs),
}

/// Settings of a user association.
#[derive(Debug, Clone, clap::Args)]
pub struct UserSet {
    /// The account.
    #[arg(short = 'A', long)]
    account: String,
    /// Make this the user's default account.
    #[arg(long)]
    default: bool,
    /// Shares against the account's other users (at least 1).
    #[arg(long)]
    shares: Option<String>,
    #[command(flatten)]
    limits: Limits,
    #[command(flatten)]
    extra: Extra,
}

/// `wharf admin user`.
#[derive(Debug, Subcommand)]
pub enum UserCmd {
    /// Add a user to an account (their first account becomes their default).
    Add {
        /// User name.
        user: String,
        #[command(flatten)]
        set: UserSet,
    },
    /// Change a user's association with an account.
    Modify {
        /// User name.
        user: String,
        #[command(flatten)]
        set: UserSet,
    },
    /// Remove a user from an account (refused while they have active jobs in it).
    Rm {
        /// User name.
        user: String,
        /// The account.
        #[arg(short = 'A', long)]
        account: String,
    },
    /// Show users' associations.
    Show(show::ShowArgs),
}

/// Settings of a QoS.
#[derive(Debug, Clone, clap::Args)]
pub struct QosSet {
    /// Priority.
    #[arg(long)]
    priority: Option<String>,
    /// MaxTRESPerUser, e.g. gpu=4.
    #[arg(long, value_name = "TRES")]
    max_tres_per_user: Option<String>,
    /// MaxJobsPerUser (running).
    #[arg(long, value_name = "N")]
    max_jobs_per_user: Option<String>,
    /// MaxSubmitJobsPerUser (pending and running).
    #[arg(long, value_name = "N")]
    max_submit_jobs_per_user: Option<String>,
    /// MaxWall, e.g. 1d.
    #[arg(long, value_name = "TIME")]
    max_wall: Option<String>,
    /// GrpTRES of the whole QoS.
    #[arg(long, value_name = "TRES")]
    grp_tres: Option<String>,
    /// GrpJobs of the whole QoS.
    #[arg(long, value_name = "N")]
    grp_jobs: Option<String>,
    /// QoS whose jobs this one may preempt (comma-separated; none clears).
    #[arg(long, value_name = "QOS")]
    preempt: Option<String>,
    #[command(flatten)]
    extra: Extra,
}

/// `wharf admin qos`.
#[derive(Debug, Subcommand)]
pub enum QosCmd {
    /// Add a QoS.
    Add {
        /// Name.
        name: String,
        #[command(flatten)]
        set: QosSet,
    },
    /// Change a QoS.
    Modify {
        /// Name.
        name: String,
        #[command(flatten)]
        set: QosSet,
    },
    /// Remove a QoS (refused while jobs use it or another QoS preempts it).
    Rm {
        /// Name.
        name: String,
    },
    /// Show QoS.
    Show(show::ShowArgs),
}

/// Settings of a partition.
#[derive(Debug, Clone, clap::Args)]
pub struct PartitionSet {
    /// UP, DOWN (accepts, starts nothing), DRAIN (accepts nothing new) or INACTIVE.
    #[arg(long)]
    state: Option<String>,
    /// Its nodes, comma-separated (none: every node).
    #[arg(long)]
    nodes: Option<String>,
    /// Jobs of higher tiers are scheduled first.
    #[arg(long, value_name = "N")]
    priority_tier: Option<String>,
    /// Longest time limit, e.g. 3d.
    #[arg(long, value_name = "TIME")]
    max_time: Option<String>,
    /// Time limit of jobs that give none.
    #[arg(long, value_name = "TIME")]
    default_time: Option<String>,
    /// Most nodes one job may use.
    #[arg(long, value_name = "N")]
    max_nodes: Option<String>,
    /// Memory per CPU of jobs that ask for none, e.g. 4G (DefMemPerCPU).
    #[arg(long, value_name = "SIZE")]
    def_mem_per_cpu: Option<String>,
    /// Memory per GPU of jobs with GPUs that ask for no memory, e.g. 80G (DefMemPerGPU).
    #[arg(long, value_name = "SIZE")]
    def_mem_per_gpu: Option<String>,
    /// Most memory per CPU a job may have; more is refused at submit (MaxMemPerCPU).
    #[arg(long, value_name = "SIZE")]
    max_mem_per_cpu: Option<String>,
    /// Most memory per GPU a job with GPUs may have (MaxMemPerGPU).
    #[arg(long, value_name = "SIZE")]
    max_mem_per_gpu: Option<String>,
    /// Make this the partition of jobs that name none.
    #[arg(long)]
    default: bool,
    #[command(flatten)]
    extra: Extra,
}

/// `wharf admin partition`.
#[derive(Debug, Subcommand)]
pub enum PartitionCmd {
    /// Add a partition.
    Add {
        /// Name.
        name: String,
        #[command(flatten)]
        set: PartitionSet,
    },
    /// Change a partition (e.g. --state DRAIN).
    Modify {
        /// Name.
        name: String,
        #[command(flatten)]
        set: PartitionSet,
    },
    /// Remove a partition (refused while jobs are in it).
    Rm {
        /// Name.
        name: String,
    },
    /// Show partitions.
    Show(show::ShowArgs),
}

/// Collects `key = value` settings.
#[derive(Debug, Default)]
struct Settings(BTreeMap<String, String>);

impl Settings {
    fn opt(&mut self, key: &str, value: &Option<String>) -> &mut Self {
        if let Some(v) = value {
            self.0.insert(key.into(), v.clone());
        }
        self
    }

    fn flag(&mut self, key: &str, on: bool) -> &mut Self {
        if on {
            self.0.insert(key.into(), "true".into());
        }
        self
    }

    fn limits(&mut self, l: &Limits) -> &mut Self {
        self.opt("grp_tres", &l.grp_tres)
            .opt("grp_jobs", &l.grp_jobs)
            .opt("max_jobs", &l.max_jobs)
            .opt("max_submit_jobs", &l.max_submit_jobs)
            .opt("max_tres_per_job", &l.max_tres_per_job)
            .opt("grp_tres_mins", &l.grp_tres_mins)
            .opt("qos", &l.qos)
    }

    fn extra(&mut self, e: &Extra) -> Result<&mut Self> {
        for s in &e.set {
            let (k, v) = s
                .split_once('=')
                .ok_or_else(|| anyhow::anyhow!("--set {s:?}: write KEY=VALUE"))?;
            self.0.insert(k.trim().into(), v.trim().into());
        }
        Ok(self)
    }
}

fn account_settings(s: &AccountSet) -> Result<BTreeMap<String, String>> {
    let mut out = Settings::default();
    let coordinators = (!s.coordinators.is_empty()).then(|| s.coordinators.join(","));
    out.opt("parent", &s.parent)
        .opt("shares", &s.shares)
        .opt("coordinators", &coordinators)
        .limits(&s.limits)
        .extra(&s.extra)?;
    Ok(out.0)
}

fn user_settings(s: &UserSet) -> Result<BTreeMap<String, String>> {
    let mut out = Settings::default();
    out.flag("default", s.default)
        .opt("shares", &s.shares)
        .limits(&s.limits)
        .extra(&s.extra)?;
    Ok(out.0)
}

fn qos_settings(s: &QosSet) -> Result<BTreeMap<String, String>> {
    let mut out = Settings::default();
    out.opt("priority", &s.priority)
        .opt("max_tres_per_user", &s.max_tres_per_user)
        .opt("max_jobs_per_user", &s.max_jobs_per_user)
        .opt("max_submit_jobs_per_user", &s.max_submit_jobs_per_user)
        .opt("max_wall", &s.max_wall)
        .opt("grp_tres", &s.grp_tres)
        .opt("grp_jobs", &s.grp_jobs)
        .opt("preempt", &s.preempt)
        .extra(&s.extra)?;
    Ok(out.0)
}

fn partition_settings(s: &PartitionSet) -> Result<BTreeMap<String, String>> {
    let mut out = Settings::default();
    out.opt("state", &s.state)
        .opt("nodes", &s.nodes)
        .opt("priority_tier", &s.priority_tier)
        .opt("max_time", &s.max_time)
        .opt("default_time", &s.default_time)
        .opt("max_nodes", &s.max_nodes)
        .opt("def_mem_per_cpu", &s.def_mem_per_cpu)
        .opt("def_mem_per_gpu", &s.def_mem_per_gpu)
        .opt("max_mem_per_cpu", &s.max_mem_per_cpu)
        .opt("max_mem_per_gpu", &s.max_mem_per_gpu)
        .flag("default", s.default)
        .extra(&s.extra)?;
    Ok(out.0)
}

fn change(kind: AdminKind, action: AdminAction, name: String) -> AdminChange {
    AdminChange {
        kind,
        action,
        name,
        account: None,
        settings: BTreeMap::new(),
    }
}

/// Runs the command.
pub async fn run(socket: &str, cmd: Command) -> Result<i32> {
    use AdminAction::{Add, Modify, Remove};
    use AdminKind::{Account, Partition, Qos, User};
    let client = Client::new(Endpoint::parse(socket), None);
    let req = match cmd {
        Command::Audit(a) => return show::audit(&client, a).await,
        Command::Ledger { json } => return show::ledger(&client, json).await,
        Command::Account(AccountCmd::Show(a)) => return show::show(&client, Account, a).await,
        Command::User(UserCmd::Show(a)) => return show::show(&client, User, a).await,
        Command::Qos(QosCmd::Show(a)) => return show::show(&client, Qos, a).await,
        Command::Partition(PartitionCmd::Show(a)) => {
            return show::show(&client, Partition, a).await
        }
        Command::Account(AccountCmd::Add { name, set }) => AdminChange {
            settings: account_settings(&set)?,
            ..change(Account, Add, name)
        },
        Command::Account(AccountCmd::Modify { name, set }) => AdminChange {
            settings: account_settings(&set)?,
            ..change(Account, Modify, name)
        },
        Command::Account(AccountCmd::Rm { name }) => change(Account, Remove, name),
        Command::User(UserCmd::Add { user, set }) => AdminChange {
            settings: user_settings(&set)?,
            account: Some(set.account),
            ..change(User, Add, user)
        },
        Command::User(UserCmd::Modify { user, set }) => AdminChange {
            settings: user_settings(&set)?,
            account: Some(set.account),
            ..change(User, Modify, user)
        },
        Command::User(UserCmd::Rm { user, account }) => AdminChange {
            account: Some(account),
            ..change(User, Remove, user)
        },
        Command::Qos(QosCmd::Add { name, set }) => AdminChange {
            settings: qos_settings(&set)?,
            ..change(Qos, Add, name)
        },
        Command::Qos(QosCmd::Modify { name, set }) => AdminChange {
            settings: qos_settings(&set)?,
            ..change(Qos, Modify, name)
        },
        Command::Qos(QosCmd::Rm { name }) => change(Qos, Remove, name),
        Command::Partition(PartitionCmd::Add { name, set }) => AdminChange {
            settings: partition_settings(&set)?,
            ..change(Partition, Add, name)
        },
        Command::Partition(PartitionCmd::Modify { name, set }) => AdminChange {
            settings: partition_settings(&set)?,
            ..change(Partition, Modify, name)
        },
        Command::Partition(PartitionCmd::Rm { name }) => change(Partition, Remove, name),
    };
    match client.post::<_, AuditEntry>("/v1/admin/change", &req).await {
        Ok(entry) => {
            println!("{}", crate::output::clean(&entry.command));
            for line in show::diff(entry.old.as_ref(), entry.new.as_ref()) {
                println!("  {}", crate::output::clean(&line));
            }
            if req.kind == Partition && req.settings.contains_key("nodes") {
                warn_unregistered(&client, &entry).await;
            }
            Ok(0)
        }
        Err(ClientError::Api { error, .. }) => {
            eprintln!("error: {}", crate::output::clean(&error.error));
            Ok(1)
        }
        Err(e) => Err(e.into()),
    }
}

/// Warns on standard error when the partition `entry` made names nodes that have not
/// registered (yet): accepted, as nodes may join later (as in Slurm's configuration), but they
/// take no jobs until they do, and a misspelt name never will.
async fn warn_unregistered(client: &Client, entry: &AuditEntry) {
    let nodes: wharf_api::wire::NodeList = match client.get("/v1/nodes").await {
        Ok(n) => n,
        Err(e) => {
            eprintln!(
                "warning: could not check the partition's nodes against the registered ones: {e}"
            );
            return;
        }
    };
    let missing = unregistered(entry, &nodes);
    if !missing.is_empty() {
        eprintln!(
            "warning: partition {} names nodes that have not registered: {}; they take no \
             jobs until they join (check the names)",
            crate::output::clean(&entry.name),
            crate::output::clean(&missing.join(","))
        );
    }
}

/// The nodes the partition definition `entry` leaves names that are not among `nodes`.
fn unregistered(entry: &AuditEntry, nodes: &wharf_api::wire::NodeList) -> Vec<String> {
    let named = entry.new.as_ref().and_then(|d| d["nodes"].as_array());
    (named.into_iter().flatten())
        .filter_map(|n| n.as_str())
        .filter(|n| !nodes.nodes.iter().any(|r| r.info.name == *n))
        .map(str::to_string)
        .collect()
}
