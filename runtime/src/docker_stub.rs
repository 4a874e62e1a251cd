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
pub fn list_images(_: &std::path::Path) -> Result<Vec<String>, RuntimeError> {
    Err(missing())
}

/// Always an error without the feature.
pub fn remove(_: &DockerTarget, _: &str) -> Result<(), RuntimeError> {
    Err(missing())
}
