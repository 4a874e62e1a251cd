//! Without the `seccomp` feature there is no profile (and no libseccomp to link).

/// Loads nothing.
pub(crate) fn load() -> Result<(), String> {
    Ok(())
}

/// No profile, so no call is refused.
pub fn denied_calls() -> &'static [&'static str] {
    &[]
}
