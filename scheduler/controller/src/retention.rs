//! Retention of job records: records of jobs that ended longer ago than `[accounting] keep`
//! are moved out of the database, first appended to a compressed archive of JSON lines
//! (`jobs-YYYY-MM.jsonl.zst`, one zstd frame per batch, mode 0600 in a 0700 directory) and
//! synced, then deleted in one transaction. The ledger's runs go the same way, to
//! `runs-YYYY-MM.jsonl.zst`. A crash between the two leaves a record in both, never in
//! neither: readers of the archive keep the last line of each job id (and run).

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::ledger::{Ledger, LedgerError};
use crate::store::{Store, StoreError};

/// Records moved per batch.
const BATCH: u32 = 10_000;

/// How long ended jobs' records stay in the database, and where they go after.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Retention {
    /// Records of jobs that ended longer ago than this are moved out.
    pub keep: Duration,
    /// Where they are archived; `None`: they are only deleted.
    pub archive_dir: Option<PathBuf>,
}

/// Why moving records out failed.
#[derive(Debug, thiserror::Error)]
pub enum RetentionError {
    /// The database.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The ledger.
    #[error(transparent)]
    Ledger(#[from] LedgerError),
    /// The archive.
    #[error("archive {0}: {1}")]
    Archive(String, std::io::Error),
}

/// Moves out every record of a job, and every ledger run, that ended before `now - keep`;
/// returns how many job records.
pub fn purge(
    store: &mut Store,
    ledger: &mut dyn Ledger,
    r: &Retention,
    now: u64,
) -> Result<usize, RetentionError> {
    let cutoff = now.saturating_sub(r.keep.as_millis().min(u64::MAX as u128) as u64);
    loop {
        let runs = ledger.ended_before(cutoff, BATCH)?;
        if runs.is_empty() {
            break;
        }
        if let Some(dir) = &r.archive_dir {
            let path = dir.join(format!("runs-{}.jsonl.zst", month(now)));
            append(dir, &path, &runs)
                .map_err(|e| RetentionError::Archive(path.display().to_string(), e))?;
        }
        let keys: Vec<_> = runs.iter().map(|j| (j.job_id, j.run)).collect();
        ledger.delete(&keys)?;
        if runs.len() < BATCH as usize {
            break;
        }
    }
    let mut moved = 0;
    loop {
        let batch = store.ended_before(cutoff, BATCH)?;
        if batch.is_empty() {
            return Ok(moved);
        }
        if let Some(dir) = &r.archive_dir {
            let path = dir.join(format!("jobs-{}.jsonl.zst", month(now)));
            append(dir, &path, &batch)
                .map_err(|e| RetentionError::Archive(path.display().to_string(), e))?;
        }
        let ids: Vec<_> = batch.iter().map(|j| j.id).collect();
        moved += store.delete_ended(&ids)?;
        if batch.len() < BATCH as usize {
            return Ok(moved);
        }
    }
}

/// Appends one zstd frame of the records, one JSON object per line, and syncs it.
fn append<T: serde::Serialize>(dir: &Path, path: &Path, jobs: &[T]) -> std::io::Result<()> {
    crate::private::dir(dir, 0o700)?;
    let mut lines = Vec::new();
    for j in jobs {
        serde_json::to_writer(&mut lines, j)?;
        lines.push(b'\n');
    }
    let frame = zstd::encode_all(lines.as_slice(), 3)?;
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)?;
    f.write_all(&frame)?;
    f.sync_all()
}

/// `YYYY-MM` of a time in ms since the epoch (UTC).
fn month(ms: u64) -> String {
    let (y, m, _) = wharf_api::forms::civil_from_days((ms / 86_400_000) as i64);
    format!("{y:04}-{m:02}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use wharf_api::{JobRecord, JobState};

    const DAY: u64 = 86_400_000;

    fn read_archive(path: &Path) -> Vec<JobRecord> {
        let bytes = std::fs::read(path).unwrap();
        let text = zstd::decode_all(bytes.as_slice()).unwrap();
        String::from_utf8(text)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    #[test]
    fn old_ended_records_move_to_the_archive_and_nothing_else_does() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = Store::open(&dir.path().join("wharf.db")).unwrap();
        let mut ledger = crate::ledger::sqlite::SqliteLedger::open(store.path()).unwrap();
        let now = 20_400 * DAY; // 2025-11-08
        let mut ids = Vec::new();
        for (state, ended) in [
            (JobState::Completed, Some(now - 400 * DAY)),
            (JobState::Failed, Some(now - 366 * DAY)),
            (JobState::Completed, Some(now - 10 * DAY)),
            (JobState::Running, None),
        ] {
            let mut j = crate::store::tests::record();
            store.insert_job(&mut j, None).unwrap();
            j.state = state;
            j.end_time = ended;
            let run = ended.map(|end| {
                let mut r = crate::ledger::conformance::run(
                    j.id,
                    0,
                    "a",
                    "p",
                    "cpu",
                    None,
                    0,
                    1,
                    0,
                    state.as_str(),
                );
                r.end_time = end;
                r
            });
            store.update_jobs_with_runs([&j], run.as_slice()).unwrap();
            ids.push(j.id);
        }
        let archive = dir.path().join("archive");
        let r = Retention {
            keep: Duration::from_secs(365 * 86_400),
            archive_dir: Some(archive.clone()),
        };
        assert_eq!(purge(&mut store, &mut ledger, &r, now).unwrap(), 2);
        assert!(store.job(ids[0]).unwrap().is_none());
        assert!(store.job(ids[1]).unwrap().is_none());
        assert!(
            store.job(ids[2]).unwrap().is_some(),
            "a recent record stays"
        );
        assert!(store.job(ids[3]).unwrap().is_some(), "an active job stays");
        let file = archive.join("jobs-2025-11.jsonl.zst");
        let kept: Vec<u64> = read_archive(&file).iter().map(|j| j.id).collect();
        assert_eq!(kept, [ids[0], ids[1]]);
        let runs = std::fs::read(archive.join("runs-2025-11.jsonl.zst")).unwrap();
        let runs = String::from_utf8(zstd::decode_all(runs.as_slice()).unwrap()).unwrap();
        let runs: Vec<u64> = runs
            .lines()
            .map(|l| {
                serde_json::from_str::<crate::ledger::JobRun>(l)
                    .unwrap()
                    .job_id
            })
            .collect();
        assert_eq!(runs, [ids[0], ids[1]], "the ledger's runs move with them");
        let left = ledger.query(&Default::default()).unwrap();
        assert_eq!(left.iter().map(|r| r.job_id).collect::<Vec<_>>(), [ids[2]]);
        use std::os::unix::fs::PermissionsExt;
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!((mode(&archive), mode(&file)), (0o700, 0o600));
        // A later purge appends a frame; the file stays one readable stream.
        assert_eq!(
            purge(&mut store, &mut ledger, &r, now + 360 * DAY).unwrap(),
            1
        );
        let file = archive.join("jobs-2026-11.jsonl.zst");
        assert_eq!(read_archive(&file).len(), 1);
        assert_eq!(
            purge(&mut store, &mut ledger, &r, now + 360 * DAY).unwrap(),
            0
        );
    }

    #[test]
    fn months_are_named_in_utc() {
        assert_eq!(month(0), "1970-01");
        assert_eq!(month(1_795_701_600_000), "2026-11");
        assert_eq!(month(1_709_164_800_000), "2024-02"); // 2024-02-29
    }
}
