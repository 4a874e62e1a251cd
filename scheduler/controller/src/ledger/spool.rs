//! The local spool of runs the PostgreSQL ledger could not write: one JSON line per run,
//! appended and fsync'd before `record` returns, in a file only root may read (0600, in the
//! 0700 state directory). The replayer reads it from the start, inserts what it read, and
//! only after that commit cuts those lines off the front (writing the rest to a new file
//! renamed over it), so a crash at any point leaves each run in the spool, in the database,
//! or in both, and the idempotent key makes both count once.

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use super::{JobRun, LedgerError};

/// The spool file.
#[derive(Debug)]
pub struct Spool {
    path: PathBuf,
}

impl Spool {
    /// The spool at `path` (not created until a run is appended).
    pub fn new(path: PathBuf) -> Spool {
        Spool { path }
    }

    /// Its path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn err(&self, e: std::io::Error) -> LedgerError {
        LedgerError::Spool(self.path.display().to_string(), e)
    }

    /// True when runs wait in it.
    pub fn has_runs(&self) -> bool {
        std::fs::metadata(&self.path).is_ok_and(|m| m.len() > 0)
    }

    /// Appends `runs`, one line each, and syncs the file (and, when it was just created, its
    /// directory) before returning. Errors: `Spool`.
    pub fn append(&self, runs: &[JobRun]) -> Result<(), LedgerError> {
        let lines = runs
            .iter()
            .map(serde_json::to_vec)
            .collect::<Result<Vec<_>, _>>()?;
        self.append_lines(&lines)
    }

    /// Appends these JSON texts, one line each, and syncs as [`Spool::append`] does.
    fn append_lines(&self, texts: &[Vec<u8>]) -> Result<(), LedgerError> {
        let mut lines = Vec::new();
        for t in texts {
            lines.extend_from_slice(t);
            lines.push(b'\n');
        }
        let existed = self.path.exists();
        let mut f = OpenOptions::new()
            .append(true)
            .create(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&self.path)
            .map_err(|e| self.err(e))?;
        f.write_all(&lines).map_err(|e| self.err(e))?;
        f.sync_all().map_err(|e| self.err(e))?;
        if !existed {
            self.sync_dir()?;
        }
        Ok(())
    }

    /// Every run in it, oldest first. A last line cut short by a crash mid-append (no
    /// newline) is left out: its append never returned. Errors: `Spool`, `Corrupt`.
    pub fn read(&self) -> Result<Vec<JobRun>, LedgerError> {
        let f = match File::open(&self.path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(self.err(e)),
        };
        let mut out = Vec::new();
        for line in BufReader::new(f).split(b'\n') {
            let line = line.map_err(|e| self.err(e))?;
            if line.is_empty() {
                continue;
            }
            match serde_json::from_slice(&line) {
                Ok(run) => out.push(run),
                Err(e) if e.is_eof() => break,
                Err(e) => return Err(e.into()),
            }
        }
        Ok(out)
    }

    /// Removes the first `n` runs (those a replay committed), keeping any appended since.
    /// Errors: `Spool`, `Corrupt`.
    pub fn drop_first(&self, n: usize) -> Result<(), LedgerError> {
        let runs = self.read()?;
        let rest = runs.get(n..).unwrap_or_default();
        if rest.is_empty() {
            match std::fs::remove_file(&self.path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(self.err(e)),
            }
        } else {
            let tmp = self.path.with_extension("tmp");
            let _ = std::fs::remove_file(&tmp);
            let next = Spool::new(tmp.clone());
            next.append(rest)?;
            std::fs::rename(&tmp, &self.path).map_err(|e| self.err(e))?;
        }
        self.sync_dir()
    }

    fn sync_dir(&self) -> Result<(), LedgerError> {
        let dir = self.path.parent().unwrap_or(Path::new("."));
        File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| self.err(e))
    }
}

/// Runs the database refused for good (a constraint or encoding error, not a lost
/// connection), set aside so that they do not hold up the runs behind them: one JSON line
/// each, `{"time": ms, "error": "...", "run": {...}}`, appended and synced, in a file only
/// root may read (0600). An admin fixes and re-inserts them by hand, or drops them.
#[derive(Debug)]
pub struct DeadLetters {
    file: Spool,
}

/// One line of [`DeadLetters`].
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct DeadLetter {
    /// When it was set aside, ms since the epoch.
    pub time: u64,
    /// What the database said.
    pub error: String,
    /// The run.
    pub run: JobRun,
}

impl DeadLetters {
    /// The dead letters at `path` (not created until a run is set aside).
    pub fn new(path: PathBuf) -> DeadLetters {
        DeadLetters {
            file: Spool::new(path),
        }
    }

    /// Its path.
    pub fn path(&self) -> &Path {
        self.file.path()
    }

    /// Sets `run` aside with the database's `error`. Errors: `Spool`.
    pub fn append(&self, run: &JobRun, error: &str, time: u64) -> Result<(), LedgerError> {
        let letter = DeadLetter {
            time,
            error: error.to_string(),
            run: run.clone(),
        };
        self.file.append_lines(&[serde_json::to_vec(&letter)?])
    }

    /// How many runs are set aside. Errors: `Spool`.
    pub fn count(&self) -> Result<usize, LedgerError> {
        match std::fs::read(self.path()) {
            Ok(bytes) => Ok(bytes.iter().filter(|&&b| b == b'\n').count()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(0),
            Err(e) => Err(self.file.err(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::conformance::run;
    use std::os::unix::fs::PermissionsExt;

    fn ids(s: &Spool) -> Vec<u64> {
        s.read().unwrap().iter().map(|r| r.job_id).collect()
    }

    #[test]
    fn appended_runs_read_back_in_order_and_a_replayed_head_is_cut_off() {
        let dir = tempfile::tempdir().unwrap();
        let s = Spool::new(dir.path().join("ledger.spool"));
        assert!(!s.has_runs());
        assert!(s.read().unwrap().is_empty());
        let r = |id| run(id, 0, "a", "p", "cpu", Some(0), 10, 1, 0, "COMPLETED");
        s.append(&[r(1), r(2)]).unwrap();
        s.append(&[r(3)]).unwrap();
        assert!(s.has_runs());
        assert_eq!(ids(&s), [1, 2, 3]);
        let mode = std::fs::metadata(s.path()).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        // A replay committed the first two while a third was appended: only it stays.
        s.drop_first(2).unwrap();
        assert_eq!(ids(&s), [3]);
        // A crash cut the last append short: the whole lines before it still read.
        let mut torn = std::fs::read(s.path()).unwrap();
        torn.extend_from_slice(br#"{"job_id":4,"run"#);
        std::fs::write(s.path(), torn).unwrap();
        assert_eq!(ids(&s), [3]);
        s.drop_first(1).unwrap();
        assert!(!s.path().exists());
    }
}
