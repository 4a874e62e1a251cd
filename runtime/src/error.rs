//! Errors of the sandbox, with a kind so callers can tell bad input from a broken node.

use wharf_api::fault::{FaultCode, LaunchFault};

/// What kind of failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The spec asks for something impossible (bad path, bad id).
    InvalidInput,
    /// A file or process that should exist does not.
    NotFound,
    /// The kernel refused.
    PermissionDenied,
    /// The node cannot do this now (cgroups, namespaces, the container runtime failed).
    Unavailable,
}

/// A sandbox failure.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct RuntimeError {
    /// Kind.
    pub kind: ErrorKind,
    /// What happened, with the path or step involved.
    pub message: String,
    /// The step that failed, where the failing code knows whose fault it is (see
    /// [`RuntimeError::fault`]).
    pub code: Option<FaultCode>,
}

impl RuntimeError {
    /// A new error.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        RuntimeError {
            kind,
            message: message.into(),
            code: None,
        }
    }

    /// This error, classified as `code` (a code set before stays: the innermost step knows
    /// best).
    pub fn with_code(mut self, code: FaultCode) -> Self {
        self.code.get_or_insert(code);
        self
    }

    /// Whose fault this failure is: its code; else a full disk (`ENOSPC`) is the node's;
    /// else it is taken as the job's ([`FaultCode::Other`]), so that a failure nobody
    /// classified fails one job rather than drains a node.
    pub fn fault(&self) -> LaunchFault {
        let code = self.code.unwrap_or_else(|| {
            if is_disk_full(&self.message) {
                FaultCode::DiskFull
            } else {
                FaultCode::Other
            }
        });
        LaunchFault::new(code)
    }

    /// An IO error, kind derived from the errno, with what was being done.
    pub fn io(what: impl std::fmt::Display, err: std::io::Error) -> Self {
        let kind = match err.kind() {
            std::io::ErrorKind::NotFound => ErrorKind::NotFound,
            std::io::ErrorKind::PermissionDenied => ErrorKind::PermissionDenied,
            std::io::ErrorKind::AlreadyExists => ErrorKind::InvalidInput,
            _ => ErrorKind::Unavailable,
        };
        let code = (err.raw_os_error() == Some(libc::ENOSPC)).then_some(FaultCode::DiskFull);
        RuntimeError {
            kind,
            message: format!("{what}: {err}"),
            code,
        }
    }

    /// A nix error, with what was being done.
    pub fn sys(what: impl std::fmt::Display, err: nix::Error) -> Self {
        Self::io(what, std::io::Error::from(err))
    }
}

/// Whether `message` reports a full disk (`ENOSPC` as the standard library or nix words it):
/// what a message from another process (the sandbox's init) still says.
pub(crate) fn is_disk_full(message: &str) -> bool {
    message.contains("No space left on device") || message.contains("ENOSPC")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unclassified_failure_is_the_jobs_and_a_full_disk_the_nodes() {
        let e = RuntimeError::new(ErrorKind::Unavailable, "something odd");
        assert_eq!(e.fault(), LaunchFault::new(FaultCode::Other));
        let full = std::io::Error::from_raw_os_error(libc::ENOSPC);
        let e = RuntimeError::io("writing the spec", full);
        assert_eq!(e.fault().code, FaultCode::DiskFull);
        assert_eq!(e.fault().kind, wharf_api::fault::FaultKind::Node);
        // The innermost code stays.
        let e = RuntimeError::new(ErrorKind::Unavailable, "x")
            .with_code(FaultCode::Cgroup)
            .with_code(FaultCode::Supervisor);
        assert_eq!(e.code, Some(FaultCode::Cgroup));
    }
}
