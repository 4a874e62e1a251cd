//! The SQLite ledger: the `ledger_runs` table in the controller's own database. The
//! controller writes runs through the state store's transaction
//! ([`crate::store::Store::update_jobs_with_runs`], with [`insert_runs`]); this type reads
//! them (and writes, for imports and tests) through a connection of its own (WAL lets it
//! read while the store writes).

use std::path::Path;

use rusqlite::{params, Connection, ToSql};
use wharf_api::JobId;

use super::schema::{self, Dialect, Value};
use super::{JobRun, Ledger, LedgerError, RunFilter, UsageGroup};

impl ToSql for Value {
    fn to_sql(&self) -> rusqlite::Result<rusqlite::types::ToSqlOutput<'_>> {
        match self {
            Value::Int(v) => v.to_sql(),
            Value::Real(v) => v.to_sql(),
            Value::Text(v) => v.to_sql(),
        }
    }
}

/// Applies the schema steps this database has not had yet, each in its own transaction.
pub fn migrate(conn: &Connection) -> Result<(), rusqlite::Error> {
    conn.execute_batch(schema::VERSION_TABLE)?;
    for m in schema::MIGRATIONS {
        let done: bool = conn.query_row(
            "SELECT EXISTS (SELECT 1 FROM ledger_version WHERE version = ?1)",
            [m.version],
            |r| r.get(0),
        )?;
        if !done {
            conn.execute_batch(&format!(
                "BEGIN IMMEDIATE; {} INSERT INTO ledger_version VALUES ({}); COMMIT;",
                m.sqlite, m.version
            ))
            .inspect_err(|_| {
                let _ = conn.execute_batch("ROLLBACK");
            })?;
        }
    }
    Ok(())
}

/// Inserts `runs` through `conn` (inside the caller's transaction); runs already stored are
/// skipped.
pub fn insert_runs(conn: &Connection, runs: &[JobRun]) -> Result<(), LedgerError> {
    let mut stmt = conn.prepare_cached(&schema::insert_sql(Dialect::Sqlite))?;
    for run in runs {
        let values = schema::insert_values(run)?;
        stmt.execute(rusqlite::params_from_iter(values.iter()))?;
    }
    Ok(())
}

/// The ledger in an SQLite database.
#[derive(Debug)]
pub struct SqliteLedger {
    conn: Connection,
}

impl SqliteLedger {
    /// Opens the ledger in the database at `path` (the controller's state database),
    /// applying the schema; the file is made (or kept) 0600 like the store's.
    pub fn open(path: &Path) -> Result<SqliteLedger, LedgerError> {
        crate::private::file(path, &["-wal", "-shm", "-journal"])
            .map_err(|e| LedgerError::Database(format!("{}: {e}", path.display())))?;
        let conn = Connection::open(path)?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "FULL")?;
        conn.busy_timeout(std::time::Duration::from_secs(5))?;
        migrate(&conn)?;
        Ok(SqliteLedger { conn })
    }

    fn runs<P: rusqlite::Params>(&self, sql: &str, p: P) -> Result<Vec<JobRun>, LedgerError> {
        let mut stmt = self.conn.prepare_cached(sql)?;
        let rows = stmt.query_map(p, |r| r.get::<_, String>(0))?;
        let mut out = Vec::new();
        for row in rows {
            out.push(serde_json::from_str(&row?)?);
        }
        Ok(out)
    }
}

impl Ledger for SqliteLedger {
    fn record(&mut self, runs: &[JobRun]) -> Result<(), LedgerError> {
        let tx = self.conn.transaction()?;
        insert_runs(&tx, runs)?;
        tx.commit()?;
        Ok(())
    }

    fn lookup(&self, id: JobId) -> Result<Vec<JobRun>, LedgerError> {
        self.runs(
            &schema::lookup_sql(Dialect::Sqlite),
            [id.min(i64::MAX as u64) as i64],
        )
    }

    fn query(&self, filter: &RunFilter) -> Result<Vec<JobRun>, LedgerError> {
        let (sql, values) = schema::query_sql(Dialect::Sqlite, filter);
        self.runs(&sql, rusqlite::params_from_iter(values.iter()))
    }

    fn report(
        &self,
        since: u64,
        until: u64,
        uid: Option<u32>,
    ) -> Result<Vec<UsageGroup>, LedgerError> {
        let (sql, values) = schema::report_sql(Dialect::Sqlite, since, until, uid);
        let mut stmt = self.conn.prepare_cached(&sql)?;
        let rows = stmt.query_map(rusqlite::params_from_iter(values.iter()), |r| {
            Ok(UsageGroup {
                account: r.get(0)?,
                user: r.get(1)?,
                partition: r.get(2)?,
                runs: schema::to_u64(r.get(3)?),
                cpu_ms: schema::to_u64(r.get(4)?),
                gpu_ms: schema::to_u64(r.get(5)?),
                billing: r.get(6)?,
            })
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    fn ended_before(&self, cutoff: u64, limit: u32) -> Result<Vec<JobRun>, LedgerError> {
        self.runs(
            &schema::ended_before_sql(Dialect::Sqlite),
            params![cutoff.min(i64::MAX as u64) as i64, limit],
        )
    }

    fn last_ended(&self, limit: u32) -> Result<Vec<JobRun>, LedgerError> {
        self.runs(&schema::last_ended_sql(Dialect::Sqlite), params![limit])
    }

    fn delete(&mut self, keys: &[(JobId, u32)]) -> Result<usize, LedgerError> {
        let tx = self.conn.transaction()?;
        let mut n = 0;
        {
            let mut stmt = tx.prepare_cached(&schema::delete_sql(Dialect::Sqlite))?;
            for &(id, run) in keys {
                n += stmt.execute(params![id.min(i64::MAX as u64) as i64, run])?;
            }
        }
        tx.commit()?;
        Ok(n)
    }
}
