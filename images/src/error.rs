//! Errors of the image store, with a kind so callers can tell bad input from a broken node.
//!
//! Kinds follow containerd's `errdefs`: a caller retries `Unavailable`, reports `InvalidInput`
//! and `NotFound` to the user as they are, and treats `PermissionDenied` as a setup problem.
//! What the registry says is told apart from what the store's own disk does: `Refused` and
//! `Unreachable` come only from the registry.

/// What kind of failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The name, the source or its content is malformed, hostile or over a limit.
    InvalidInput,
    /// The image, the source or a blob it names does not exist.
    NotFound,
    /// The kernel refused an operation on the store or the source.
    PermissionDenied,
    /// The node cannot do this now (disk full, IO error, a kernel without `openat2`).
    Unavailable,
    /// The registry refused the image to this node (HTTP 401 or 403, its token service, no
    /// credentials for it).
    Refused,
    /// The registry cannot be reached now (no connection, HTTP 5xx or 429, a download that
    /// broke off): worth a later retry, from this node or another.
    Unreachable,
}

/// An image store failure; `Display` is the message alone.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ImageError {
    /// Kind.
    pub kind: ErrorKind,
    /// What happened, with the image, path or entry involved.
    pub message: String,
}

/// Result alias of this crate.
pub(crate) type Result<T, E = ImageError> = std::result::Result<T, E>;

impl ImageError {
    /// A new error.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        ImageError {
            kind,
            message: message.into(),
        }
    }

    /// Malformed or hostile input.
    pub(crate) fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::InvalidInput, message)
    }

    /// Something named does not exist.
    pub(crate) fn not_found(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::NotFound, message)
    }

    /// An IO error, kind derived from the errno, with what was being done.
    pub(crate) fn io(what: impl std::fmt::Display, err: std::io::Error) -> Self {
        let kind = match err.kind() {
            std::io::ErrorKind::NotFound => ErrorKind::NotFound,
            std::io::ErrorKind::PermissionDenied => ErrorKind::PermissionDenied,
            _ => ErrorKind::Unavailable,
        };
        ImageError {
            kind,
            message: format!("{what}: {err}"),
        }
    }

    /// A nix error, with what was being done.
    pub(crate) fn sys(what: impl std::fmt::Display, err: nix::Error) -> Self {
        Self::io(what, std::io::Error::from(err))
    }

    /// An error while reading an archive or blob stream: corruption and limits are bad input,
    /// except errors that this crate raised itself with a kind (carried inside the io::Error).
    pub(crate) fn stream(what: impl std::fmt::Display, err: std::io::Error) -> Self {
        if let Some(inner) = find_own(&err) {
            return ImageError::new(inner.kind, format!("{what}: {}", inner.message));
        }
        match err.kind() {
            std::io::ErrorKind::NotFound | std::io::ErrorKind::PermissionDenied => {
                Self::io(what, err)
            }
            _ => ImageError::invalid(format!("{what}: {err}")),
        }
    }

    /// Wraps this error in an `io::Error` so it can cross a `Read` boundary and come back
    /// out of [`ImageError::stream`] with its kind.
    pub(crate) fn into_io(self) -> std::io::Error {
        std::io::Error::other(self)
    }
}

/// Finds an [`ImageError`] somewhere inside `err`, through io::Error wrappers and `source()`
/// chains (the tar crate wraps reader errors in its own type).
fn find_own(err: &std::io::Error) -> Option<&ImageError> {
    let mut cur: &(dyn std::error::Error + 'static) = err.get_ref()?;
    for _ in 0..16 {
        if let Some(own) = cur.downcast_ref::<ImageError>() {
            return Some(own);
        }
        cur = match cur.downcast_ref::<std::io::Error>() {
            Some(io) => io.get_ref()?,
            None => cur.source()?,
        };
    }
    None
}
