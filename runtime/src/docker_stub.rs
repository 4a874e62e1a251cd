//! Stand-in for the Docker backend when Wharf is built without the `docker` feature: the
//! same functions, each saying the backend is not built in.

use std::os::fd::OwnedFd;

use crate::error::{ErrorKind, RuntimeError};
use crate::spec::{ContainerSpec, DockerTarget, Outcome};

fn missing() -> RuntimeError {
    RuntimeError::new(
        ErrorKind::Unavailable,
        "this wharf was built without the docker backend (feature `docker`)",
    )
}

pub(crate) fn supervise(
    _: &crate::JobDir,
    _: &ContainerSpec,
    _: &DockerTarget,
    _: (OwnedFd, OwnedFd),
    _: fn() -> bool,
    _: &mut Outcome,
) -> Result<(), RuntimeError> {
    Err(missing())
}

/// Always an error without the feature.
pub(crate) fn with_tmp_files(
    _: &std::path::Path,
    _: &ContainerSpec,
) -> Result<ContainerSpec, RuntimeError> {
    Err(missing())
}

/// Always an error without the feature.
pub fn list_images(_: &std::path::Path) -> Result<Vec<String>, RuntimeError> {
    Err(missing())
}

/// Always an error without the feature.
pub fn remove(_: &DockerTarget, _: &str) -> Result<(), RuntimeError> {
    Err(missing())
}

/// How far an engine's pull has come (see the `docker` feature's module).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EnginePull {
    /// Layers the engine named so far.
    pub layers: usize,
    /// Of those, the layers it has.
    pub layers_done: usize,
    /// Of those, the layers it had already.
    pub layers_kept: usize,
    /// Compressed bytes of the layers whose size it told.
    pub bytes: u64,
    /// Of those, downloaded so far.
    pub bytes_done: u64,
}

/// Always an error without the feature.
pub fn pull_image(
    _: &std::path::Path,
    _: &str,
    _: &str,
    _: &str,
    _: Option<(&str, &str)>,
    _: &mut dyn FnMut(&EnginePull),
) -> Result<String, RuntimeError> {
    Err(missing())
}

/// Always an error without the feature.
pub fn has_image(_: &std::path::Path, _: &str) -> Result<bool, RuntimeError> {
    Err(missing())
}

/// Always an error without the feature.
pub fn tag_image(_: &std::path::Path, _: &str, _: &str, _: &str) -> Result<(), RuntimeError> {
    Err(missing())
}
