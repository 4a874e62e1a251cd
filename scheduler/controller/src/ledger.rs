//! The accounting ledger: one row per ended run of a job (Slurm's job table in slurmdbd),
//! kept apart from the live job table so that `wharf acct` and `wharf report` read indexed
//! columns instead of scanning job records.
//!
//! A run ends when its job ends (COMPLETED, FAILED, ...) or when it is requeued (the run's row
//! says REQUEUED and the job goes on with one more restart). Rows are keyed by (job id, run):
//! recording a row twice leaves the first, so a replay after a crash or an outage can never
//! count a run twice.
//!
//! Two engines, one schema ([`schema`]), one conformance suite (`conformance`, run on both):
//! - [`sqlite::SqliteLedger`]: the default, a table in the controller's own database; the
//!   controller writes a job's rows in the same transaction as its final state
//!   ([`crate::store::Store::update_jobs_with_runs`]).
//! - [`postgres::PgLedger`]: for large sites; rows are written after the state store's
//!   commit, and spooled to a local file while the database is unreachable
//!   ([`spool`]), then replayed in order.
//!
//! ```no_run
//! use wharf_controller::ledger::{sqlite::SqliteLedger, Ledger, RunFilter};
//! # fn main() -> Result<(), wharf_controller::ledger::LedgerError> {
//! let ledger = SqliteLedger::open(std::path::Path::new("/var/lib/wharf/wharf.db"))?;
//! let alices_month = ledger.query(&RunFilter {
//!     uid: Some(1000),
//!     since: 1_700_000_000_000,
//!     until: 1_702_592_000_000,
//!     ..RunFilter::default()
//! })?;
//! let by_account = ledger.report(1_700_000_000_000, 1_702_592_000_000, None)?;
//! # let _ = (alices_month, by_account); Ok(()) }
//! ```

use serde::{Deserialize, Serialize};
use wharf_api::usage::JobUsage;
use wharf_api::wire::ErrorKind;
use wharf_api::{JobId, JobRecord};

#[cfg(test)]
pub(crate) mod conformance;
pub mod pg_server;
pub mod postgres;
pub mod schema;
pub mod spool;
pub mod sqlite;

/// Which engine keeps the ledger (`[accounting] store`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Engine {
    /// A table in the controller's own SQLite database (the default).
    #[default]
    Sqlite,
    /// A PostgreSQL database.
    Postgres(postgres::PgSettings),
}

impl Engine {
    /// Its name in the config file.
    pub fn name(&self) -> &'static str {
        match self {
            Engine::Sqlite => "sqlite",
            Engine::Postgres(_) => "postgres",
        }
    }

    /// A ledger of its own for housekeeping (retention), without a spool. `db` is the state
    /// database, where the SQLite ledger lives.
    pub fn open_plain(&self, db: &std::path::Path) -> Result<Box<dyn Ledger>, LedgerError> {
        Ok(match self {
            Engine::Sqlite => Box::new(sqlite::SqliteLedger::open(db)?),
            Engine::Postgres(s) => Box::new(postgres::PgLedger::open(s, None)?),
        })
    }
}

/// The state of a run that ended by a requeue: its job went back to the queue.
pub const REQUEUED: &str = "REQUEUED";

/// One ended run of a job, as the ledger keeps it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobRun {
    /// The job.
    pub job_id: JobId,
    /// Which run: the job's restart count when it ran (0 for the first).
    pub run: u32,
    /// The array job it is a task of, if any.
    pub array_job_id: Option<JobId>,
    /// Its task id in that array.
    pub array_task_id: Option<u32>,
    /// Owner's uid.
    pub uid: u32,
    /// Owner's name.
    pub user: String,
    /// Account charged.
    pub account: String,
    /// Partition it ran in.
    pub partition: String,
    /// QoS it ran under.
    pub qos: Option<String>,
    /// Node(s) it ran on, as a compressed host list (`gpu[01-04]`); empty if it never started.
    pub nodes: String,
    /// Nodes it held.
    pub node_count: u32,
    /// Submitted, ms since the epoch.
    pub submit_time: u64,
    /// Could first start (its begin time, or its submit time), ms.
    pub eligible_time: u64,
    /// Started, ms; `None` if it never did.
    pub start_time: Option<u64>,
    /// Ended (or left the queue), ms; never before `start_time`.
    pub end_time: u64,
    /// Slurm's name of how the run ended (`COMPLETED`, ..., or [`REQUEUED`]).
    pub state: String,
    /// Exit status, when it exited.
    pub exit_code: Option<i32>,
    /// Signal that ended it, if one did.
    pub exit_signal: Option<i32>,
    /// CPUs held, on all its nodes together.
    pub cpus: u32,
    /// Memory held, bytes, on all its nodes together.
    pub memory: u64,
    /// GPUs held, on all its nodes together.
    pub gpus: u32,
    /// GPU type asked for, if any.
    pub gpu_type: Option<String>,
    /// Billing units per second of the run (its partition's TRES weights when it ended).
    pub billing: f64,
    /// Image reference.
    pub image: Option<String>,
    /// Times the job had been requeued when this run ended.
    pub requeues: u32,
    /// What the run used, as its node measured it.
    pub usage: Option<JobUsage>,
    /// The job's whole record as the run left it (what `wharf acct` shows).
    pub record: JobRecord,
}

/// Which runs [`Ledger::query`] returns: every field that is set must match. Runs are in the
/// window when they were submitted by `until` and had not ended before `since`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunFilter {
    /// Only these jobs (empty: any): `(ID, None)` is job `ID`, or every task of the array
    /// whose job id is `ID`; `(ID, Some(TASK))` is task `TASK` of that array.
    pub jobs: Vec<(JobId, Option<u32>)>,
    /// Only this owner.
    pub uid: Option<u32>,
    /// Only these user names (empty: any).
    pub users: Vec<String>,
    /// Only these accounts (empty: any).
    pub accounts: Vec<String>,
    /// Only these partitions (empty: any).
    pub partitions: Vec<String>,
    /// Only these states, Slurm's names (empty: any).
    pub states: Vec<String>,
    /// Window start, ms.
    pub since: u64,
    /// Window end, ms.
    pub until: u64,
    /// Only the last run of each job (leave out REQUEUED runs), as `sacct` without
    /// `--duplicates`.
    pub last_runs_only: bool,
    /// Most rows returned.
    pub limit: u32,
}

impl Default for RunFilter {
    fn default() -> Self {
        RunFilter {
            jobs: Vec::new(),
            uid: None,
            users: Vec::new(),
            accounts: Vec::new(),
            partitions: Vec::new(),
            states: Vec::new(),
            since: 0,
            until: i64::MAX as u64,
            last_runs_only: false,
            limit: u32::MAX,
        }
    }
}

/// Usage of one (account, user, partition) over a report's window.
pub use wharf_api::report::Group as UsageGroup;

/// Adds `runs` to `groups`, each for its part inside `[since, until)`, as [`Ledger::report`]
/// counts the runs it holds (the same rule as its query, `schema::report_sql`); a group that
/// is not there yet is appended.
pub(crate) fn add_to_report(groups: &mut Vec<UsageGroup>, runs: &[JobRun], since: u64, until: u64) {
    for run in runs {
        let Some(ms) = run
            .start_time
            .and_then(|start| wharf_api::report::ms_inside(start, run.end_time, since, until))
        else {
            continue;
        };
        let found = groups.iter().position(|g| {
            g.account == run.account && g.user == run.user && g.partition == run.partition
        });
        let i = found.unwrap_or_else(|| {
            groups.push(UsageGroup {
                account: run.account.clone(),
                user: run.user.clone(),
                partition: run.partition.clone(),
                ..UsageGroup::default()
            });
            groups.len() - 1
        });
        let g = &mut groups[i];
        g.runs += 1;
        g.cpu_ms += u64::from(run.cpus) * ms;
        g.gpu_ms += u64::from(run.gpus) * ms;
        g.billing += run.billing * ms as f64 / 1000.0;
    }
}

/// A ledger failure, with the kind callers decide on (retry, fail, report).
#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    /// The database cannot be reached now; try again later.
    #[error("accounting database unreachable: {0}")]
    Unavailable(String),
    /// The database refused or broke.
    #[error("accounting database: {0}")]
    Database(String),
    /// A stored row does not parse (written by a newer version?).
    #[error("accounting: corrupt row: {0}")]
    Corrupt(#[from] serde_json::Error),
    /// The local spool could not be written or read.
    #[error("accounting spool {0}: {1}")]
    Spool(String, std::io::Error),
    /// The configuration or a request is wrong.
    #[error("accounting: {0}")]
    InvalidInput(String),
}

impl LedgerError {
    /// The kind, as the API reports it.
    pub fn kind(&self) -> ErrorKind {
        match self {
            LedgerError::Unavailable(_) => ErrorKind::Unavailable,
            LedgerError::InvalidInput(_) => ErrorKind::InvalidInput,
            _ => ErrorKind::Internal,
        }
    }
}

impl From<rusqlite::Error> for LedgerError {
    fn from(e: rusqlite::Error) -> Self {
        LedgerError::Database(e.to_string())
    }
}

/// A store of ended runs. Implementations: [`sqlite::SqliteLedger`], [`postgres::PgLedger`];
/// both pass the one conformance suite.
pub trait Ledger: Send + std::fmt::Debug {
    /// Stores `runs`, all or none, in one transaction. Idempotent: a run whose (job id, run)
    /// is stored already is left as it was, so a replayed batch adds only what is missing.
    /// Errors: `Unavailable` (nothing stored; the caller may retry the whole batch),
    /// `Database`.
    ///
    /// The PostgreSQL engine spools instead of failing when the database is unreachable
    /// (see [`postgres::PgLedger`]): `Ok` there means durable locally, in the database soon.
    fn record(&mut self, runs: &[JobRun]) -> Result<(), LedgerError>;

    /// Every stored run of job `id`, first run first; empty if none. Errors: `Unavailable`,
    /// `Database`, `Corrupt`.
    fn lookup(&self, id: JobId) -> Result<Vec<JobRun>, LedgerError>;

    /// The runs that `filter` selects, by job id then run, at most `filter.limit`. Errors:
    /// `Unavailable`, `Database`, `Corrupt`.
    fn query(&self, filter: &RunFilter) -> Result<Vec<JobRun>, LedgerError>;

    /// Usage over `[since, until)` by (account, user, partition), of one owner or of all:
    /// each run counts for the part of it inside the window (a run of no length at a time
    /// inside the window counts once, for nothing). Ordered by account, user, partition.
    /// Errors: `Unavailable`, `Database`.
    fn report(
        &self,
        since: u64,
        until: u64,
        uid: Option<u32>,
    ) -> Result<Vec<UsageGroup>, LedgerError>;

    /// Runs that ended before `cutoff` (ms), oldest end first, at most `limit`: what
    /// retention archives next. Errors: `Unavailable`, `Database`, `Corrupt`.
    fn ended_before(&self, cutoff: u64, limit: u32) -> Result<Vec<JobRun>, LedgerError>;

    /// The `limit` runs that ended last, latest end first (ties: higher job id, then run,
    /// first): what fair share replays at start. Errors: `Unavailable`, `Database`,
    /// `Corrupt`.
    fn last_ended(&self, limit: u32) -> Result<Vec<JobRun>, LedgerError>;

    /// Deletes these runs (by job id and run), in one transaction; returns how many were
    /// there. Idempotent: absent ones are skipped. Errors: `Unavailable`, `Database`.
    fn delete(&mut self, keys: &[(JobId, u32)]) -> Result<usize, LedgerError>;

    /// How many runs the database refused for good and that were set aside (PostgreSQL's
    /// `ledger.deadletter`); none for a ledger that sets none aside. Errors: `Spool`.
    fn dead_letters(&self) -> Result<usize, LedgerError> {
        Ok(0)
    }
}
