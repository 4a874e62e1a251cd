//! The ledger's schema and SQL, one definition for both engines: the migrations (each step
//! written once per dialect, applied in order and recorded in `ledger_version`), the columns
//! and the queries, built here so that SQLite and PostgreSQL answer the same question the
//! same way.
//!
//! Every column that a query filters or adds up is a column of its own, indexed where acct
//! and report look (by id and by array, and by owner, user, account, partition and state,
//! each with the end time); `data` holds the whole run as JSON, which is what a query returns.

use super::{JobRun, RunFilter};

/// The SQL dialect of an engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    /// SQLite: `?N` placeholders, scalar `min`/`max`.
    Sqlite,
    /// PostgreSQL: `$N` placeholders, `LEAST`/`GREATEST`, NUMERIC sums cast back.
    Postgres,
}

impl Dialect {
    fn ph(self, n: usize) -> String {
        match self {
            Dialect::Sqlite => format!("?{n}"),
            Dialect::Postgres => format!("${n}"),
        }
    }

    fn least(self) -> &'static str {
        match self {
            Dialect::Sqlite => "min",
            Dialect::Postgres => "LEAST",
        }
    }

    fn greatest(self) -> &'static str {
        match self {
            Dialect::Sqlite => "max",
            Dialect::Postgres => "GREATEST",
        }
    }
}

/// One schema step: the same change in each dialect.
#[derive(Debug)]
pub struct Migration {
    /// Its number; steps run in increasing order, each once.
    pub version: i64,
    /// The step for SQLite.
    pub sqlite: &'static str,
    /// The step for PostgreSQL.
    pub postgres: &'static str,
}

/// Creates the table that records which steps ran.
pub const VERSION_TABLE: &str =
    "CREATE TABLE IF NOT EXISTS ledger_version (version BIGINT PRIMARY KEY)";

/// Every schema step, oldest first.
pub const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        sqlite: concat!(
            "CREATE TABLE ledger_runs (
    job_id        INTEGER NOT NULL,
    run           INTEGER NOT NULL,
    array_job_id  INTEGER,
    array_task_id INTEGER,
    uid           INTEGER NOT NULL,
    user_name     TEXT    NOT NULL,
    account       TEXT    NOT NULL,
    partition     TEXT    NOT NULL,
    qos           TEXT,
    nodes         TEXT    NOT NULL,
    node_count    INTEGER NOT NULL,
    submit_time   INTEGER NOT NULL,
    eligible_time INTEGER NOT NULL,
    start_time    INTEGER,
    end_time      INTEGER NOT NULL,
    state         TEXT    NOT NULL,
    exit_code     INTEGER,
    exit_signal   INTEGER,
    cpus          INTEGER NOT NULL,
    memory        INTEGER NOT NULL,
    gpus          INTEGER NOT NULL,
    gpu_type      TEXT,
    billing       REAL    NOT NULL,
    image         TEXT,
    requeues      INTEGER NOT NULL,
    data          TEXT    NOT NULL,
    PRIMARY KEY (job_id, run)
);",
            "
CREATE INDEX IF NOT EXISTS ledger_runs_uid ON ledger_runs(uid, end_time);
CREATE INDEX IF NOT EXISTS ledger_runs_user ON ledger_runs(user_name, end_time);
CREATE INDEX IF NOT EXISTS ledger_runs_account ON ledger_runs(account, end_time);
CREATE INDEX IF NOT EXISTS ledger_runs_partition ON ledger_runs(partition, end_time);
CREATE INDEX IF NOT EXISTS ledger_runs_state ON ledger_runs(state, end_time);
CREATE INDEX IF NOT EXISTS ledger_runs_end ON ledger_runs(end_time);
"
        ),
        postgres: concat!(
            "CREATE TABLE ledger_runs (
    job_id        BIGINT NOT NULL,
    run           BIGINT NOT NULL,
    array_job_id  BIGINT,
    array_task_id BIGINT,
    uid           BIGINT NOT NULL,
    user_name     TEXT   NOT NULL,
    account       TEXT   NOT NULL,
    partition     TEXT   NOT NULL,
    qos           TEXT,
    nodes         TEXT   NOT NULL,
    node_count    BIGINT NOT NULL,
    submit_time   BIGINT NOT NULL,
    eligible_time BIGINT NOT NULL,
    start_time    BIGINT,
    end_time      BIGINT NOT NULL,
    state         TEXT   NOT NULL,
    exit_code     BIGINT,
    exit_signal   BIGINT,
    cpus          BIGINT NOT NULL,
    memory        BIGINT NOT NULL,
    gpus          BIGINT NOT NULL,
    gpu_type      TEXT,
    billing       DOUBLE PRECISION NOT NULL,
    image         TEXT,
    requeues      BIGINT NOT NULL,
    data          TEXT   NOT NULL,
    PRIMARY KEY (job_id, run)
);",
            "
CREATE INDEX IF NOT EXISTS ledger_runs_uid ON ledger_runs(uid, end_time);
CREATE INDEX IF NOT EXISTS ledger_runs_user ON ledger_runs(user_name, end_time);
CREATE INDEX IF NOT EXISTS ledger_runs_account ON ledger_runs(account, end_time);
CREATE INDEX IF NOT EXISTS ledger_runs_partition ON ledger_runs(partition, end_time);
CREATE INDEX IF NOT EXISTS ledger_runs_state ON ledger_runs(state, end_time);
CREATE INDEX IF NOT EXISTS ledger_runs_end ON ledger_runs(end_time);
"
        ),
    },
    Migration {
        version: 2,
        // An array's runs by its job id and task id (`wharf acct -j ARRAYID`, `-j ARRAYID_TASK`).
        sqlite: "CREATE INDEX IF NOT EXISTS ledger_runs_array \
             ON ledger_runs(array_job_id, array_task_id);",
        postgres: "CREATE INDEX IF NOT EXISTS ledger_runs_array \
               ON ledger_runs(array_job_id, array_task_id);",
    },
];

/// A value bound to a placeholder.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// An integer or NULL.
    Int(Option<i64>),
    /// A real number.
    Real(f64),
    /// Text or NULL.
    Text(Option<String>),
}

/// The columns of `ledger_runs`, in insert order.
pub const COLUMNS: &str = "job_id, run, array_job_id, array_task_id, uid, user_name, account, \
     partition, qos, nodes, node_count, submit_time, eligible_time, start_time, end_time, state, \
     exit_code, exit_signal, cpus, memory, gpus, gpu_type, billing, image, requeues, data";

const NCOLUMNS: usize = 26;

fn int(v: u64) -> Value {
    Value::Int(Some(v.min(i64::MAX as u64) as i64))
}

fn opt_int<T: Into<i64>>(v: Option<T>) -> Value {
    Value::Int(v.map(Into::into))
}

/// The insert that skips a run already stored (the idempotent key).
pub fn insert_sql(d: Dialect) -> String {
    let phs: Vec<String> = (1..=NCOLUMNS).map(|n| d.ph(n)).collect();
    format!(
        "INSERT INTO ledger_runs ({COLUMNS}) VALUES ({}) ON CONFLICT (job_id, run) DO NOTHING",
        phs.join(", ")
    )
}

/// The values of `run` for [`insert_sql`].
pub fn insert_values(run: &JobRun) -> Result<Vec<Value>, serde_json::Error> {
    Ok(vec![
        int(run.job_id),
        int(run.run.into()),
        Value::Int(run.array_job_id.map(|v| v.min(i64::MAX as u64) as i64)),
        opt_int(run.array_task_id),
        int(run.uid.into()),
        Value::Text(Some(run.user.clone())),
        Value::Text(Some(run.account.clone())),
        Value::Text(Some(run.partition.clone())),
        Value::Text(run.qos.clone()),
        Value::Text(Some(run.nodes.clone())),
        int(run.node_count.into()),
        int(run.submit_time),
        int(run.eligible_time),
        Value::Int(run.start_time.map(|v| v.min(i64::MAX as u64) as i64)),
        int(run.end_time),
        Value::Text(Some(run.state.clone())),
        opt_int(run.exit_code),
        opt_int(run.exit_signal),
        int(run.cpus.into()),
        int(run.memory),
        int(run.gpus.into()),
        Value::Text(run.gpu_type.clone()),
        Value::Real(run.billing),
        Value::Text(run.image.clone()),
        int(run.requeues.into()),
        Value::Text(Some(serde_json::to_string(run)?)),
    ])
}

/// `SELECT data ...` for `f`, with its values.
pub fn query_sql(d: Dialect, f: &RunFilter) -> (String, Vec<Value>) {
    let mut values = Vec::new();
    let mut bind = |v: Value| {
        values.push(v);
        d.ph(values.len())
    };
    let mut clauses = vec![
        format!("submit_time <= {}", bind(int(f.until))),
        format!("end_time >= {}", bind(int(f.since))),
    ];
    // A job id names that job or every task of the array it is the id of; `ID_TASK` one task.
    // Plain ids go in two IN lists (an OR per id would nest past SQLite's expression depth
    // with a few hundred of them); tasks are few.
    let plain: Vec<wharf_api::JobId> = (f.jobs.iter())
        .filter(|(_, t)| t.is_none())
        .map(|&(id, _)| id)
        .collect();
    let mut jobs: Vec<String> = Vec::new();
    if !plain.is_empty() {
        let list = |bind: &mut dyn FnMut(Value) -> String| {
            (plain.iter())
                .map(|&id| bind(int(id)))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let ids = list(&mut bind);
        let arrays = list(&mut bind);
        jobs.push(format!("job_id IN ({ids}) OR array_job_id IN ({arrays})"));
    }
    for &(id, task) in &f.jobs {
        if let Some(t) = task {
            jobs.push(format!(
                "(array_job_id = {} AND array_task_id = {})",
                bind(int(id)),
                bind(int(t.into()))
            ));
        }
    }
    if !jobs.is_empty() {
        clauses.push(format!("({})", jobs.join(" OR ")));
    }
    let mut any_of = |column: &str, items: Vec<Value>, clauses: &mut Vec<String>| {
        if !items.is_empty() {
            let phs: Vec<String> = items.into_iter().map(&mut bind).collect();
            clauses.push(format!("{column} IN ({})", phs.join(", ")));
        }
    };
    let text = |v: &[String]| v.iter().map(|s| Value::Text(Some(s.clone()))).collect();
    any_of(
        "uid",
        f.uid.map(|u| int(u.into())).into_iter().collect(),
        &mut clauses,
    );
    any_of("user_name", text(&f.users), &mut clauses);
    any_of("account", text(&f.accounts), &mut clauses);
    any_of("partition", text(&f.partitions), &mut clauses);
    any_of("state", text(&f.states), &mut clauses);
    if f.last_runs_only {
        clauses.push(format!("state <> '{}'", super::REQUEUED));
    }
    let limit = bind(int(f.limit.into()));
    (
        format!(
            "SELECT data FROM ledger_runs WHERE {} ORDER BY job_id, run LIMIT {limit}",
            clauses.join(" AND ")
        ),
        values,
    )
}

/// `SELECT data ...` of one job's runs.
pub fn lookup_sql(d: Dialect) -> String {
    format!(
        "SELECT data FROM ledger_runs WHERE job_id = {} ORDER BY run",
        d.ph(1)
    )
}

/// The report's aggregation over `[since, until)`, optionally of one owner: rows of
/// (account, user, partition, runs, cpu_ms, gpu_ms, billing).
pub fn report_sql(d: Dialect, since: u64, until: u64, uid: Option<u32>) -> (String, Vec<Value>) {
    let (s, u) = (d.ph(1), d.ph(2));
    let (least, greatest) = (d.least(), d.greatest());
    let inside = format!("({least}(end_time, {u}) - {greatest}(start_time, {s}))");
    let (cast_int, cast_real) = match d {
        Dialect::Sqlite => ("", ""),
        Dialect::Postgres => ("::BIGINT", "::DOUBLE PRECISION"),
    };
    let mut values = vec![int(since), int(until)];
    let owner = match uid {
        Some(uid) => {
            values.push(int(uid.into()));
            format!(" AND uid = {}", d.ph(3))
        }
        None => String::new(),
    };
    (
        format!(
            "SELECT account, user_name, partition, COUNT(*){cast_int}, \
             COALESCE(SUM(cpus * {inside}), 0){cast_int}, \
             COALESCE(SUM(gpus * {inside}), 0){cast_int}, \
             COALESCE(SUM(billing * {inside}) / 1000.0, 0){cast_real} \
             FROM ledger_runs \
             WHERE end_time >= {s} AND start_time IS NOT NULL AND start_time < {u} \
             AND ((end_time > start_time AND end_time > {s}) \
                  OR (end_time = start_time AND start_time >= {s})){owner} \
             GROUP BY account, user_name, partition ORDER BY account, user_name, partition"
        ),
        values,
    )
}

/// `SELECT data ...` of the runs that ended before a cutoff (`$1`), at most `$2`.
pub fn ended_before_sql(d: Dialect) -> String {
    format!(
        "SELECT data FROM ledger_runs WHERE end_time < {} ORDER BY end_time, job_id, run LIMIT {}",
        d.ph(1),
        d.ph(2)
    )
}

/// `SELECT data ...` of the `$1` runs that ended last, latest first.
pub fn last_ended_sql(d: Dialect) -> String {
    format!(
        "SELECT data FROM ledger_runs ORDER BY end_time DESC, job_id DESC, run DESC LIMIT {}",
        d.ph(1)
    )
}

/// Deletes one run (`$1` job id, `$2` run).
pub fn delete_sql(d: Dialect) -> String {
    format!(
        "DELETE FROM ledger_runs WHERE job_id = {} AND run = {}",
        d.ph(1),
        d.ph(2)
    )
}

/// Clamps a stored integer back to `u64`.
pub fn to_u64(v: i64) -> u64 {
    v.max(0) as u64
}
