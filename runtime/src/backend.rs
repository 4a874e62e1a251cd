//! The backend seam: one trait over the ways a node can run a job's container.
//!
//! Every backend keeps a job's state in its [`JobDir`] (`outcome.json` once it has ended), so
//! an agent restart loses nothing whichever backend ran the job. Every backend passes the one
//! conformance suite in [`crate::conformance`].
//!
//! ```no_run
//! use wharf_runtime::{Backend, JobDir, JobStatus, Launcher};
//! # fn spec() -> wharf_runtime::ContainerSpec { unimplemented!() }
//! let backend: &dyn Backend = &Launcher::new("/usr/bin/wharf".into());
//! let dir = JobDir::new("/var/lib/wharf/agent/jobs/7".into());
//! backend.launch(&dir, &spec())?;
//! backend.cancel(&dir)?; // TERM, grace, KILL
//! # Ok::<(), wharf_runtime::RuntimeError>(())
//! ```

use crate::error::RuntimeError;
use crate::jobdir::JobDir;
use crate::launcher::JobStatus;
use crate::spec::ContainerSpec;

/// A way to run job containers on this node.
pub trait Backend: Send + Sync + std::fmt::Debug {
    /// Short name (`oci`, `sif`, `docker`, `fake`).
    fn name(&self) -> &'static str;

    /// Starts the job `spec` with its state in `dir`, which must not exist yet. Returns once
    /// the job is under supervision; it may still be preparing. Not idempotent: a second launch
    /// into the same directory fails with `InvalidInput`. A job that cannot start is not an
    /// error here: it ends with an outcome whose `error` says why.
    fn launch(&self, dir: &JobDir, spec: &ContainerSpec) -> Result<(), RuntimeError>;

    /// The job's status. Never fails: a directory with neither a live supervisor nor an
    /// outcome is `Lost`.
    fn status(&self, dir: &JobDir) -> JobStatus;

    /// Asks the job to stop: SIGTERM to all its processes, the grace period, then SIGKILL.
    /// Returns at once. Idempotent; cancelling an ended or unknown job is not an error.
    fn cancel(&self, dir: &JobDir) -> Result<(), RuntimeError>;

    /// Deletes an ended job's directory. Idempotent (a missing directory is fine); refuses
    /// with `InvalidInput` while the job runs.
    fn remove(&self, dir: &JobDir) -> Result<(), RuntimeError>;

    /// Prepares what launches need before the first one comes (the agent calls it as it
    /// starts), so that the first job does not wait for it. Nothing by default.
    fn warm_up(&self) -> Result<(), RuntimeError> {
        Ok(())
    }

    /// Tells the job's supervisor that its input's end was written
    /// ([`JobDir::stdin_end`]), so that the task reads it now rather than at the supervisor's
    /// next look. Nothing by default.
    fn input_ended(&self, _dir: &JobDir) {}

    /// Tells the job's supervisor that signal requests were written
    /// ([`crate::signals::request`]), so that it sends them now rather than at its next look
    /// (within a second). Nothing by default.
    fn signals_requested(&self, _dir: &JobDir) {}
}

impl Backend for crate::Launcher {
    fn name(&self) -> &'static str {
        "oci"
    }
    fn launch(&self, dir: &JobDir, spec: &ContainerSpec) -> Result<(), RuntimeError> {
        crate::Launcher::launch(self, dir, spec).map(|_| ())
    }
    fn status(&self, dir: &JobDir) -> JobStatus {
        crate::Launcher::status(self, dir)
    }
    fn cancel(&self, dir: &JobDir) -> Result<(), RuntimeError> {
        crate::Launcher::cancel(self, dir)
    }
    fn remove(&self, dir: &JobDir) -> Result<(), RuntimeError> {
        crate::Launcher::remove(self, dir)
    }
    fn warm_up(&self) -> Result<(), RuntimeError> {
        crate::Launcher::warm_up(self)
    }
    fn input_ended(&self, dir: &JobDir) {
        crate::Launcher::input_ended(self, dir)
    }
    fn signals_requested(&self, dir: &JobDir) {
        crate::Launcher::signals_requested(self, dir)
    }
}

/// The Docker backend: the same detached shim, driving the Docker engine instead of making
/// the sandbox itself. Every spec it launches must name its engine image (`spec.docker`).
#[derive(Debug, Clone)]
pub struct DockerBackend {
    launcher: crate::Launcher,
}

impl DockerBackend {
    /// A Docker backend whose shims are started from `exe` (see [`crate::Launcher`]).
    pub fn new(exe: std::path::PathBuf) -> Self {
        DockerBackend {
            launcher: crate::Launcher::new(exe),
        }
    }
}

impl Backend for DockerBackend {
    fn name(&self) -> &'static str {
        "docker"
    }
    fn launch(&self, dir: &JobDir, spec: &ContainerSpec) -> Result<(), RuntimeError> {
        if spec.docker.is_none() {
            return Err(RuntimeError::new(
                crate::ErrorKind::InvalidInput,
                "the docker backend needs the job's engine image",
            ));
        }
        self.launcher.launch(dir, spec).map(|_| ())
    }
    fn status(&self, dir: &JobDir) -> JobStatus {
        self.launcher.status(dir)
    }
    fn cancel(&self, dir: &JobDir) -> Result<(), RuntimeError> {
        self.launcher.cancel(dir)
    }
    fn remove(&self, dir: &JobDir) -> Result<(), RuntimeError> {
        self.launcher.remove(dir)
    }
    fn warm_up(&self) -> Result<(), RuntimeError> {
        self.launcher.warm_up()
    }
}
