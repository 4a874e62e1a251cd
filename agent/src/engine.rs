//! Registry images on Docker nodes (`[agent] backend = "docker"`): the engine pulls them
//! (`POST /images/create`), with the job's user's credential for the image's registry, else
//! the node's (`[images] auth_file`), else none; the agent follows the engine's progress
//! stream and reports it as a pull's. Users never touch the socket. The engine keeps no
//! notion of who may use an image it holds, so a reference written with its registry is
//! pulled again at every job start and the registry decides for each job's credential.

use wharf_api::wire::LaunchOrder;
use wharf_images::registry::{Credentials, RegistryOptions};
use wharf_images::{ImageRef, PullEvent};

use crate::images::{options_for, Pulls};
use crate::launch::LaunchError;
use crate::{AgentConfig, BackendKind};

/// Has the Docker engine at `socket` pull `reference`, with `user`'s credential when given
/// (the job's, for the reference's registry), else the site's for that registry from `site`,
/// else none; reports the engine's counts to `progress` as [`PullEvent`]s (a
/// [`PullEvent::Resolved`] each time the engine names more layers or sizes, then the layers it
/// has, then the bytes). Returns the image's manifest digest, or the engine's reason. The
/// engine's own mirrors and insecure registries (its `daemon.json`) apply, not `[images]`'s.
pub fn docker_pull(
    socket: &std::path::Path,
    reference: &ImageRef,
    site: &RegistryOptions,
    user: Option<&Credentials>,
    progress: &mut dyn FnMut(PullEvent),
) -> Result<String, wharf_runtime::RuntimeError> {
    let creds = user.or_else(|| site.credentials.get(&reference.registry));
    let (repository, tag) = engine_name(reference);
    let mut told = (0, 0);
    wharf_runtime::docker::pull_image(
        socket,
        &repository,
        &tag,
        &reference.registry,
        creds.map(|c| (c.username.as_str(), c.password.as_str())),
        &mut |p| {
            // Sizes come as layers start downloading: the total is told again as it grows.
            if (p.layers, p.bytes) != told {
                told = (p.layers, p.bytes);
                progress(PullEvent::Resolved {
                    digest: String::new(),
                    layers: p.layers,
                    bytes: p.bytes,
                });
            }
            // The engine says which layers it has, not which: count them from the bottom.
            for index in 1..=p.layers_done {
                progress(PullEvent::Layer {
                    index,
                    digest: String::new(),
                    size: 0,
                    fetched: index > p.layers_kept,
                });
            }
            progress(PullEvent::Bytes {
                fetched: p.bytes_done,
            });
        },
    )
}

/// On a Docker node, the registry reference `image` names when the engine must pull it
/// before the job starts: always for a reference written with its registry (`docker://`,
/// `host/...`, `host#path`), so that the job's own credential is checked by the registry at
/// each start (the engine keeps no notion of who may use what it pulled); for a bare name
/// (`ubuntu:24.04`) only when the engine does not have an image of that name (so images made
/// on the node, `docker import` or `docker build`, run as they always did).
pub fn to_engine_pull(cfg: &AgentConfig, image: &str) -> Option<ImageRef> {
    let BackendKind::Docker(socket) = &cfg.backend else {
        return None;
    };
    if image == "host" || image.starts_with('/') {
        return None;
    }
    let reference: ImageRef = image.parse().ok()?;
    if !ImageRef::is_explicit(image)
        && wharf_runtime::docker::has_image(socket, image).unwrap_or(false)
    {
        return None;
    }
    Some(reference)
}

/// The name the engine runs `image` under: a registry reference as the engine writes it
/// (`host/path:tag`, `host/path@sha256:...`), anything else as it is.
pub fn engine_image(image: &str) -> String {
    match image.parse::<ImageRef>() {
        Ok(r) if ImageRef::is_explicit(image) => {
            let (repository, tag) = engine_name(&r);
            let sep = if tag.starts_with("sha256:") { '@' } else { ':' };
            format!("{repository}{sep}{tag}")
        }
        _ => image.to_string(),
    }
}

/// Has the Docker engine pull `reference` for job `order` with the job's user's credential
/// (else the node's), keeping its progress in `pulls` while it lasts. The error is the job's
/// reason, and whose fault it is: the registry's refusals and a missing image are the job's,
/// an engine that cannot be reached is the node's.
pub fn engine_pull_for(
    cfg: &AgentConfig,
    pulls: &Pulls,
    order: &LaunchOrder,
    reference: &ImageRef,
) -> Result<(), LaunchError> {
    let BackendKind::Docker(socket) = &cfg.backend else {
        return Ok(());
    };
    tracing::info!(job = order.id, image = %reference, "pulling through the engine");
    pulls.began(order.id, reference);
    let opts = options_for(&cfg.registry, order, reference);
    let pulled = docker_pull(
        socket,
        reference,
        &cfg.registry,
        opts.user.as_ref(),
        &mut |e| pulls.stepped(order.id, &e),
    );
    pulls.ended(order.id);
    match pulled {
        Ok(digest) => {
            tracing::info!(job = order.id, image = %reference, %digest, "pulled through the engine");
            Ok(())
        }
        Err(e) => {
            use wharf_api::fault::FaultCode;
            use wharf_runtime::ErrorKind as K;
            let code = match e.kind {
                K::NotFound => FaultCode::ImageNotFound,
                K::PermissionDenied => FaultCode::ImageDenied,
                K::InvalidInput => FaultCode::ImageInvalid,
                K::Unavailable => match e.fault().code {
                    FaultCode::Other => FaultCode::RegistryUnreachable,
                    code => code,
                },
            };
            Err(LaunchError::new(
                code,
                format!("pulling image {reference} on node {}: {e}", cfg.node_name),
            ))
        }
    }
}

/// `reference` as the engine names it: its repository (`host/path`) and its tag or digest.
pub fn engine_name(reference: &ImageRef) -> (String, String) {
    let repository = format!("{}/{}", reference.registry, reference.repository);
    let tag = reference
        .digest
        .clone()
        .or_else(|| reference.tag.clone())
        .unwrap_or_else(|| "latest".to_string());
    (repository, tag)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_written_with_their_registry_are_run_under_the_engines_name() {
        assert_eq!(
            engine_image("nvcr.io#nvidia/pytorch:24.05-py3"),
            "nvcr.io/nvidia/pytorch:24.05-py3"
        );
        assert_eq!(
            engine_image("docker://127.0.0.1:5000/team/app"),
            "127.0.0.1:5000/team/app:latest"
        );
        let digest = format!("sha256:{}", "a".repeat(64));
        assert_eq!(
            engine_image(&format!("127.0.0.1:5000/team/app@{digest}")),
            format!("127.0.0.1:5000/team/app@{digest}")
        );
        // A bare name is the engine's to resolve, as it always was.
        assert_eq!(engine_image("ubuntu:24.04"), "ubuntu:24.04");
        assert_eq!(engine_image("wharf-e2e-docker"), "wharf-e2e-docker");
        let r: ImageRef = "ubuntu".parse().unwrap();
        assert_eq!(
            engine_name(&r),
            ("docker.io/library/ubuntu".to_string(), "latest".to_string())
        );
    }
}
