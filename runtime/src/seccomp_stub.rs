//! Without the `seccomp` feature there is no profile (and no libseccomp to link).

/// Loads nothing.
pub(crate) fn load() -> Result<(), String> {
    Ok(())
}
