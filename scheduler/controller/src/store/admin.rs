//! The store's side of `wharf admin`: associations changed at run time and their audit.
//!
//! `associations` holds one row per object an admin has changed, its whole definition as JSON,
//! or NULL for one removed (so a removal of an object the config file defines survives a
//! restart). `admin_audit` holds every change; a change and its audit row are written in one
//! transaction. Both tables are created when missing, so a database made by an older version
//! gains them on open and keeps its jobs and nodes.

use rusqlite::params;
use wharf_api::admin::{AdminKind, AuditEntry};

use super::{Store, StoreError};

pub(super) const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS associations (
    kind   TEXT NOT NULL,
    key    TEXT NOT NULL,
    record TEXT,
    PRIMARY KEY (kind, key)
);
CREATE TABLE IF NOT EXISTS admin_audit (
    id      INTEGER PRIMARY KEY AUTOINCREMENT,
    time    INTEGER NOT NULL,
    uid     INTEGER NOT NULL,
    user    TEXT    NOT NULL,
    command TEXT    NOT NULL,
    kind    TEXT    NOT NULL,
    name    TEXT    NOT NULL,
    old     TEXT,
    new     TEXT
);
CREATE INDEX IF NOT EXISTS admin_audit_time ON admin_audit(time);
";

/// One stored association row: its kind, key and definition (`None`: removed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AssocRow {
    /// Kind of object.
    pub kind: AdminKind,
    /// Name (`USER@ACCOUNT` for a user association).
    pub key: String,
    /// The definition as JSON, or `None` for an object removed.
    pub record: Option<String>,
}

fn kind_of(text: &str) -> Result<AdminKind, StoreError> {
    Ok(serde_json::from_value(serde_json::Value::String(
        text.to_string(),
    ))?)
}

impl Store {
    /// Every stored association row.
    pub fn association_rows(&self) -> Result<Vec<AssocRow>, StoreError> {
        let mut stmt = self
            .conn
            .prepare("SELECT kind, key, record FROM associations ORDER BY rowid")?;
        let rows = stmt.query_map([], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, Option<String>>(2)?,
            ))
        })?;
        let mut out = Vec::new();
        for row in rows {
            let (kind, key, record) = row?;
            out.push(AssocRow {
                kind: kind_of(&kind)?,
                key,
                record,
            });
        }
        Ok(out)
    }

    /// Stores the new definitions of `rows` (an add or modify; `None`: a removal) and `audit`,
    /// in one transaction; `rows` is empty for an audited change that is no association (a
    /// node drained or resumed). Returns the audit entry's id.
    pub fn change_associations(
        &mut self,
        rows: &[AssocRow],
        audit: &AuditEntry,
    ) -> Result<u64, StoreError> {
        let tx = self.conn.transaction()?;
        for row in rows {
            tx.execute(
                "INSERT INTO associations (kind, key, record) VALUES (?1, ?2, ?3)
                 ON CONFLICT(kind, key) DO UPDATE SET record = excluded.record",
                params![row.kind.as_str(), row.key, row.record],
            )?;
        }
        let json = |v: &Option<serde_json::Value>| v.as_ref().map(|v| v.to_string());
        tx.execute(
            "INSERT INTO admin_audit (time, uid, user, command, kind, name, old, new)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
            params![
                audit.time as i64,
                audit.uid,
                audit.user,
                audit.command,
                audit.kind.as_str(),
                audit.name,
                json(&audit.old),
                json(&audit.new)
            ],
        )?;
        let id = tx.last_insert_rowid() as u64;
        tx.commit()?;
        Ok(id)
    }

    /// Audited changes made at or after `since` (ms since the epoch), oldest first, at most
    /// `limit` (the newest ones when there are more).
    pub fn audit(&self, since: u64, limit: u32) -> Result<Vec<AuditEntry>, StoreError> {
        let mut stmt = self.conn.prepare(
            "SELECT id, time, uid, user, command, kind, name, old, new FROM admin_audit
             WHERE time >= ?1 ORDER BY id DESC LIMIT ?2",
        )?;
        let rows = stmt.query_map(params![since as i64, limit], |r| {
            Ok((
                r.get::<_, i64>(0)?,
                r.get::<_, i64>(1)?,
                r.get::<_, u32>(2)?,
                r.get::<_, String>(3)?,
                r.get::<_, String>(4)?,
                r.get::<_, String>(5)?,
                r.get::<_, String>(6)?,
                r.get::<_, Option<String>>(7)?,
                r.get::<_, Option<String>>(8)?,
            ))
        })?;
        let mut out = Vec::new();
        for row in rows {
            let (id, time, uid, user, command, kind, name, old, new) = row?;
            let parse = |t: Option<String>| -> Result<Option<serde_json::Value>, StoreError> {
                Ok(t.map(|t| serde_json::from_str(&t)).transpose()?)
            };
            out.push(AuditEntry {
                id: id as u64,
                time: time as u64,
                uid,
                user,
                command,
                kind: kind_of(&kind)?,
                name,
                old: parse(old)?,
                new: parse(new)?,
            });
        }
        out.reverse();
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rusqlite::Connection;

    fn entry(name: &str, time: u64) -> AuditEntry {
        AuditEntry {
            id: 0,
            time,
            uid: 0,
            user: "root".into(),
            command: format!("account add {name}"),
            kind: AdminKind::Account,
            name: name.into(),
            old: None,
            new: Some(serde_json::json!({ "name": name, "shares": 1 })),
        }
    }

    #[test]
    fn a_database_of_the_older_schema_gains_the_tables_and_keeps_its_jobs() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("wharf.db");
        {
            // The schema before associations existed, with one job in it.
            let conn = Connection::open(&path).unwrap();
            conn.execute_batch(
                "CREATE TABLE jobs (id INTEGER PRIMARY KEY AUTOINCREMENT, uid INTEGER NOT NULL,
                   state TEXT NOT NULL, submit_time INTEGER NOT NULL, end_time INTEGER,
                   client_token TEXT UNIQUE, record TEXT NOT NULL);
                 CREATE TABLE nodes (name TEXT PRIMARY KEY, info TEXT NOT NULL,
                   last_seen INTEGER NOT NULL);",
            )
            .unwrap();
            let job = serde_json::to_string(&super::super::tests::record()).unwrap();
            conn.execute(
                "INSERT INTO jobs (uid, state, submit_time, record) VALUES (1000, 'PENDING', 5, ?1)",
                [job],
            )
            .unwrap();
        }
        let mut s = Store::open(&path).unwrap();
        assert_eq!(s.active_jobs().unwrap().len(), 1);
        assert!(s.association_rows().unwrap().is_empty());
        let row = AssocRow {
            kind: AdminKind::Account,
            key: "lab".into(),
            record: Some(r#"{"name":"lab","shares":1}"#.into()),
        };
        s.change_associations(std::slice::from_ref(&row), &entry("lab", 10))
            .unwrap();
        assert_eq!(s.audit(0, 10).unwrap().len(), 1);
    }

    #[test]
    fn changes_and_removals_survive_reopen_with_their_audit_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("wharf.db");
        let mut s = Store::open(&path).unwrap();
        let row = |record: Option<&str>| AssocRow {
            kind: AdminKind::Qos,
            key: "gold".into(),
            record: record.map(String::from),
        };
        s.change_associations(&[row(Some(r#"{"name":"gold"}"#))], &entry("a", 10))
            .unwrap();
        s.change_associations(&[row(None)], &entry("b", 20))
            .unwrap();
        drop(s);
        let s = Store::open(&path).unwrap();
        assert_eq!(s.association_rows().unwrap(), vec![row(None)]);
        let all = s.audit(0, 10).unwrap();
        assert_eq!(
            all.iter().map(|e| e.name.as_str()).collect::<Vec<_>>(),
            ["a", "b"]
        );
        assert_eq!(
            all[0].new,
            Some(serde_json::json!({"name": "a", "shares": 1}))
        );
        assert_eq!(s.audit(15, 10).unwrap().len(), 1, "since filters by time");
        assert_eq!(
            s.audit(0, 1).unwrap()[0].name,
            "b",
            "a limit keeps the newest"
        );
    }
}
