//! The durable store: SQLite in WAL mode with full sync. Every change a client is told about
//! is committed here first (docs/architecture.md).
//!
//! Jobs are kept as JSON records with the columns needed to find them; node registrations are
//! kept so a restarted controller knows its nodes before they poll again.

use std::path::Path;

use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};
use wharf_api::{JobId, JobRecord, JobState, NodeInfo};

mod admin;

pub use admin::AssocRow;

/// A store failure.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database refused or broke.
    #[error("state store: {0}")]
    Sql(#[from] rusqlite::Error),
    /// A stored record does not parse (written by a newer version?).
    #[error("state store: corrupt record: {0}")]
    Corrupt(#[from] serde_json::Error),
    /// The ledger's rows could not be written with the jobs.
    #[error("state store: {0}")]
    Ledger(crate::ledger::LedgerError),
    /// The database file could not be made private.
    #[error("state store: cannot make {0} private (mode 0600): {1}")]
    Mode(String, std::io::Error),
}

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS jobs (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    uid          INTEGER NOT NULL,
    state        TEXT    NOT NULL,
    submit_time  INTEGER NOT NULL,
    end_time     INTEGER,
    client_token TEXT UNIQUE,
    record       TEXT    NOT NULL
);
CREATE INDEX IF NOT EXISTS jobs_state ON jobs(state);
CREATE INDEX IF NOT EXISTS jobs_uid ON jobs(uid);
-- An array's tasks by array and task id: a dependency or a `JOB_TASK` id is found without
-- reading the records around it (each a whole job, parsed).
CREATE INDEX IF NOT EXISTS jobs_array
    ON jobs(json_extract(record, '$.array.job_id'), json_extract(record, '$.array.task_id'))
    WHERE json_extract(record, '$.array.job_id') IS NOT NULL;
CREATE TABLE IF NOT EXISTS meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS nodes (
    name      TEXT PRIMARY KEY,
    info      TEXT NOT NULL,
    last_seen INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS node_drains (
    name   TEXT PRIMARY KEY,
    reason TEXT NOT NULL,
    since  INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS node_keys (
    name       TEXT PRIMARY KEY,
    hash       BLOB NOT NULL,
    issued     INTEGER NOT NULL,
    registered INTEGER
);
CREATE TABLE IF NOT EXISTS ledger_outbox (
    job_id INTEGER NOT NULL,
    run    INTEGER NOT NULL,
    data   TEXT    NOT NULL,
    PRIMARY KEY (job_id, run)
);
";

/// [`Store::array_task`]'s query: its terms are the `jobs_array` index's expressions.
const ARRAY_TASK: &str = "SELECT record FROM jobs \
     WHERE json_extract(record, '$.array.job_id') = ?1 \
     AND json_extract(record, '$.array.task_id') = ?2 ORDER BY id LIMIT 1";

/// [`Store::array_states`]'s query.
const ARRAY_STATES: &str = "SELECT id, state FROM jobs \
     WHERE json_extract(record, '$.array.job_id') = ?1 ORDER BY id";

/// What [`Store::add_node_key`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyAdded {
    /// The node held no key; now it holds this one.
    New,
    /// The node held this very key already.
    Same,
    /// The node holds another key.
    Other,
}

/// The controller's database.
#[derive(Debug)]
pub struct Store {
    conn: Connection,
    path: std::path::PathBuf,
}

const ACTIVE: &str = "('PENDING','STARTING','RUNNING')";

/// Which jobs a listing wants (`wharf queue` with `-p`, and with `--all` `-t`, `-u` or `-j`):
/// each list left empty keeps every job. The store filters ended jobs by all of it; the
/// controller filters active ones by partition (their specs, which name it, are hidden from
/// other users), and the client active ones by the rest.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListFilter {
    /// In one of these states.
    pub states: Vec<JobState>,
    /// Of one of these users, by uid (indexed).
    pub uids: Vec<u32>,
    /// Of one of these users, by name: those the controller's host could not name a uid of
    /// (each record is read to find them).
    pub users: Vec<String>,
    /// These jobs: an id, an array's id for each of its tasks, or one task.
    pub jobs: Vec<(u64, Option<u32>)>,
    /// In one of these partitions; a job whose spec names none is in `default_partition`.
    pub partitions: Vec<String>,
    /// The partition of a job that names none (the scheduler's default).
    pub default_partition: String,
}

impl ListFilter {
    /// Whether a job in `partition` (`None`: it names none) is in one of its partitions.
    pub fn keeps_partition(&self, partition: Option<&str>) -> bool {
        let p = partition.unwrap_or(&self.default_partition);
        self.partitions.is_empty() || self.partitions.iter().any(|q| q == p)
    }
}

impl Store {
    /// Opens (creating) the database at `path`: WAL, synchronous=FULL, schema applied. The
    /// database and its `-wal`, `-shm` and `-journal` files are made (or corrected to) 0600:
    /// they hold every job's command and environment.
    pub fn open(path: &Path) -> Result<Store, StoreError> {
        crate::private::file(path, &["-wal", "-shm", "-journal"])
            .map_err(|e| StoreError::Mode(path.display().to_string(), e))?;
        let conn = Connection::open(path)?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "FULL")?;
        conn.pragma_update(None, "foreign_keys", "ON")?;
        conn.busy_timeout(std::time::Duration::from_secs(5))?;
        // A database from before the array index builds it once, reading every record: say so.
        let indexed: bool = conn.query_row(
            "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'index' AND name = 'jobs_array') \
             OR NOT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'jobs')",
            [],
            |r| r.get(0),
        )?;
        if !indexed {
            tracing::info!(db = %path.display(), "indexing stored jobs by array task (once; it reads every record)");
        }
        conn.execute_batch(SCHEMA)?;
        conn.execute_batch(admin::SCHEMA)?;
        crate::ledger::sqlite::migrate(&conn)?;
        Ok(Store {
            conn,
            path: path.to_path_buf(),
        })
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether each commit waits for the disk (`synchronous=FULL`, as opened) or not
    /// (`NORMAL`). In WAL mode a commit that does not wait is made durable by the next one
    /// that does (or by [`Store::sync`]), which syncs the log and everything before it in
    /// it; a crash before then loses such commits whole, never part of one, and never one
    /// made before them.
    pub fn set_durable(&mut self, durable: bool) -> Result<(), StoreError> {
        let mode = if durable { "FULL" } else { "NORMAL" };
        self.conn.pragma_update(None, "synchronous", mode)?;
        Ok(())
    }

    /// Whether each commit waits for the disk (see [`Store::set_durable`]).
    pub fn is_durable(&self) -> Result<bool, StoreError> {
        let mode: i64 = self
            .conn
            .query_row("PRAGMA synchronous", [], |r| r.get(0))?;
        // 2 is FULL, 3 EXTRA.
        Ok(mode >= 2)
    }

    /// Makes every commit so far durable: one write, waited for, of the store's own settings
    /// (see [`Store::set_durable`]). Needs the store durable again first. The value written
    /// differs from the one stored (a count of syncs): SQLite writes nothing, and so syncs
    /// nothing, for a row rewritten as it was.
    pub fn sync(&mut self) -> Result<(), StoreError> {
        self.conn.execute(
            "INSERT INTO meta (key, value) VALUES ('syncs', '1') \
             ON CONFLICT(key) DO UPDATE SET value = CAST(value AS INTEGER) + 1",
            [],
        )?;
        Ok(())
    }

    /// A value kept in the store's own settings table.
    pub fn meta(&self, key: &str) -> Result<Option<String>, StoreError> {
        Ok(self
            .conn
            .query_row("SELECT value FROM meta WHERE key = ?1", [key], |r| r.get(0))
            .optional()?)
    }

    /// Sets a value in the store's own settings table.
    pub fn set_meta(&mut self, key: &str, value: &str) -> Result<(), StoreError> {
        self.conn.execute(
            "INSERT INTO meta (key, value) VALUES (?1, ?2) \
             ON CONFLICT(key) DO UPDATE SET value = excluded.value",
            [key, value],
        )?;
        Ok(())
    }

    /// Inserts a new job; its id is assigned here. With a `client_token` already stored, returns
    /// the existing job's id instead (a retried submit), and `false`.
    pub fn insert_job(
        &mut self,
        record: &mut JobRecord,
        client_token: Option<&str>,
    ) -> Result<bool, StoreError> {
        self.insert_array(std::slice::from_mut(record), client_token)
    }

    /// Inserts the tasks of a job array (or one plain job) in one transaction, all or none.
    /// Their ids are consecutive from the first's, which is the array job's id (set in each record's
    /// `array.job_id`, in `spec.array` too). With a `client_token` already stored, returns the
    /// existing array's id instead, and `false`.
    pub fn insert_array(
        &mut self,
        records: &mut [JobRecord],
        client_token: Option<&str>,
    ) -> Result<bool, StoreError> {
        self.insert_group(&mut [(records, client_token)])?
            .pop()
            .unwrap_or(Ok(true))
    }

    /// Inserts several submits (each a plain job or the tasks of an array, with its client
    /// token) in one transaction, so that one sync makes them all durable. Each is inserted
    /// as [`Store::insert_array`] would: one that fails is rolled back alone and its error
    /// returned in its place; the others are committed. A token seen earlier in the same group
    /// counts as stored. The outer error means the commit itself failed and nothing was
    /// stored.
    pub fn insert_group(
        &mut self,
        submits: &mut [(&mut [JobRecord], Option<&str>)],
    ) -> Result<Vec<Result<bool, StoreError>>, StoreError> {
        if submits.is_empty() {
            // No write lock taken for nothing.
            return Ok(Vec::new());
        }
        // All of them in one go first; a savepoint for each (two more statements per submit)
        // only when one of them failed, to keep the others.
        match self.insert_each(submits, false)? {
            Some(out) => Ok(out),
            None => Ok(self.insert_each(submits, true)?.unwrap_or_default()),
        }
    }

    /// Inserts each submit of a group in one transaction. With `savepoints`, each inside one
    /// of its own: one that fails is rolled back alone (the next takes the ids it would have
    /// had) and its error returned in its place. Without, the first that fails rolls the
    /// whole transaction back, and the answer is `None`, or its error alone when it was the
    /// group's only submit (there is nothing to keep around it).
    fn insert_each(
        &mut self,
        submits: &mut [(&mut [JobRecord], Option<&str>)],
        savepoints: bool,
    ) -> Result<Option<Vec<Result<bool, StoreError>>>, StoreError> {
        let mut tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        let mut ids = NextIds::read(&tx)?;
        let submits_len = submits.len();
        let mut out = Vec::with_capacity(submits_len);
        for (records, token) in submits.iter_mut() {
            if !savepoints {
                match insert_records(&tx, &mut ids, records, *token) {
                    Ok(inserted) => out.push(Ok(inserted)),
                    // Alone in its group: nothing to keep, and trying again with a savepoint
                    // would fail the same way. Rolled back as `tx` is dropped.
                    Err(e) if submits_len == 1 => return Ok(Some(vec![Err(e)])),
                    // Rolled back as `tx` is dropped.
                    Err(_) => return Ok(None),
                }
                continue;
            }
            let sp = tx.savepoint()?;
            let done = insert_records(&sp, &mut ids, records, *token);
            if done.is_ok() {
                sp.commit()?;
            }
            out.push(done);
        }
        tx.commit()?;
        Ok(Some(out))
    }

    /// The active or ended task `task` of array `array_id`, if any: one lookup in the
    /// `jobs_array` index.
    pub fn array_task(&self, array_id: JobId, task: u32) -> Result<Option<JobRecord>, StoreError> {
        let found = self.query(ARRAY_TASK, params![array_id as i64, task as i64])?;
        Ok(found.into_iter().next())
    }

    /// The id and state of every stored task of array `array_id` (none: no such array), in
    /// id order, from the `jobs_array` index.
    pub fn array_states(&self, array_id: JobId) -> Result<Vec<(JobId, JobState)>, StoreError> {
        let mut stmt = self.conn.prepare_cached(ARRAY_STATES)?;
        let rows = stmt.query_map(params![array_id as i64], |r| {
            Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?))
        })?;
        let mut out = Vec::new();
        for row in rows {
            let (id, state) = row?;
            // The column holds `JobState::as_str`; an unknown word counts as ended badly.
            let state = JobState::parse(&state).unwrap_or(JobState::Failed);
            out.push((id as JobId, state));
        }
        Ok(out)
    }

    /// Writes the new state of jobs, all or none.
    pub fn update_jobs<'a>(
        &mut self,
        records: impl IntoIterator<Item = &'a JobRecord>,
    ) -> Result<(), StoreError> {
        self.update_jobs_with_runs(records, &[])
    }

    /// Writes the new state of jobs and the ledger's rows for the runs that ended with them,
    /// all or none, in one transaction (the SQLite ledger lives in this database). A run
    /// stored already is left as it was.
    pub fn update_jobs_with_runs<'a>(
        &mut self,
        records: impl IntoIterator<Item = &'a JobRecord>,
        runs: &[crate::ledger::JobRun],
    ) -> Result<(), StoreError> {
        self.write_jobs(records, runs, false)
    }

    /// Writes the new state of jobs and, in the same transaction, the runs that ended with
    /// them into the outbox (`ledger_outbox`), where they stay until [`Store::clear_outbox`]:
    /// for a ledger kept elsewhere (PostgreSQL), so that a crash between this commit and the
    /// runs reaching that ledger (or its spool) loses none of them.
    pub fn update_jobs_with_outbox<'a>(
        &mut self,
        records: impl IntoIterator<Item = &'a JobRecord>,
        runs: &[crate::ledger::JobRun],
    ) -> Result<(), StoreError> {
        self.write_jobs(records, runs, true)
    }

    /// Runs in the outbox: committed with their jobs, not known to have reached the ledger.
    /// By job id, then run.
    pub fn outbox(&self) -> Result<Vec<crate::ledger::JobRun>, StoreError> {
        let mut stmt = self
            .conn
            .prepare_cached("SELECT data FROM ledger_outbox ORDER BY job_id, run")?;
        let rows = stmt.query_map([], |r| r.get::<_, String>(0))?;
        let mut out = Vec::new();
        for data in rows {
            out.push(serde_json::from_str(&data?)?);
        }
        Ok(out)
    }

    /// Removes these runs (job id, run) from the outbox: the ledger has them.
    pub fn clear_outbox(&mut self, keys: &[(JobId, u32)]) -> Result<(), StoreError> {
        let tx = self.conn.transaction()?;
        {
            let mut stmt =
                tx.prepare_cached("DELETE FROM ledger_outbox WHERE job_id = ?1 AND run = ?2")?;
            for &(id, run) in keys {
                stmt.execute(params![id as i64, run])?;
            }
        }
        tx.commit()?;
        Ok(())
    }

    fn write_jobs<'a>(
        &mut self,
        records: impl IntoIterator<Item = &'a JobRecord>,
        runs: &[crate::ledger::JobRun],
        outbox: bool,
    ) -> Result<(), StoreError> {
        let tx = self.conn.transaction()?;
        if outbox {
            let mut stmt = tx.prepare_cached(
                "INSERT OR REPLACE INTO ledger_outbox (job_id, run, data) VALUES (?1, ?2, ?3)",
            )?;
            for r in runs {
                stmt.execute(params![r.job_id as i64, r.run, serde_json::to_string(r)?])?;
            }
        } else {
            crate::ledger::sqlite::insert_runs(&tx, runs).map_err(StoreError::Ledger)?;
        }
        {
            let mut stmt = tx.prepare_cached(
                "UPDATE jobs SET state = ?1, end_time = ?2, record = ?3 WHERE id = ?4",
            )?;
            for r in records {
                stmt.execute(params![
                    r.state.as_str(),
                    r.end_time.map(|t| t as i64),
                    serde_json::to_string(r)?,
                    r.id as i64
                ])?;
            }
        }
        tx.commit()?;
        Ok(())
    }

    /// All jobs that are not finished, oldest first.
    pub fn active_jobs(&self) -> Result<Vec<JobRecord>, StoreError> {
        self.query(
            &format!("SELECT record FROM jobs WHERE state IN {ACTIVE} ORDER BY id"),
            [],
        )
    }

    /// The job stored with `client_token`, as (id, owner uid).
    pub fn job_by_token(&self, client_token: &str) -> Result<Option<(JobId, u32)>, StoreError> {
        Ok(self
            .conn
            .prepare_cached("SELECT id, uid FROM jobs WHERE client_token = ?1")?
            .query_row([client_token], |r| {
                Ok((r.get::<_, i64>(0)? as JobId, r.get::<_, u32>(1)?))
            })
            .optional()?)
    }

    /// One job by id.
    pub fn job(&self, id: JobId) -> Result<Option<JobRecord>, StoreError> {
        Ok(self
            .query("SELECT record FROM jobs WHERE id = ?1", [id as i64])?
            .pop())
    }

    /// Finished jobs, newest first, at most `limit`, optionally of one user.
    pub fn finished_jobs(
        &self,
        uid: Option<u32>,
        limit: u32,
    ) -> Result<Vec<JobRecord>, StoreError> {
        self.finished_jobs_where(uid, limit, &ListFilter::default())
    }

    /// [`Store::finished_jobs`] that `filter` keeps: filtered before the `limit` most recent
    /// are taken, so an old job named by id is found behind newer ones.
    pub fn finished_jobs_where(
        &self,
        uid: Option<u32>,
        limit: u32,
        filter: &ListFilter,
    ) -> Result<Vec<JobRecord>, StoreError> {
        use rusqlite::types::Value;
        let mut args: Vec<Value> = Vec::new();
        // `?N` for one more argument.
        let mut arg = |v: Value| {
            args.push(v);
            format!("?{}", args.len())
        };
        let mut sql = format!("SELECT record FROM jobs WHERE state NOT IN {ACTIVE}");
        if let Some(u) = uid {
            sql.push_str(&format!(" AND uid = {}", arg(Value::Integer(i64::from(u)))));
        }
        let states: Vec<String> = (filter.states.iter())
            .map(|s| arg(Value::Text(s.as_str().into())))
            .collect();
        if !states.is_empty() {
            sql.push_str(&format!(" AND state IN ({})", states.join(",")));
        }
        let mut users: Vec<String> = Vec::new();
        let uids: Vec<String> = (filter.uids.iter())
            .map(|&u| arg(Value::Integer(u.into())))
            .collect();
        if !uids.is_empty() {
            users.push(format!("uid IN ({})", uids.join(",")));
        }
        let names: Vec<String> = (filter.users.iter())
            .map(|u| arg(Value::Text(u.clone())))
            .collect();
        if !names.is_empty() {
            let user = "json_extract(record, '$.owner.user')";
            users.push(format!("{user} IN ({})", names.join(",")));
        }
        if !users.is_empty() {
            sql.push_str(&format!(" AND ({})", users.join(" OR ")));
        }
        // A job id, an array's id (each of its tasks) or one task of an array. Plain ids go
        // in two IN lists: an OR per id would nest past SQLite's expression depth.
        let (array, task) = (
            "json_extract(record, '$.array.job_id')",
            "json_extract(record, '$.array.task_id')",
        );
        let id_of = |id: u64| Value::Integer(i64::try_from(id).unwrap_or(i64::MAX));
        let plain: Vec<u64> = (filter.jobs.iter())
            .filter(|(_, t)| t.is_none())
            .map(|&(id, _)| id)
            .collect();
        let mut jobs: Vec<String> = Vec::new();
        if !plain.is_empty() {
            let ids: Vec<String> = plain.iter().map(|&id| arg(id_of(id))).collect();
            let arrays: Vec<String> = plain.iter().map(|&id| arg(id_of(id))).collect();
            jobs.push(format!(
                "id IN ({}) OR {array} IN ({})",
                ids.join(","),
                arrays.join(",")
            ));
        }
        for &(id, t) in &filter.jobs {
            if let Some(t) = t {
                let (a, b) = (arg(id_of(id)), arg(Value::Integer(t.into())));
                jobs.push(format!("({array} = {a} AND {task} = {b})"));
            }
        }
        if !jobs.is_empty() {
            sql.push_str(&format!(" AND ({})", jobs.join(" OR ")));
        }
        let parts: Vec<String> = (filter.partitions.iter())
            .map(|p| arg(Value::Text(p.clone())))
            .collect();
        if !parts.is_empty() {
            let default = arg(Value::Text(filter.default_partition.clone()));
            sql.push_str(&format!(
                " AND IFNULL(json_extract(record, '$.spec.partition'), {default}) IN ({})",
                parts.join(",")
            ));
        }
        sql.push_str(&format!(
            " ORDER BY id DESC LIMIT {}",
            arg(Value::Integer(limit.into()))
        ));
        self.query(&sql, rusqlite::params_from_iter(args))
    }

    /// Jobs of `uid` (or every user's) submitted by `until` and not ended before `since`
    /// (ms), or with these ids, oldest first, at most `limit`.
    pub fn jobs_in_window(
        &self,
        uid: Option<u32>,
        ids: Option<&[JobId]>,
        since: u64,
        until: u64,
        limit: u32,
    ) -> Result<Vec<JobRecord>, StoreError> {
        match ids {
            Some(ids) => {
                let mut out = Vec::new();
                for &id in ids {
                    out.extend(self.query(
                        "SELECT record FROM jobs WHERE id = ?1 AND (?2 IS NULL OR uid = ?2) \
                         AND submit_time <= ?3 AND (end_time IS NULL OR end_time >= ?4)",
                        params![id as i64, uid, until as i64, since as i64],
                    )?);
                }
                Ok(out)
            }
            None => self.query(
                "SELECT record FROM jobs WHERE (?1 IS NULL OR uid = ?1) AND submit_time <= ?2 \
                 AND (end_time IS NULL OR end_time >= ?3) ORDER BY id LIMIT ?4",
                params![uid, until as i64, since as i64, limit],
            ),
        }
    }

    /// Ended jobs with ids above `after`, by id, at most `limit` (to page through them all).
    pub fn ended_after(&self, after: JobId, limit: u32) -> Result<Vec<JobRecord>, StoreError> {
        let sql = format!(
            "SELECT record FROM jobs WHERE state NOT IN {ACTIVE} AND id > ?1 ORDER BY id LIMIT ?2"
        );
        self.query(&sql, params![after.min(i64::MAX as u64) as i64, limit])
    }

    /// Ended jobs that ended before `cutoff` (ms), oldest first, at most `limit`.
    pub fn ended_before(&self, cutoff: u64, limit: u32) -> Result<Vec<JobRecord>, StoreError> {
        let sql = format!(
            "SELECT record FROM jobs WHERE state NOT IN {ACTIVE} AND end_time < ?1 \
             ORDER BY end_time, id LIMIT ?2"
        );
        self.query(&sql, params![cutoff as i64, limit])
    }

    /// Deletes these ended jobs' records, in one transaction; active jobs are never deleted.
    pub fn delete_ended(&mut self, ids: &[JobId]) -> Result<usize, StoreError> {
        let tx = self.conn.transaction()?;
        let mut n = 0;
        {
            let sql = format!("DELETE FROM jobs WHERE id = ?1 AND state NOT IN {ACTIVE}");
            let mut stmt = tx.prepare_cached(&sql)?;
            for &id in ids {
                n += stmt.execute([id as i64])?;
            }
        }
        tx.commit()?;
        Ok(n)
    }

    /// Number of jobs in a state.
    #[cfg(test)]
    pub fn count(&self, state: wharf_api::JobState) -> Result<u64, StoreError> {
        Ok(self.conn.query_row(
            "SELECT COUNT(*) FROM jobs WHERE state = ?1",
            [state.as_str()],
            |r| r.get::<_, i64>(0),
        )? as u64)
    }

    /// Records a node's registration.
    pub fn upsert_node(&mut self, info: &NodeInfo, now: u64) -> Result<(), StoreError> {
        self.conn.execute(
            "INSERT INTO nodes (name, info, last_seen) VALUES (?1, ?2, ?3)
             ON CONFLICT(name) DO UPDATE SET info = excluded.info, last_seen = excluded.last_seen",
            params![info.name, serde_json::to_string(info)?, now as i64],
        )?;
        Ok(())
    }

    /// Drains node `name` (replacing an earlier reason), or resumes it when `drain` is
    /// `None`.
    pub fn set_drain(&mut self, name: &str, drain: Option<(&str, u64)>) -> Result<(), StoreError> {
        match drain {
            Some((reason, since)) => self.conn.execute(
                "INSERT INTO node_drains (name, reason, since) VALUES (?1, ?2, ?3)
                 ON CONFLICT(name) DO UPDATE SET reason = excluded.reason, since = excluded.since",
                params![name, reason, since as i64],
            )?,
            None => self
                .conn
                .execute("DELETE FROM node_drains WHERE name = ?1", [name])?,
        };
        Ok(())
    }

    /// Records `hash` as the key of node `name` unless it holds one (see `crate::node_keys`).
    pub fn add_node_key(
        &mut self,
        name: &str,
        hash: &crate::node_keys::KeyHash,
        now: u64,
    ) -> Result<KeyAdded, StoreError> {
        let n = self.conn.execute(
            "INSERT INTO node_keys (name, hash, issued) VALUES (?1, ?2, ?3)
             ON CONFLICT(name) DO NOTHING",
            params![name, &hash[..], now as i64],
        )?;
        if n == 1 {
            return Ok(KeyAdded::New);
        }
        let held: Vec<u8> =
            self.conn
                .query_row("SELECT hash FROM node_keys WHERE name = ?1", [name], |r| {
                    r.get(0)
                })?;
        Ok(if held == hash[..] {
            KeyAdded::Same
        } else {
            KeyAdded::Other
        })
    }

    /// Forgets node `name`'s key; whether it had one.
    pub fn remove_node_key(&mut self, name: &str) -> Result<bool, StoreError> {
        Ok(self
            .conn
            .execute("DELETE FROM node_keys WHERE name = ?1", [name])?
            == 1)
    }

    /// Node `name`'s agent registered with the key it holds now (the first time counts).
    pub fn key_registered(&mut self, name: &str, now: u64) -> Result<(), StoreError> {
        self.conn.execute(
            "UPDATE node_keys SET registered = ?2 WHERE name = ?1 AND registered IS NULL",
            params![name, now as i64],
        )?;
        Ok(())
    }

    /// Every node that holds a key, by name: when it joined, and when its agent first
    /// registered with that key (ms).
    pub fn node_key_list(&self) -> Result<Vec<(String, u64, Option<u64>)>, StoreError> {
        let mut st = self
            .conn
            .prepare("SELECT name, issued, registered FROM node_keys ORDER BY name")?;
        let rows = st.query_map([], |r| {
            let registered: Option<i64> = r.get(2)?;
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, i64>(1)? as u64,
                registered.map(|t| t as u64),
            ))
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// Every node's key hash.
    pub fn node_keys(&self) -> Result<Vec<(String, crate::node_keys::KeyHash)>, StoreError> {
        let mut st = self.conn.prepare("SELECT name, hash FROM node_keys")?;
        let rows = st.query_map([], |r| {
            let name: String = r.get(0)?;
            let hash: Vec<u8> = r.get(1)?;
            Ok((name, hash))
        })?;
        let mut out = Vec::new();
        for row in rows {
            let (name, hash) = row?;
            // A row that is not a SHA-256 (written by hand) matches no key.
            if let Ok(h) = <[u8; 32]>::try_from(hash.as_slice()) {
                out.push((name, h));
            }
        }
        Ok(out)
    }

    /// Every drained node: name, reason and since when.
    pub fn drains(&self) -> Result<Vec<(String, String, u64)>, StoreError> {
        let mut stmt = self
            .conn
            .prepare("SELECT name, reason, since FROM node_drains ORDER BY name")?;
        let rows = stmt.query_map([], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, i64>(2)?,
            ))
        })?;
        let mut out = Vec::new();
        for row in rows {
            let (name, reason, since) = row?;
            out.push((name, reason, since as u64));
        }
        Ok(out)
    }

    /// Every registered node with its last heartbeat.
    pub fn nodes(&self) -> Result<Vec<(NodeInfo, u64)>, StoreError> {
        let mut stmt = self
            .conn
            .prepare("SELECT info, last_seen FROM nodes ORDER BY name")?;
        let rows = stmt.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))?;
        let mut out = Vec::new();
        for row in rows {
            let (info, seen) = row?;
            out.push((serde_json::from_str(&info)?, seen as u64));
        }
        Ok(out)
    }

    fn query<P: rusqlite::Params>(&self, sql: &str, p: P) -> Result<Vec<JobRecord>, StoreError> {
        let mut stmt = self.conn.prepare_cached(sql)?;
        let rows = stmt.query_map(p, |r| r.get::<_, String>(0))?;
        let mut out = Vec::new();
        for row in rows {
            out.push(decode(&row?)?);
        }
        Ok(out)
    }
}

/// A stored job record. One written before gang jobs (a top-level `cpu_ids`, no `allocs`) is
/// brought up to date first ([`wharf_api::alloc::upgrade_record`]); a current one is read
/// straight, so that reading many costs no more than before.
fn decode(text: &str) -> Result<JobRecord, serde_json::Error> {
    if text.contains("\"cpu_ids\":") && !text.contains("\"allocs\":") {
        let mut v: serde_json::Value = serde_json::from_str(text)?;
        wharf_api::alloc::upgrade_record(&mut v);
        return serde_json::from_value(v);
    }
    serde_json::from_str(text)
}

/// The ids the next inserted jobs get, read once per transaction, which holds the write lock
/// from its start (`BEGIN IMMEDIATE`): a job's record holds its own id, so it is written
/// whole once, with the id set. As `AUTOINCREMENT` does, the next id is past both the largest
/// ever given (kept in `sqlite_sequence`, so an id is never given twice, even after its job
/// was removed) and the largest in the table.
struct NextIds(JobId);

impl NextIds {
    fn read(tx: &Connection) -> Result<NextIds, StoreError> {
        let last: i64 = tx
            .prepare_cached(
                "SELECT max(COALESCE((SELECT seq FROM sqlite_sequence WHERE name = 'jobs'), 0), \
                 COALESCE((SELECT max(id) FROM jobs), 0))",
            )?
            .query_row([], |r| r.get(0))?;
        Ok(NextIds(last as JobId + 1))
    }
}

/// Inserts one submit's records (one job, or an array's tasks) with ids from `ids`; with
/// `client_token` already stored, sets the first record's id to that job's and returns
/// `false`.
fn insert_records(
    tx: &Connection,
    ids: &mut NextIds,
    records: &mut [JobRecord],
    client_token: Option<&str>,
) -> Result<bool, StoreError> {
    if let Some(token) = client_token {
        let existing: Option<i64> = tx
            .prepare_cached("SELECT id FROM jobs WHERE client_token = ?1")?
            .query_row([token], |r| r.get(0))
            .optional()?;
        if let Some(id) = existing {
            if let Some(first) = records.first_mut() {
                first.id = id as JobId;
            }
            return Ok(false);
        }
    }
    let base = ids.0;
    let mut insert = tx.prepare_cached(
        "INSERT INTO jobs (id, uid, state, submit_time, client_token, record) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
    )?;
    for (k, r) in records.iter_mut().enumerate() {
        r.id = base + k as JobId;
        if let Some(a) = r.array.as_mut() {
            a.job_id = base;
        }
        if let Some(a) = r.spec.as_mut().and_then(|s| s.array.as_mut()) {
            a.job_id = base;
        }
        // The token is the submit's: kept on its first record, the array's own id.
        insert.execute(params![
            r.id as i64,
            r.owner.uid,
            r.state.as_str(),
            r.submit_time as i64,
            client_token.filter(|_| k == 0),
            serde_json::to_string(&*r)?
        ])?;
    }
    ids.0 = base + records.len() as JobId;
    Ok(true)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use wharf_api::{JobState, Owner, Resources};

    pub(crate) fn record() -> JobRecord {
        let owner = Owner {
            uid: 1000,
            gid: 1000,
            user: "a".into(),
        };
        let resources = Resources {
            cpus: 1,
            memory: 1 << 20,
            gpus: 0,
        };
        JobRecord::pending(owner, "j".into(), resources, 60, 5)
    }

    /// `wharf queue --all -j/-t/-u`: ended jobs are filtered before the most recent are
    /// taken, so an old one is found behind many newer ones (before, the newest were taken
    /// and then filtered, and an old job named by id was not listed).
    #[test]
    fn ended_jobs_are_filtered_before_the_most_recent_are_taken() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = Store::open(&dir.path().join("wharf.db")).unwrap();
        let end = |s: &mut Store, user: &str, state: JobState, array: Option<(u64, u32)>| {
            let mut r = record();
            r.owner.user = user.into();
            s.insert_job(&mut r, None).unwrap();
            r.state = state;
            r.end_time = Some(9);
            r.array = array.map(|(job_id, task_id)| wharf_api::array::ArrayTask {
                job_id: if job_id == 0 { r.id } else { job_id },
                task_id,
                throttle: None,
                shape: Default::default(),
            });
            s.update_jobs([&r]).unwrap();
            r.id
        };
        let old = end(&mut s, "ann", JobState::Timeout, None);
        let array = end(&mut s, "ann", JobState::Failed, Some((0, 0)));
        end(&mut s, "ann", JobState::Completed, Some((array, 1)));
        for _ in 0..20 {
            end(&mut s, "bob", JobState::Completed, None);
        }
        let ids = |f: ListFilter| -> Vec<JobId> {
            let jobs = s.finished_jobs_where(None, 5, &f).unwrap();
            jobs.iter().map(|j| j.id).collect()
        };
        assert!(
            !ids(ListFilter::default()).contains(&old),
            "behind newer ones"
        );
        let by_id = ListFilter {
            jobs: vec![(old, None)],
            ..Default::default()
        };
        assert_eq!(ids(by_id), [old]);
        let by_state = ListFilter {
            states: vec![JobState::Timeout, JobState::Failed],
            ..Default::default()
        };
        assert_eq!(ids(by_state), [array, old]);
        let by_user = ListFilter {
            users: vec!["ann".into()],
            ..Default::default()
        };
        assert_eq!(ids(by_user), [array + 1, array, old]);
        let whole_array = ListFilter {
            jobs: vec![(array, None)],
            ..Default::default()
        };
        assert_eq!(ids(whole_array), [array + 1, array]);
        let one_task = ListFilter {
            jobs: vec![(array, Some(1))],
            users: vec!["ann".into(), "bob".into()],
            ..Default::default()
        };
        assert_eq!(ids(one_task), [array + 1]);
        let nobody = ListFilter {
            users: vec!["ann\u{0}'".into()],
            ..Default::default()
        };
        assert!(ids(nobody).is_empty());
        // By uid, the store's index (every record here is uid 1000's).
        let by_uid = |uid| ListFilter {
            uids: vec![uid],
            ..Default::default()
        };
        assert_eq!(ids(by_uid(1000)).len(), 5);
        assert!(ids(by_uid(1)).is_empty());
        // Many ids at once: lists, not an OR per id (which nests past SQLite's limits).
        let many = ListFilter {
            jobs: (1..=1200).map(|id| (id, None)).collect(),
            ..Default::default()
        };
        assert_eq!(ids(many).len(), 5);
    }

    /// A dependency on an array's task, or a `JOB_TASK` id, is looked up in the index: it
    /// reads no record but the one it names. Before, each lookup parsed every record in up to
    /// `max_array_size` ids, and held jobs with such dependencies repeated them every pass.
    #[test]
    fn an_arrays_tasks_are_found_through_the_index_and_only_they_are_read() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = Store::open(&dir.path().join("wharf.db")).unwrap();
        for (query, args) in [(ARRAY_TASK, 2), (ARRAY_STATES, 1)] {
            let plan: Vec<String> = {
                let mut stmt = s
                    .conn
                    .prepare(&format!("EXPLAIN QUERY PLAN {query}"))
                    .unwrap();
                let binds: Vec<i64> = vec![7; args];
                stmt.query_map(rusqlite::params_from_iter(binds), |r| r.get::<_, String>(3))
                    .unwrap()
                    .map(Result::unwrap)
                    .collect()
            };
            assert!(
                plan.iter().any(|p| p.contains("USING INDEX jobs_array")),
                "{query}: {plan:?}"
            );
        }
        // And it finds them: tasks 0 and 5 of array A among other jobs.
        let mut plain = record();
        s.insert_job(&mut plain, None).unwrap();
        let mut tasks = Vec::new();
        for task_id in [0, 5] {
            let mut t = record();
            t.array = Some(wharf_api::array::ArrayTask {
                job_id: 0,
                task_id,
                throttle: None,
                shape: Default::default(),
            });
            tasks.push(t);
        }
        // One submit: the store numbers the tasks and names the first one's id the array's.
        s.insert_array(&mut tasks, None).unwrap();
        let first = tasks[0].id;
        assert_eq!(tasks[1].array.unwrap().job_id, first);
        assert_eq!(s.array_task(first, 5).unwrap().unwrap().id, first + 1);
        assert!(s.array_task(first, 3).unwrap().is_none());
        assert!(s.array_task(plain.id, 0).unwrap().is_none());
        let ids: Vec<JobId> = s
            .array_states(first)
            .unwrap()
            .into_iter()
            .map(|(id, _)| id)
            .collect();
        assert_eq!(ids, [first, first + 1]);
    }

    #[test]
    fn a_job_stored_before_requeue_existed_loads_requeueable_and_preempted_is_ended() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("wharf.db");
        let mut s = Store::open(&path).unwrap();
        let mut a = record();
        a.spec = Some(
            wharf_api::JobRequest {
                command: Some(vec!["/bin/true".into()]),
                requeue: Some(false),
                ..Default::default()
            }
            .resolve("/", &wharf_api::JobDefaults::default())
            .unwrap(),
        );
        s.insert_job(&mut a, None).unwrap();
        // As an older controller wrote it: no `requeue` in the spec.
        s.conn
            .execute(
                "UPDATE jobs SET record = json_remove(record, '$.spec.requeue') WHERE id = ?1",
                [a.id as i64],
            )
            .unwrap();
        let mut b = record();
        s.insert_job(&mut b, None).unwrap();
        b.state = JobState::Preempted;
        b.end_time = Some(9);
        s.update_jobs([&b]).unwrap();
        drop(s);
        let s = Store::open(&path).unwrap();
        let active = s.active_jobs().unwrap();
        assert_eq!(active.len(), 1);
        assert!(active[0].spec.as_ref().unwrap().requeue);
        assert_eq!(active[0].restarts, 0);
        assert_eq!(
            s.finished_jobs(None, 10).unwrap()[0].state,
            JobState::Preempted
        );
    }

    #[test]
    fn a_running_job_stored_before_gang_jobs_loads_with_its_one_node() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("wharf.db");
        let mut s = Store::open(&path).unwrap();
        let mut a = record();
        s.insert_job(&mut a, None).unwrap();
        // As an older controller wrote a running job: one `node` with its ids.
        s.conn
            .execute(
                "UPDATE jobs SET state = 'RUNNING', record = json_set(record, \
                 '$.state', 'RUNNING', '$.start_time', 5, '$.node', 'n3', \
                 '$.cpu_ids', json('[4,5]'), '$.gpu_ids', json('[2]'), \
                 '$.requeued_from', NULL) WHERE id = ?1",
                [a.id as i64],
            )
            .unwrap();
        drop(s);
        let s = Store::open(&path).unwrap();
        let job = s.job(a.id).unwrap().unwrap();
        assert_eq!(job.state, JobState::Running);
        assert_eq!(job.nodelist(), "n3");
        assert_eq!(
            (&job.allocs[0].cpu_ids[..], &job.allocs[0].gpu_ids[..]),
            (&[4, 5][..], &[2][..])
        );
        assert_eq!(job.allocs[0].start_time, Some(5));
        assert_eq!(s.active_jobs().unwrap(), [job]);
    }

    #[test]
    fn each_sync_writes_a_value_unlike_the_last() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = Store::open(&dir.path().join("wharf.db")).unwrap();
        s.sync().unwrap();
        assert_eq!(s.meta("syncs").unwrap().as_deref(), Some("1"));
        s.sync().unwrap();
        assert_eq!(s.meta("syncs").unwrap().as_deref(), Some("2"));
    }

    /// A group is stored in one go; when one of its submits fails, the others are stored
    /// all the same, and ids carry on past the largest ever given, a deleted job's too.
    #[test]
    fn a_group_keeps_its_good_submits_around_a_failed_one_and_never_gives_an_id_twice() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = Store::open(&dir.path().join("wharf.db")).unwrap();
        let (mut a, mut b) = (record(), record());
        s.insert_job(&mut a, None).unwrap();
        s.insert_job(&mut b, None).unwrap();
        b.state = JobState::Completed;
        b.end_time = Some(9);
        s.update_jobs([&b]).unwrap();
        assert_eq!(s.delete_ended(&[b.id]).unwrap(), 1);
        // A real failure from the database, for one record only.
        s.conn
            .execute_batch(
                "CREATE TRIGGER refuse BEFORE INSERT ON jobs \
                 WHEN NEW.record LIKE '%\"name\":\"bad\"%' \
                 BEGIN SELECT RAISE(ABORT, 'refused'); END;",
            )
            .unwrap();
        let mut good = [record()];
        let mut bad = [record()];
        bad[0].name = "bad".into();
        let mut array: Vec<JobRecord> = (0..3)
            .map(|task| {
                let mut r = record();
                r.array = Some(wharf_api::array::ArrayTask {
                    job_id: 0,
                    task_id: task,
                    throttle: None,
                    shape: Default::default(),
                });
                r
            })
            .collect();
        let answers = s
            .insert_group(&mut [
                (&mut good, Some("g")),
                (&mut bad, Some("b")),
                (array.as_mut_slice(), Some("a")),
                (&mut [], None),
            ])
            .unwrap();
        assert!(matches!(answers[0], Ok(true)), "{:?}", answers[0]);
        assert!(answers[1].is_err(), "{:?}", answers[1]);
        assert!(matches!(answers[2], Ok(true)), "{:?}", answers[2]);
        assert!(matches!(answers[3], Ok(true)), "{:?}", answers[3]);
        // b's id is not given again.
        assert_eq!(good[0].id, b.id + 1);
        let ids: Vec<JobId> = array.iter().map(|r| r.id).collect();
        assert_eq!(ids, [b.id + 2, b.id + 3, b.id + 4]);
        for r in good.iter().chain(&array) {
            let stored = s.job(r.id).unwrap().expect("stored");
            assert_eq!(stored.id, r.id, "the record holds its row's id");
            assert_eq!(
                stored.array.map(|t| t.job_id),
                r.array.as_ref().map(|_| b.id + 2)
            );
        }
        assert_eq!(s.job_by_token("g").unwrap(), Some((good[0].id, 1000)));
        assert_eq!(s.job_by_token("a").unwrap(), Some((b.id + 2, 1000)));
        assert_eq!(s.job_by_token("b").unwrap(), None);
        assert_eq!(s.active_jobs().unwrap().len(), 5);
        // Alone in its group, a failing submit is answered with its error (tried once, with
        // nothing to keep around it) and takes no id.
        let mut alone = [record()];
        alone[0].name = "bad".into();
        let answers = s
            .insert_each(&mut [(&mut alone, Some("b2"))], false)
            .unwrap();
        assert!(matches!(answers.as_deref(), Some([Err(_)])), "{answers:?}");
        assert_eq!(s.job_by_token("b2").unwrap(), None);
        assert_eq!(s.active_jobs().unwrap().len(), 5);
        // Without the counter (a database restored in part, say), ids go on past the
        // table's largest.
        s.conn.execute_batch("DELETE FROM sqlite_sequence").unwrap();
        let mut c = record();
        s.insert_job(&mut c, None).unwrap();
        assert_eq!(c.id, b.id + 5);
    }

    #[test]
    fn jobs_survive_reopen_and_tokens_dedupe() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("wharf.db");
        let mut s = Store::open(&path).unwrap();
        let mut a = record();
        assert!(s.insert_job(&mut a, Some("tok")).unwrap());
        let mut again = record();
        assert!(!s.insert_job(&mut again, Some("tok")).unwrap());
        assert_eq!(again.id, a.id);
        let mut b = record();
        s.insert_job(&mut b, None).unwrap();
        b.state = JobState::Completed;
        b.end_time = Some(9);
        s.update_jobs([&b]).unwrap();
        drop(s);
        let s = Store::open(&path).unwrap();
        assert_eq!(s.active_jobs().unwrap().len(), 1);
        assert_eq!(s.finished_jobs(Some(1000), 10).unwrap()[0].id, b.id);
        assert_eq!(s.job(a.id).unwrap().unwrap().state, JobState::Pending);
        assert_eq!(s.count(JobState::Completed).unwrap(), 1);
    }
}
