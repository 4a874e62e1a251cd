//! Users' registry credentials, one file per job, apart from the job records.
//!
//! A submit may carry its user's credential for the registry the job's image names
//! ([`RegistryCredential`]). It is never part of the job's record, so no listing, `show`,
//! `--json`, ledger row or archive can hold it: it is written to
//! `state_dir/registry-auth/<job id>` (the directory 0700, the file 0600, both root's, as the
//! controller is), read when a launch order for the job is made, and deleted as soon as the job
//! is committed in an end state (whichever: completed, failed, cancelled while pending,
//! timed out, lost with its node). At start, files of jobs that are no longer active are
//! deleted too (a crash between a job's end and the deletion).

use std::fs::{self, OpenOptions, Permissions};
use std::io::{self, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use wharf_api::wire::RegistryCredential;
use wharf_api::JobId;

/// The directory of job credentials under the controller's state directory.
pub const DIR: &str = "registry-auth";

/// The credentials of active jobs, on disk.
#[derive(Debug, Clone)]
pub struct JobCredentials {
    dir: PathBuf,
}

impl JobCredentials {
    /// Opens (creating) `state_dir/registry-auth`, making it 0700 whatever it was.
    pub fn open(state_dir: &Path) -> io::Result<JobCredentials> {
        let dir = state_dir.join(DIR);
        crate::private::dir(&dir, 0o700)?;
        Ok(JobCredentials { dir })
    }

    /// The file of job `id`.
    pub fn path(&self, id: JobId) -> PathBuf {
        self.dir.join(id.to_string())
    }

    /// Stores job `id`'s credential: written to a fresh 0600 file, then renamed over any
    /// earlier one, so a reader sees a whole credential or none. Not synced: an array of a
    /// thousand tasks would cost a thousand syncs in the submit's commit, and a credential
    /// lost to a crash only makes the job's pull fail with the registry's refusal.
    pub fn put(&self, id: JobId, cred: &RegistryCredential) -> io::Result<()> {
        let tmp = self.dir.join(format!(".{id}.tmp"));
        let _ = fs::remove_file(&tmp);
        let bytes = serde_json::to_vec(cred).map_err(io::Error::other)?;
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&tmp)?;
        file.set_permissions(Permissions::from_mode(0o600))?;
        let written = file.write_all(&bytes);
        if let Err(e) = written.and_then(|()| fs::rename(&tmp, self.path(id))) {
            let _ = fs::remove_file(&tmp);
            return Err(e);
        }
        Ok(())
    }

    /// Job `id`'s credential, if it has one.
    pub fn get(&self, id: JobId) -> Option<RegistryCredential> {
        let path = self.path(id);
        match fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map_err(|e| tracing::warn!(job = id, error = %e, "a job's registry credential file is corrupt"))
                .ok(),
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => {
                tracing::warn!(job = id, error = %e, "cannot read a job's registry credential");
                None
            }
        }
    }

    /// Deletes job `id`'s credential, if any.
    pub fn remove(&self, id: JobId) {
        match fs::remove_file(self.path(id)) {
            Ok(()) => tracing::debug!(job = id, "registry credential deleted"),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => {
                tracing::error!(job = id, error = %e, "cannot delete a job's registry credential")
            }
        }
    }

    /// Deletes every credential whose job `active` says is over (and leftovers of writes).
    pub fn retain(&self, active: impl Fn(JobId) -> bool) -> io::Result<()> {
        for entry in fs::read_dir(&self.dir)? {
            let entry = entry?;
            let name = entry.file_name();
            let keep = name
                .to_str()
                .and_then(|n| n.parse::<JobId>().ok())
                .is_some_and(&active);
            if !keep {
                let _ = fs::remove_file(entry.path());
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    fn cred() -> RegistryCredential {
        RegistryCredential {
            registry: "127.0.0.1:5000".into(),
            username: "ann".into(),
            password: "s3cret".into(),
        }
    }

    #[test]
    fn files_are_private_replaced_whole_and_swept() {
        let tmp = tempfile::tempdir().unwrap();
        let creds = JobCredentials::open(tmp.path()).unwrap();
        let dir = tmp.path().join(DIR);
        assert_eq!(fs::metadata(&dir).unwrap().mode() & 0o7777, 0o700);
        creds.put(7, &cred()).unwrap();
        creds.put(8, &cred()).unwrap();
        let meta = fs::metadata(creds.path(7)).unwrap();
        assert_eq!(meta.mode() & 0o7777, 0o600);
        assert_eq!(meta.uid(), nix::unistd::geteuid().as_raw());
        assert_eq!(creds.get(7), Some(cred()));
        let mut other = cred();
        other.password = "new".into();
        creds.put(7, &other).unwrap();
        assert_eq!(creds.get(7).unwrap().password, "new");
        fs::write(dir.join(".9.tmp"), "x").unwrap();
        creds.retain(|id| id == 8).unwrap();
        assert_eq!(creds.get(7), None);
        assert!(creds.get(8).is_some());
        assert_eq!(fs::read_dir(&dir).unwrap().count(), 1, "leftovers swept");
        creds.remove(8);
        creds.remove(8);
        assert_eq!(creds.get(8), None);
        // An existing directory with loose modes is corrected.
        fs::set_permissions(&dir, Permissions::from_mode(0o755)).unwrap();
        JobCredentials::open(tmp.path()).unwrap();
        assert_eq!(fs::metadata(&dir).unwrap().mode() & 0o7777, 0o700);
    }
}
