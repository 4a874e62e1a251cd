//! The per-job directory on the node: the spec, the shim's pid, its log and the outcome.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use crate::error::RuntimeError;
use crate::spec::{ContainerSpec, Outcome};

/// Layout of one job's directory. Only root can read it (it is under the agent's state dir).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobDir {
    root: PathBuf,
}

impl JobDir {
    /// The directory at `root` (not created).
    pub fn new(root: PathBuf) -> Self {
        JobDir { root }
    }
    /// The directory itself.
    pub fn path(&self) -> &Path {
        &self.root
    }
    /// The container spec the shim runs.
    pub fn spec(&self) -> PathBuf {
        self.root.join("spec.json")
    }
    /// The shim's pid.
    pub fn pid(&self) -> PathBuf {
        self.root.join("shim.pid")
    }
    /// The shim's own log.
    pub fn log(&self) -> PathBuf {
        self.root.join("shim.log")
    }
    /// The outcome, written once at the end.
    pub fn outcome(&self) -> PathBuf {
        self.root.join("outcome.json")
    }
    /// Written (with the start time in ms) once the user's process has started.
    pub fn started(&self) -> PathBuf {
        self.root.join("started")
    }
    /// Written by the agent (with the reason) once it has passed a stop order to the shim.
    pub fn stop(&self) -> PathBuf {
        self.root.join("stop")
    }
    /// The shim's launch timeline (see [`crate::timeline`]).
    pub fn timeline(&self) -> PathBuf {
        self.root.join("timeline")
    }

    /// Creates the directory (mode 0711: the container's unprivileged ids must traverse it to
    /// reach the root bound inside; the files with the job's details are 0600) and writes the
    /// spec. Fails with `InvalidInput` if it exists. The spec is not fsynced: a job outlives
    /// an agent crash (the page cache keeps the file) but never a node crash, and the launch
    /// should not wait for the disk.
    pub fn create(&self, spec: &ContainerSpec) -> Result<(), RuntimeError> {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .mode(0o711)
            .create(&self.root)
            .map_err(|e| {
                RuntimeError::io(format!("creating job directory {}", self.root.display()), e)
            })?;
        write_json(&self.spec(), spec, false)
    }

    /// Reads the spec.
    pub fn read_spec(&self) -> Result<ContainerSpec, RuntimeError> {
        read_json(&self.spec())
    }

    /// Reads the outcome, `None` when the job has not ended.
    pub fn read_outcome(&self) -> Option<Outcome> {
        read_json(&self.outcome()).ok()
    }

    /// Writes `value` as JSON to `path` so that readers see all of it or none, and it
    /// survives a node crash (temp file, fsync, rename).
    pub fn write_atomic<T: serde::Serialize>(path: &Path, value: &T) -> Result<(), RuntimeError> {
        write_json(path, value, true)
    }
}

/// Writes `value` as JSON to a temp file (fsynced when `durable`) renamed over `path`.
fn write_json<T: serde::Serialize>(
    path: &Path,
    value: &T,
    durable: bool,
) -> Result<(), RuntimeError> {
    let tmp = path.with_extension("tmp");
    let body = serde_json::to_vec_pretty(value)
        .map_err(|e| RuntimeError::new(crate::ErrorKind::InvalidInput, e.to_string()))?;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(|e| RuntimeError::io(tmp.display(), e))?;
    f.write_all(&body)
        .and_then(|_| if durable { f.sync_all() } else { Ok(()) })
        .map_err(|e| RuntimeError::io(tmp.display(), e))?;
    std::fs::rename(&tmp, path).map_err(|e| RuntimeError::io(path.display(), e))
}

fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T, RuntimeError> {
    let body = std::fs::read(path).map_err(|e| RuntimeError::io(path.display(), e))?;
    serde_json::from_slice(&body).map_err(|e| {
        RuntimeError::new(
            crate::ErrorKind::InvalidInput,
            format!("{}: {e}", path.display()),
        )
    })
}
