//! Errors of the sandbox, with a kind so callers can tell bad input from a broken node.

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
}

impl RuntimeError {
    /// A new error.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        RuntimeError {
            kind,
            message: message.into(),
        }
    }

    /// An IO error, kind derived from the errno, with what was being done.
    pub fn io(what: impl std::fmt::Display, err: std::io::Error) -> Self {
        let kind = match err.kind() {
            std::io::ErrorKind::NotFound => ErrorKind::NotFound,
            std::io::ErrorKind::PermissionDenied => ErrorKind::PermissionDenied,
            std::io::ErrorKind::AlreadyExists => ErrorKind::InvalidInput,
            _ => ErrorKind::Unavailable,
        };
        RuntimeError {
            kind,
            message: format!("{what}: {err}"),
        }
    }

    /// A nix error, with what was being done.
    pub fn sys(what: impl std::fmt::Display, err: nix::Error) -> Self {
        Self::io(what, std::io::Error::from(err))
    }
}
