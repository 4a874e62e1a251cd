//! Registry images on Docker nodes (`[agent] backend = "docker"`): the engine pulls them
//! (`POST /images/create`), with the job's user's credential for the image's registry, else
//! the node's (`[images] auth_file`), else none; the agent follows the engine's progress
//! stream and reports it as a pull's. Users never touch the socket. The engine keeps no
//! notion of who may use an image it holds, so a reference written with its registry is
//! pulled again at every job start and the registry decides for each job's credential.
//!
//! `[images] mirrors` apply as on OCI nodes: the engine is asked for the image at each mirror
//! of its registry in turn (`mirror-host/team/app:v1`, with the site's credential for the
//! mirror's host, never the user's), and what a mirror served is tagged under the name the
//! job gave (`registry/team/app:v1`); whatever a mirror fails with, the next is tried, the
//! registry itself last, with the job's credential. A digest cannot be a tag: an image pinned
//! by digest that came from a mirror runs under the mirror's name for that digest, which the
//! engine verified ([`engine_run_image`]). Whether a mirror is spoken to over plain HTTP is
//! the engine's `insecure-registries` to decide, as for any registry it pulls from.

use wharf_api::wire::LaunchOrder;
use wharf_images::registry::{Credentials, RegistryOptions};
use wharf_images::{ImageRef, PullEvent};

use crate::images::{options_for, Pulls};
use crate::launch::LaunchError;
use crate::{AgentConfig, BackendKind};

/// Has the Docker engine at `socket` pull `reference`: from each mirror of its registry in
/// `site` in turn, with the site's credential for the mirror's host, tagging what one served
/// under `reference`'s own name; else (or when every mirror failed) from its registry, with
/// `user`'s credential when given (the job's, for the reference's registry), else the site's
/// for that registry, else none. Reports the engine's counts to `progress` as [`PullEvent`]s
/// (a [`PullEvent::Resolved`] each time the engine names more layers or sizes, and again
/// for each source tried, then the layers it has, then the bytes). Returns the image's
/// manifest digest, or the registry's reason (with the mirrors' after it).
pub fn docker_pull(
    socket: &std::path::Path,
    reference: &ImageRef,
    site: &RegistryOptions,
    user: Option<&Credentials>,
    progress: &mut dyn FnMut(PullEvent),
) -> Result<String, wharf_runtime::RuntimeError> {
    let (repository, tag) = engine_name(reference);
    let mut failed = Vec::new();
    for mirror in mirror_hosts(reference, site) {
        let from = format!("{mirror}/{}", reference.repository);
        let creds = site_credential(site, &mirror);
        let pulled =
            pull_reporting(socket, &from, &tag, &mirror, creds, progress).and_then(|digest| {
                // A digest cannot be a tag: such an image runs under the mirror's name.
                if !tag.starts_with("sha256:") {
                    wharf_runtime::docker::tag_image(
                        socket,
                        &format!("{from}:{tag}"),
                        &repository,
                        &tag,
                    )?;
                }
                Ok(digest)
            });
        match pulled {
            Ok(digest) => {
                tracing::info!(image = %reference, %mirror, "pulled through the engine from a mirror");
                return Ok(digest);
            }
            Err(e) => {
                tracing::warn!(image = %reference, %mirror, error = %e, "mirror failed; trying the next source");
                failed.push(format!("mirror {mirror}: {}", e.message));
            }
        }
    }
    let creds = user.or_else(|| site.credentials.get(&reference.registry));
    match pull_reporting(
        socket,
        &repository,
        &tag,
        &reference.registry,
        creds,
        progress,
    ) {
        Ok(digest) => Ok(digest),
        Err(e) if failed.is_empty() => Err(e),
        Err(e) => Err(wharf_runtime::RuntimeError {
            message: format!("{} (after: {})", e.message, failed.join("; ")),
            ..e
        }),
    }
}

/// The mirrors of `reference`'s registry in `site`, in order, as hosts (`host[:port]`): the
/// engine names an image by host, and picks HTTP or HTTPS itself.
pub fn mirror_hosts(reference: &ImageRef, site: &RegistryOptions) -> Vec<String> {
    site.mirrors
        .get(&reference.registry)
        .into_iter()
        .flatten()
        .filter_map(|m| wharf_images::registry::parse_mirror(m).ok())
        .map(|(_, host)| host)
        .collect()
}

/// The site's credential for a mirror (keyed by `host:port`, else by host), as for OCI pulls.
fn site_credential<'a>(site: &'a RegistryOptions, mirror: &str) -> Option<&'a Credentials> {
    site.credentials
        .get(mirror)
        .or_else(|| site.credentials.get(wharf_api::image_ref::host_of(mirror)))
}

/// One pull by the engine of `repository` at `tag`, from `registry` with `creds`, its counts
/// reported as [`PullEvent`]s from zero.
fn pull_reporting(
    socket: &std::path::Path,
    repository: &str,
    tag: &str,
    registry: &str,
    creds: Option<&Credentials>,
    progress: &mut dyn FnMut(PullEvent),
) -> Result<String, wharf_runtime::RuntimeError> {
    let mut told = (0, 0);
    wharf_runtime::docker::pull_image(
        socket,
        repository,
        tag,
        registry,
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

/// The name the engine at `socket` runs `image` under ([`engine_image`]), except for an image
/// pinned by digest that came from a mirror of its registry in `site`: a digest cannot be a
/// tag, so it runs under the first mirror's name for that digest that the engine has (the
/// same content: the engine verified the digest). The job's own pull came first, so the
/// engine has one of them unless that pull failed.
pub fn engine_run_image(socket: &std::path::Path, site: &RegistryOptions, image: &str) -> String {
    let name = engine_image(image);
    // A bare name too (`ubuntu@sha256:...`): a docker.io mirror may have served it.
    let Some(reference) = image
        .parse::<ImageRef>()
        .ok()
        .filter(|r| r.digest.is_some())
    else {
        return name;
    };
    let mirrors = mirror_hosts(&reference, site);
    if mirrors.is_empty() || wharf_runtime::docker::has_image(socket, &name).unwrap_or(true) {
        return name;
    }
    let digest = reference.digest.as_deref().unwrap_or_default();
    mirrors
        .iter()
        .map(|m| format!("{m}/{}@{digest}", reference.repository))
        .find(|n| wharf_runtime::docker::has_image(socket, n).unwrap_or(false))
        .unwrap_or(name)
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

    #[test]
    fn the_engine_is_given_a_registrys_mirrors_as_hosts_in_order() {
        let site = RegistryOptions {
            mirrors: [
                (
                    "docker.io".to_string(),
                    vec![
                        "http://127.0.0.1:5001/".into(),
                        "Mirror.LAN".into(),
                        "https://m2.lan:443".into(),
                    ],
                ),
                ("nvcr.io".to_string(), vec!["nv-mirror:5000".into()]),
            ]
            .into(),
            ..Default::default()
        };
        let r: ImageRef = "ubuntu:24.04".parse().unwrap();
        assert_eq!(
            mirror_hosts(&r, &site),
            ["127.0.0.1:5001", "mirror.lan", "m2.lan:443"]
        );
        let r: ImageRef = "host:5000/team/app:v1".parse().unwrap();
        assert!(mirror_hosts(&r, &site).is_empty());
        // The site's credential for a mirror, by host:port, else by host.
        let mut site = site;
        let cred = |u: &str| Credentials {
            username: u.into(),
            password: "p".into(),
        };
        site.credentials.insert("mirror.lan".into(), cred("lan"));
        site.credentials
            .insert("127.0.0.1:5001".into(), cred("local"));
        assert_eq!(
            site_credential(&site, "mirror.lan:5000").unwrap().username,
            "lan"
        );
        assert_eq!(
            site_credential(&site, "127.0.0.1:5001").unwrap().username,
            "local"
        );
        assert!(site_credential(&site, "127.0.0.1:5002").is_none());
    }
}
