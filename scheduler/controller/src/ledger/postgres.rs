//! The PostgreSQL ledger, for large sites: the same `ledger_runs` table and migrations as
//! SQLite ([`super::schema`]), reached with rust-postgres.
//!
//! The client lives on a thread of its own: the controller calls the ledger from tokio's
//! blocking pool, where the synchronous client (which runs a small runtime of its own)
//! cannot be driven, and a thread also keeps one connection, made again after it breaks.
//!
//! While the database is unreachable, [`PgLedger::record`] appends to the local spool
//! ([`super::spool`]) instead, and keeps doing so while anything waits there, so runs reach
//! the database in the order they ended. A replayer thread, with a connection of its own
//! (never the caller's lock), retries every `replay_interval`, inserts the whole spool in one
//! transaction and only after that commit cuts it from the spool. Until then reads (a
//! report, a lookup, the last runs that fair share replays) count the spooled runs as well,
//! each once: the database's rows and the check of which spooled runs it already holds are
//! read in one snapshot.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::time::Duration;

use postgres::{Client, NoTls};
use wharf_api::JobId;

use super::schema::{self, Dialect, Value};
use super::spool::{DeadLetters, Spool};
use super::{add_to_report, JobRun, Ledger, LedgerError, RunFilter, UsageGroup};

/// Where the database is and who the controller is there (`[accounting]`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PgSettings {
    /// A `postgres://user@host:port/dbname` URL (or `key=value` string) without a password;
    /// the separate keys below override its parts.
    pub url: Option<String>,
    /// Host name, IP address, or a directory holding the server's Unix socket.
    pub host: Option<String>,
    /// Port.
    pub port: Option<u16>,
    /// Role.
    pub user: Option<String>,
    /// Database.
    pub dbname: Option<String>,
    /// File holding the role's password; must be readable by its owner only.
    pub password_file: Option<PathBuf>,
    /// Longest wait for a connection.
    pub connect_timeout: Duration,
}

impl PgSettings {
    /// The client configuration. Errors: `InvalidInput` naming the problem (a password in
    /// the URL, a password file that others may read, no host).
    pub fn config(&self) -> Result<postgres::Config, LedgerError> {
        let bad = |m: String| LedgerError::InvalidInput(m);
        let mut c = match &self.url {
            Some(url) => url
                .parse::<postgres::Config>()
                .map_err(|e| bad(format!("accounting.url: {e}")))?,
            None => postgres::Config::new(),
        };
        if c.get_password().is_some() {
            return Err(bad(
                "accounting.url holds a password, which the config file would show to whoever \
                 reads it; put the password in accounting.password_file (mode 0600) instead"
                    .into(),
            ));
        }
        if let Some(h) = &self.host {
            c.host(h);
        }
        if let Some(p) = self.port {
            c.port(p);
        }
        if let Some(u) = &self.user {
            c.user(u);
        }
        if let Some(d) = &self.dbname {
            c.dbname(d);
        }
        if let Some(file) = &self.password_file {
            c.password(read_password(file)?);
        }
        if c.get_hosts().is_empty() {
            return Err(bad(
                "accounting.store = \"postgres\" needs accounting.url or accounting.host".into(),
            ));
        }
        if c.get_user().is_none() {
            c.user("wharf");
        }
        c.connect_timeout(self.connect_timeout.max(Duration::from_millis(100)));
        c.application_name("wharf-controller");
        Ok(c)
    }
}

/// Reads a password file, refusing one that anyone but its owner may read.
pub fn read_password(file: &Path) -> Result<String, LedgerError> {
    let bad = |m: String| LedgerError::InvalidInput(m);
    let meta = std::fs::metadata(file)
        .map_err(|e| bad(format!("accounting.password_file {}: {e}", file.display())))?;
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(bad(format!(
            "accounting.password_file {} has mode {mode:04o}: others may read the database \
             password; make it readable by its owner only (chmod 600)",
            file.display()
        )));
    }
    let text = std::fs::read_to_string(file)
        .map_err(|e| bad(format!("accounting.password_file {}: {e}", file.display())))?;
    let password = text.trim_end_matches(['\n', '\r']).to_string();
    if password.is_empty() {
        return Err(bad(format!(
            "accounting.password_file {} is empty",
            file.display()
        )));
    }
    Ok(password)
}

/// One connection, made on first use and again after it breaks, with the schema applied,
/// and the statements prepared on it (a lookup is then one round trip, not two).
struct Session {
    config: postgres::Config,
    client: Option<Client>,
    statements: std::collections::HashMap<String, postgres::Statement>,
}

/// Most statements kept prepared (acct's filters make a few shapes; ids lists make more).
const MAX_STATEMENTS: usize = 64;

impl Session {
    /// Runs `f` on a connected client. Any failure drops the client (the next call connects
    /// again); one of the connection itself comes back as `Unavailable`.
    fn with<R>(
        &mut self,
        f: impl FnOnce(&mut Client) -> Result<R, postgres::Error>,
    ) -> Result<R, LedgerError> {
        if self.client.is_none() {
            // Statements belong to the connection they were prepared on.
            self.statements.clear();
            let mut client = self.config.connect(NoTls).map_err(unavailable)?;
            migrate(&mut client).map_err(classify)?;
            self.client = Some(client);
        }
        let client = self.client.as_mut().expect("connected above");
        let out = f(client).map_err(classify);
        // After a refusal too: a statement the server refused mid-transaction can leave the
        // connection's prepared statements out of step with the client's.
        if out.is_err() {
            self.client = None;
        }
        out
    }
}

impl Session {
    /// Runs the query `sql` with `values`, prepared once per connection.
    fn query(&mut self, sql: &str, values: &[Value]) -> Result<Vec<postgres::Row>, LedgerError> {
        // Only a statement of the connection `with` will use (it connects again when none).
        let cached = self
            .client
            .as_ref()
            .and_then(|_| self.statements.get(sql).cloned());
        let (stmt, rows) = self.with(|c| {
            let stmt = match cached {
                Some(s) => s,
                None => c.prepare(sql)?,
            };
            let p = params(values);
            let rows = c.query(&stmt, &refs(&p))?;
            Ok((stmt, rows))
        })?;
        if self.statements.len() >= MAX_STATEMENTS {
            self.statements.clear();
        }
        self.statements.insert(sql.to_string(), stmt);
        Ok(rows)
    }

    /// Runs `sql` with `values` and finds which of `spooled` the database does not hold,
    /// both in one snapshot (a read-only repeatable-read transaction), so a run the replayer
    /// moves from the spool into the database meanwhile is seen in exactly one of the two.
    fn with_spooled(
        &mut self,
        sql: &str,
        values: &[Value],
        spooled: Vec<JobRun>,
    ) -> Result<(Vec<postgres::Row>, Vec<JobRun>), LedgerError> {
        self.with(|c| {
            let mut tx = c
                .build_transaction()
                .isolation_level(postgres::IsolationLevel::RepeatableRead)
                .read_only(true)
                .start()?;
            let p = params(values);
            let rows = tx.query(sql, &refs(&p))?;
            let ids: Vec<i64> = spooled.iter().map(|r| db_int(r.job_id)).collect();
            let held: std::collections::BTreeSet<(i64, i64)> = tx
                .query(
                    "SELECT job_id, run FROM ledger_runs WHERE job_id = ANY($1)",
                    &[&ids],
                )?
                .iter()
                .map(|r| (r.get(0), r.get(1)))
                .collect();
            tx.commit()?;
            let absent = spooled
                .into_iter()
                .filter(|r| !held.contains(&(db_int(r.job_id), i64::from(r.run))))
                .collect();
            Ok((rows, absent))
        })
    }

    /// The runs (`data` column) that `sql` selects.
    fn runs(&mut self, sql: &str, values: &[Value]) -> Result<Vec<JobRun>, LedgerError> {
        self.query(sql, values)?
            .iter()
            .map(|r| serde_json::from_str(r.get::<_, &str>(0)).map_err(LedgerError::from))
            .collect()
    }
}

/// A job id as the database's BIGINT holds it.
fn db_int(id: JobId) -> i64 {
    id.min(i64::MAX as u64) as i64
}

fn unavailable(e: postgres::Error) -> LedgerError {
    LedgerError::Unavailable(error_text(&e))
}

fn error_text(e: &postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{}: {}", db.code().code(), db.message()),
        None => {
            let mut text = e.to_string();
            let mut source = std::error::Error::source(e);
            while let Some(s) = source {
                text = format!("{text}: {s}");
                source = s.source();
            }
            text
        }
    }
}

/// Connection trouble (closed, refused, shut down, "cannot connect now") is `Unavailable`;
/// what the server refused is `Database`.
fn classify(e: postgres::Error) -> LedgerError {
    let gone = e.is_closed()
        || match e.code() {
            Some(code) => {
                let c = code.code();
                c.starts_with("08") || c == "57P01" || c == "57P02" || c == "57P03"
            }
            None => e.as_db_error().is_none(),
        };
    if gone {
        unavailable(e)
    } else {
        LedgerError::Database(error_text(&e))
    }
}

/// Applies the schema steps the database has not had yet; concurrent controllers wait on the
/// version table's lock.
fn migrate(client: &mut Client) -> Result<(), postgres::Error> {
    client.batch_execute(schema::VERSION_TABLE)?;
    for m in schema::MIGRATIONS {
        let mut tx = client.transaction()?;
        tx.batch_execute("LOCK TABLE ledger_version IN EXCLUSIVE MODE")?;
        let done = tx
            .query_opt(
                "SELECT version FROM ledger_version WHERE version = $1",
                &[&m.version],
            )?
            .is_some();
        if !done {
            tx.batch_execute(m.postgres)?;
            tx.execute("INSERT INTO ledger_version VALUES ($1)", &[&m.version])?;
        }
        tx.commit()?;
    }
    Ok(())
}

type Task = Box<dyn FnOnce(&mut Session) + Send>;

/// The thread that owns a [`Session`]; calls wait for its answer.
struct Worker {
    tasks: mpsc::Sender<Task>,
}

impl Worker {
    fn start(config: postgres::Config, name: &str) -> Result<Worker, LedgerError> {
        let (tasks, rx) = mpsc::channel::<Task>();
        std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                let mut session = Session {
                    config,
                    client: None,
                    statements: Default::default(),
                };
                for task in rx {
                    task(&mut session);
                }
            })
            .map_err(|e| LedgerError::Database(format!("starting {name}: {e}")))?;
        Ok(Worker { tasks })
    }

    fn call<R: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Session) -> Result<R, LedgerError> + Send + 'static,
    ) -> Result<R, LedgerError> {
        let (tx, rx) = mpsc::sync_channel(1);
        let task: Task = Box::new(move |s| {
            let _ = tx.send(f(s));
        });
        let gone = || LedgerError::Database("the database thread is gone".into());
        self.tasks.send(task).map_err(|_| gone())?;
        rx.recv().map_err(|_| gone())?
    }
}

impl std::fmt::Debug for Worker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Worker")
    }
}

fn params(values: &[Value]) -> Vec<Box<dyn postgres::types::ToSql + Sync + Send>> {
    values
        .iter()
        .map(|v| -> Box<dyn postgres::types::ToSql + Sync + Send> {
            match v {
                Value::Int(i) => Box::new(*i),
                Value::Real(r) => Box::new(*r),
                Value::Text(t) => Box::new(t.clone()),
            }
        })
        .collect()
}

fn refs(
    p: &[Box<dyn postgres::types::ToSql + Sync + Send>],
) -> Vec<&(dyn postgres::types::ToSql + Sync)> {
    p.iter()
        .map(|b| b.as_ref() as &(dyn postgres::types::ToSql + Sync))
        .collect()
}

fn insert_all(client: &mut Client, runs: &[JobRun]) -> Result<(), postgres::Error> {
    let mut tx = client.transaction()?;
    let stmt = tx.prepare(&schema::insert_sql(Dialect::Postgres))?;
    for run in runs {
        // Serialising a run cannot fail (plain data); a failure would be a bug, so say so.
        let values = schema::insert_values(run).expect("a run serialises");
        let p = params(&values);
        tx.execute(&stmt, &refs(&p))?;
    }
    tx.commit()
}

/// State shared with the replayer.
#[derive(Debug)]
struct Shared {
    spool: Mutex<Spool>,
    wake: Condvar,
    /// Runs the database refused for good, beside the spool (`ledger.deadletter`).
    dead: DeadLetters,
}

/// Inserts `runs` one transaction each, in order, after the database refused them together:
/// a run it refuses for good (`Database`: a constraint, an encoding error) is set aside in
/// `dead` with the error and logged, so that it holds up no run behind it. Returns how many
/// runs were dealt with (inserted or set aside) and, when it stopped early, why (the
/// database went away: the rest are to be kept for later).
fn insert_each(
    worker: &Worker,
    dead: &DeadLetters,
    runs: &[JobRun],
) -> (usize, Option<LedgerError>) {
    for (i, run) in runs.iter().enumerate() {
        let one = vec![run.clone()];
        match worker.call(move |s| s.with(|c| insert_all(c, &one))) {
            Ok(()) => {}
            Err(LedgerError::Database(why)) => {
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_millis() as u64);
                if let Err(e) = dead.append(run, &why, now) {
                    return (i, Some(e));
                }
                tracing::error!(
                    job = run.job_id,
                    run = run.run,
                    error = %why,
                    file = %dead.path().display(),
                    "the accounting database refused a record; it is set aside in the dead letters"
                );
            }
            Err(e) => return (i, Some(e)),
        }
    }
    (runs.len(), None)
}

/// The ledger in a PostgreSQL database, spooling locally while the database is away.
#[derive(Debug)]
pub struct PgLedger {
    worker: Worker,
    /// The spool and its replayer; `None` for a ledger that only reads and purges.
    shared: Option<Arc<Shared>>,
}

impl PgLedger {
    /// Connects lazily to the database `settings` name (the first call connects and applies
    /// the schema). With `spool` = (path, interval), runs that cannot be written go to that
    /// file and a replayer thread retries every interval (replaying first what an earlier
    /// controller left there); only one ledger may use a given spool. Errors: `InvalidInput`
    /// for bad settings.
    pub fn open(
        settings: &PgSettings,
        spool: Option<(PathBuf, Duration)>,
    ) -> Result<PgLedger, LedgerError> {
        let config = settings.config()?;
        let worker = Worker::start(config.clone(), "wharf-ledger")?;
        let shared = match spool {
            Some((path, every)) => {
                let shared = Arc::new(Shared {
                    dead: DeadLetters::new(path.with_file_name(DEAD_LETTERS)),
                    spool: Mutex::new(Spool::new(path)),
                    wake: Condvar::new(),
                });
                let replayer = Worker::start(config, "wharf-ledger-replay-db")?;
                let weak = Arc::downgrade(&shared);
                std::thread::Builder::new()
                    .name("wharf-ledger-replay".into())
                    .spawn(move || replay_loop(weak, replayer, every))
                    .map_err(|e| {
                        LedgerError::Database(format!("starting the spool replayer: {e}"))
                    })?;
                Some(shared)
            }
            None => None,
        };
        Ok(PgLedger { worker, shared })
    }

    /// Checks that the database answers (connecting and applying the schema). Errors:
    /// `Unavailable`, `Database`.
    pub fn ping(&self) -> Result<(), LedgerError> {
        self.worker
            .call(|s| s.with(|c| c.batch_execute("SELECT 1")))
    }

    /// Runs waiting in the spool.
    pub fn spooled(&self) -> Result<usize, LedgerError> {
        match &self.shared {
            Some(s) => Ok(lock(&s.spool).read()?.len()),
            None => Ok(0),
        }
    }

    /// Replays the spool now, on the caller's thread; returns how many runs reached the
    /// database. Errors: `Unavailable` (the spool is kept), `Database`, `Spool`.
    pub fn replay_now(&self) -> Result<usize, LedgerError> {
        match &self.shared {
            Some(s) => replay(s, &self.worker),
            None => Ok(0),
        }
    }

    /// The runs waiting in the spool that `keep` selects; none without a spool. Reads see
    /// them too (a run's end counts from the moment `record` accepted it, not from when the
    /// replayer gets it into the database). Errors: `Spool`, `Corrupt`.
    fn spooled_runs(&self, keep: impl Fn(&JobRun) -> bool) -> Result<Vec<JobRun>, LedgerError> {
        match &self.shared {
            Some(s) => Ok(lock(&s.spool).read()?.into_iter().filter(keep).collect()),
            None => Ok(Vec::new()),
        }
    }

    /// The runs (`data` column) that `sql` selects, with the spooled runs `keep` selects
    /// that the database does not hold yet (unordered: callers order and cut).
    fn runs_with_spooled(
        &self,
        sql: String,
        values: Vec<Value>,
        keep: impl Fn(&JobRun) -> bool,
    ) -> Result<Vec<JobRun>, LedgerError> {
        let spooled = self.spooled_runs(keep)?;
        if spooled.is_empty() {
            return self.worker.call(move |s| s.runs(&sql, &values));
        }
        let (rows, absent) = self
            .worker
            .call(move |s| s.with_spooled(&sql, &values, spooled))?;
        let mut runs = rows
            .iter()
            .map(|r| serde_json::from_str(r.get::<_, &str>(0)).map_err(LedgerError::from))
            .collect::<Result<Vec<JobRun>, _>>()?;
        runs.extend(absent);
        Ok(runs)
    }

    fn insert(&self, runs: &[JobRun]) -> Result<(), LedgerError> {
        let owned = runs.to_vec();
        self.worker.call(move |s| s.with(|c| insert_all(c, &owned)))
    }
}

fn lock(m: &Mutex<Spool>) -> std::sync::MutexGuard<'_, Spool> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Inserts what the spool holds and then cuts it from the spool.
fn replay(shared: &Shared, worker: &Worker) -> Result<usize, LedgerError> {
    let runs = {
        let spool = lock(&shared.spool);
        if !spool.has_runs() {
            return Ok(0);
        }
        spool.read()?
    };
    let n = runs.len();
    let batch = runs.clone();
    match worker.call(move |s| s.with(|c| insert_all(c, &batch))) {
        Ok(()) => lock(&shared.spool).drop_first(n)?,
        // One run (or more) the database will never take: the others go in one by one.
        Err(LedgerError::Database(_)) => {
            let (done, stopped) = insert_each(worker, &shared.dead, &runs);
            lock(&shared.spool).drop_first(done)?;
            if let Some(e) = stopped {
                return Err(e);
            }
        }
        Err(e) => return Err(e),
    }
    if n > 0 {
        tracing::info!(
            runs = n,
            "spooled accounting records replayed into the database"
        );
    }
    Ok(n)
}

fn replay_loop(shared: Weak<Shared>, worker: Worker, every: Duration) {
    let mut failing = false;
    loop {
        let Some(s) = shared.upgrade() else { return };
        match replay(&s, &worker) {
            Ok(_) => failing = false,
            Err(e) if !failing => {
                failing = true;
                tracing::warn!(error = %e, "accounting records stay spooled; retrying");
            }
            Err(_) => {}
        }
        // Wait for the interval or a wake-up from record(); once the ledger is dropped, the
        // next round finds it gone and the thread ends.
        let guard = lock(&s.spool);
        let _ = s.wake.wait_timeout(guard, every);
    }
}

/// The dead letters' file name, beside the spool.
pub const DEAD_LETTERS: &str = "ledger.deadletter";

impl Ledger for PgLedger {
    fn dead_letters(&self) -> Result<usize, LedgerError> {
        match &self.shared {
            Some(s) => s.dead.count(),
            None => Ok(0),
        }
    }

    fn record(&mut self, runs: &[JobRun]) -> Result<(), LedgerError> {
        if runs.is_empty() {
            return Ok(());
        }
        let Some(shared) = &self.shared else {
            return self.insert(runs);
        };
        let spool = lock(&shared.spool);
        if spool.has_runs() {
            // Earlier runs wait: queue behind them, in order.
            spool.append(runs)?;
            shared.wake.notify_one();
            return Ok(());
        }
        match self.insert(runs) {
            Err(LedgerError::Unavailable(why)) => {
                tracing::warn!(error = %why, spool = %spool.path().display(),
                    "accounting database unreachable; spooling records");
                spool.append(runs)
            }
            Err(LedgerError::Database(_)) => {
                let (done, stopped) = insert_each(&self.worker, &shared.dead, runs);
                match stopped {
                    None => Ok(()),
                    Some(LedgerError::Unavailable(_)) => spool.append(&runs[done..]),
                    Some(e) => Err(e),
                }
            }
            other => other,
        }
    }

    fn lookup(&self, id: JobId) -> Result<Vec<JobRun>, LedgerError> {
        let sql = schema::lookup_sql(Dialect::Postgres);
        let values = vec![Value::Int(Some(db_int(id)))];
        let mut runs = self.runs_with_spooled(sql, values, |r| r.job_id == id)?;
        runs.sort_by_key(|r| r.run);
        Ok(runs)
    }

    fn query(&self, filter: &RunFilter) -> Result<Vec<JobRun>, LedgerError> {
        let (sql, values) = schema::query_sql(Dialect::Postgres, filter);
        self.worker.call(move |s| s.runs(&sql, &values))
    }

    fn report(
        &self,
        since: u64,
        until: u64,
        uid: Option<u32>,
    ) -> Result<Vec<UsageGroup>, LedgerError> {
        let (sql, values) = schema::report_sql(Dialect::Postgres, since, until, uid);
        let spooled = self.spooled_runs(|r| uid.is_none_or(|u| r.uid == u))?;
        let (rows, absent) = if spooled.is_empty() {
            (self.worker.call(move |s| s.query(&sql, &values))?, vec![])
        } else {
            self.worker
                .call(move |s| s.with_spooled(&sql, &values, spooled))?
        };
        let mut groups: Vec<UsageGroup> = rows
            .iter()
            .map(|r| UsageGroup {
                account: r.get(0),
                user: r.get(1),
                partition: r.get(2),
                runs: schema::to_u64(r.get(3)),
                cpu_ms: schema::to_u64(r.get(4)),
                gpu_ms: schema::to_u64(r.get(5)),
                billing: r.get(6),
            })
            .collect();
        add_to_report(&mut groups, &absent, since, until);
        Ok(groups)
    }

    fn ended_before(&self, cutoff: u64, limit: u32) -> Result<Vec<JobRun>, LedgerError> {
        let sql = schema::ended_before_sql(Dialect::Postgres);
        let values = vec![
            Value::Int(Some(cutoff.min(i64::MAX as u64) as i64)),
            Value::Int(Some(limit.into())),
        ];
        self.worker.call(move |s| s.runs(&sql, &values))
    }

    fn last_ended(&self, limit: u32) -> Result<Vec<JobRun>, LedgerError> {
        let sql = schema::last_ended_sql(Dialect::Postgres);
        let values = vec![Value::Int(Some(limit.into()))];
        let mut runs = self.runs_with_spooled(sql, values, |_| true)?;
        runs.sort_by_key(|r| std::cmp::Reverse((r.end_time, r.job_id, r.run)));
        runs.truncate(limit as usize);
        Ok(runs)
    }

    fn delete(&mut self, keys: &[(JobId, u32)]) -> Result<usize, LedgerError> {
        let keys = keys.to_vec();
        self.worker.call(move |s| {
            s.with(|c| {
                let mut tx = c.transaction()?;
                let stmt = tx.prepare(&schema::delete_sql(Dialect::Postgres))?;
                let mut n = 0;
                for (id, run) in &keys {
                    n += tx.execute(
                        &stmt,
                        &[&(*id.min(&(i64::MAX as u64)) as i64), &i64::from(*run)],
                    )?;
                }
                tx.commit()?;
                Ok(n as usize)
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;
    use std::time::{Duration, Instant};

    use super::*;
    use crate::ledger::conformance::{self, run};
    use crate::ledger::pg_server::PgServer;

    fn job(id: u64) -> JobRun {
        run(id, 0, "a", "phys", "cpu", Some(0), 1_000, 1, 0, "COMPLETED")
    }

    #[test]
    fn runs_recorded_while_the_database_is_stopped_arrive_once_each_in_order() {
        let Some(mut server) = PgServer::start() else {
            return;
        };
        let settings = server.database();
        let spool = server.scratch().join("ledger.spool");
        let every = Duration::from_millis(200);
        let mut l = PgLedger::open(&settings, Some((spool.clone(), every))).unwrap();
        for id in 1..=10 {
            l.record(&[job(id)]).unwrap();
        }
        assert_eq!(l.spooled().unwrap(), 0, "written straight to the database");

        server.stop();
        // The controller goes on: every record is accepted, into the spool.
        for id in 11..=40 {
            l.record(&[job(id)]).unwrap();
        }
        // A replay of a run already in the database, and one of a spooled run.
        l.record(&[job(5), job(20)]).unwrap();
        assert_eq!(l.spooled().unwrap(), 32);
        let mode = std::fs::metadata(&spool).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "the spool is root's only");
        assert!(matches!(
            l.query(&RunFilter::default()),
            Err(LedgerError::Unavailable(_))
        ));

        server.start_again();
        for id in 41..=50 {
            l.record(&[job(id)]).unwrap();
        }
        let deadline = Instant::now() + Duration::from_secs(120);
        while l.spooled().unwrap() > 0 {
            assert!(Instant::now() < deadline, "the spool was never replayed");
            std::thread::sleep(Duration::from_millis(100));
        }
        assert!(!spool.exists(), "an empty spool is removed");
        let ids: Vec<u64> = l
            .query(&RunFilter::default())
            .unwrap()
            .iter()
            .map(|r| r.job_id)
            .collect();
        assert_eq!(
            ids,
            (1..=50).collect::<Vec<u64>>(),
            "every run exactly once"
        );
    }

    #[test]
    fn reads_count_spooled_runs_once_before_and_after_the_replay() {
        let Some(mut server) = PgServer::start() else {
            return;
        };
        let settings = server.database();
        let spool = server.scratch().join("ledger.spool");
        // The replayer tries once when woken and then waits an hour: the spool stays put
        // until `replay_now`.
        let mut l = PgLedger::open(&settings, Some((spool, Duration::from_secs(3600)))).unwrap();
        let gpu = |id: u64| {
            run(
                id,
                0,
                "b",
                "phys",
                "gpu",
                Some(0),
                60_000,
                2,
                1,
                "COMPLETED",
            )
        };
        l.record(&[gpu(1)]).unwrap();
        server.stop();
        l.record(&[gpu(2)]).unwrap();
        l.record(&[gpu(3)]).unwrap();
        server.start_again();
        assert_eq!(l.spooled().unwrap(), 2, "runs 2 and 3 wait in the spool");

        let (since, until) = (conformance::T0, conformance::T0 + 3_600_000);
        let check = |l: &PgLedger, when: &str| {
            let groups = l.report(since, until, None).unwrap();
            assert_eq!(groups.len(), 1, "{when}: {groups:?}");
            let g = &groups[0];
            assert_eq!(
                (g.runs, g.cpu_ms, g.gpu_ms),
                (3, 360_000, 180_000),
                "{when}: {g:?}"
            );
            assert_eq!(
                l.report(since, until, Some(1000)).unwrap(),
                vec![],
                "{when}"
            );
            let runs = l.lookup(3).unwrap();
            assert_eq!(runs.len(), 1, "{when}: lookup finds a spooled run");
            let last: Vec<u64> = l.last_ended(10).unwrap().iter().map(|r| r.job_id).collect();
            assert_eq!(last, [3, 2, 1], "{when}: latest end first, ties by job id");
            let last: Vec<u64> = l.last_ended(2).unwrap().iter().map(|r| r.job_id).collect();
            assert_eq!(last, [3, 2], "{when}: cut at the limit");
        };
        check(&l, "spooled");
        // The crash window: run 2 reached the database but was not cut from the spool.
        l.insert(&[gpu(2)]).unwrap();
        check(&l, "in both");
        assert_eq!(l.replay_now().unwrap(), 2);
        assert_eq!(l.spooled().unwrap(), 0);
        check(&l, "replayed");
    }

    /// A run PostgreSQL refuses for good: a NUL byte in a text column (22021).
    fn refused(id: u64) -> JobRun {
        let mut r = job(id);
        r.user = "a\0b".into();
        r
    }

    fn ids_in(l: &PgLedger) -> Vec<u64> {
        let all = l.query(&RunFilter::default()).unwrap();
        all.iter().map(|r| r.job_id).collect()
    }

    #[test]
    fn a_run_the_database_refuses_for_good_is_set_aside_and_holds_up_nothing() {
        let Some(mut server) = PgServer::start() else {
            return;
        };
        let settings = server.database();
        let spool = server.scratch().join("ledger.spool");
        let dead = server.scratch().join(DEAD_LETTERS);
        let every = Duration::from_millis(200);
        let mut l = PgLedger::open(&settings, Some((spool.clone(), every))).unwrap();
        // Written straight away: the others of the batch arrive, the refused one is set aside.
        l.record(&[job(1), refused(2), job(3)]).unwrap();
        assert_eq!(ids_in(&l), [1, 3]);
        assert_eq!(l.dead_letters().unwrap(), 1);
        assert_eq!(l.spooled().unwrap(), 0);

        // From the spool: the refused run does not block the runs behind it.
        server.stop();
        l.record(&[job(4)]).unwrap();
        l.record(&[refused(5)]).unwrap();
        l.record(&[job(6)]).unwrap();
        assert_eq!(l.spooled().unwrap(), 3);
        server.start_again();
        let deadline = Instant::now() + Duration::from_secs(120);
        while l.spooled().unwrap() > 0 {
            assert!(Instant::now() < deadline, "the spool is stuck");
            std::thread::sleep(Duration::from_millis(100));
        }
        assert_eq!(ids_in(&l), [1, 3, 4, 6]);
        assert_eq!(l.dead_letters().unwrap(), 2);
        let mode = std::fs::metadata(&dead).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "the dead letters are root's only");
        let text = std::fs::read_to_string(&dead).unwrap();
        let letters: Vec<super::super::spool::DeadLetter> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let ids: Vec<u64> = letters.iter().map(|d| d.run.job_id).collect();
        assert_eq!(ids, [2, 5]);
        assert!(
            letters[0].error.starts_with("22021"),
            "{}",
            letters[0].error
        );
        assert_eq!(letters[1].run.user, "a\0b", "kept as it was");
    }

    #[test]
    fn a_password_file_others_may_read_or_a_password_in_the_url_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let pw = dir.path().join("pw");
        std::fs::write(&pw, "secret\n").unwrap();
        std::fs::set_permissions(&pw, std::fs::Permissions::from_mode(0o644)).unwrap();
        let mut s = PgSettings {
            host: Some("db".into()),
            password_file: Some(pw.clone()),
            ..PgSettings::default()
        };
        let e = s.config().unwrap_err().to_string();
        assert!(e.contains("mode 0644") && e.contains("chmod 600"), "{e}");
        std::fs::set_permissions(&pw, std::fs::Permissions::from_mode(0o600)).unwrap();
        let c = s.config().unwrap();
        assert_eq!(c.get_password(), Some(&b"secret"[..]));
        assert_eq!(c.get_user(), Some("wharf"));
        s.url = Some("postgres://wharf:hunter2@db/wharf".into());
        let e = s.config().unwrap_err().to_string();
        assert!(e.contains("password_file"), "{e}");
        let none = PgSettings::default().config().unwrap_err().to_string();
        assert!(none.contains("accounting.host"), "{none}");
    }
}
