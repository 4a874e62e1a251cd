//! Without the `seccomp` feature there is no profile (and no libseccomp to link).

/// No profile.
pub(crate) fn profile() -> Option<serde_json::Value> {
    None
}
