//! Pulling a registry image through the Docker engine (`POST /images/create`), for Docker
//! nodes: the agent asks the engine, with the credential it chose (the job's user's, else the
//! site's), and follows the engine's progress stream. Users never touch the socket.

use std::collections::BTreeMap;

use bollard::auth::DockerCredentials;
use bollard::query_parameters::CreateImageOptionsBuilder;
use futures_util::StreamExt;

use super::{block_on, connect, engine};
use crate::error::{ErrorKind, RuntimeError};

/// How far an engine's pull has come, over the layers it named so far.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EnginePull {
    /// Layers the engine named so far.
    pub layers: usize,
    /// Of those, the layers it has (pulled now, or there already).
    pub layers_done: usize,
    /// Of those, the layers it had already.
    pub layers_kept: usize,
    /// Compressed bytes of the layers whose size it told.
    pub bytes: u64,
    /// Of those, downloaded so far (a layer kept or done counts whole).
    pub bytes_done: u64,
}

/// One layer as the engine's stream tells it.
#[derive(Debug, Clone, Default)]
struct Layer {
    total: u64,
    current: u64,
    done: bool,
    kept: bool,
}

/// The engine's progress stream, folded into an [`EnginePull`] and the digest it names.
#[derive(Debug, Default)]
pub struct Stream {
    layers: BTreeMap<String, Layer>,
    digest: Option<String>,
}

impl Stream {
    /// Takes in one entry (`id`: a layer's short id, or none; `status`: "Pulling fs layer",
    /// "Downloading", "Pull complete", "Already exists", "Digest: sha256:...", ...); returns
    /// whether the counts changed.
    pub fn take(
        &mut self,
        id: Option<&str>,
        status: &str,
        current: Option<i64>,
        total: Option<i64>,
    ) -> bool {
        if let Some(d) = status.strip_prefix("Digest: ") {
            self.digest = Some(d.trim().to_string());
            return false;
        }
        // Entries about the image as a whole ("Pulling from team/app", "Status: ...") carry
        // its tag as their id, or none; a layer's id is 12 hex digits.
        let Some(id) = id.filter(|i| i.len() == 12 && i.bytes().all(|b| b.is_ascii_hexdigit()))
        else {
            return false;
        };
        let before = self.progress();
        let layer = self.layers.entry(id.to_string()).or_default();
        match status {
            "Already exists" => {
                layer.done = true;
                layer.kept = true;
            }
            "Pull complete" => layer.done = true,
            "Downloading" => {
                if let Some(t) = total.filter(|t| *t > 0) {
                    layer.total = t as u64;
                }
                if let Some(c) = current.filter(|c| *c >= 0) {
                    layer.current = c as u64;
                }
            }
            "Download complete" => layer.current = layer.total,
            _ => {}
        }
        self.progress() != before
    }

    /// The counts so far.
    pub fn progress(&self) -> EnginePull {
        let mut p = EnginePull {
            layers: self.layers.len(),
            ..Default::default()
        };
        for l in self.layers.values() {
            p.bytes += l.total;
            p.bytes_done += if l.done {
                l.total
            } else {
                l.current.min(l.total)
            };
            p.layers_done += usize::from(l.done);
            p.layers_kept += usize::from(l.kept);
        }
        p
    }

    /// The manifest digest the engine named at the end, if it did.
    pub fn digest(&self) -> Option<&str> {
        self.digest.as_deref()
    }
}

/// Has the engine at `socket` pull `repository` (`host/path`, as the engine writes it) at
/// `tag_or_digest` (`v1` or `sha256:...`), sending `credentials` (user, password) for
/// `registry` when given, and reporting each change of its counts to `progress`. Returns the
/// image's manifest digest (or, if the engine named none, its image id).
///
/// Errors: `NotFound` / `PermissionDenied` / `Unavailable` with the engine's words (the
/// registry's reason is in them); `Unavailable` with the node's fault code when the engine
/// cannot be reached.
pub fn pull_image(
    socket: &std::path::Path,
    repository: &str,
    tag_or_digest: &str,
    registry: &str,
    credentials: Option<(&str, &str)>,
    progress: &mut dyn FnMut(&EnginePull),
) -> Result<String, RuntimeError> {
    block_on(async {
        // No overall timeout: a large image takes long; the engine stops a stalled pull.
        let docker = connect(socket, 3600)?;
        let options = CreateImageOptionsBuilder::default()
            .from_image(repository)
            .tag(tag_or_digest)
            .build();
        let creds = credentials.map(|(user, password)| DockerCredentials {
            username: Some(user.to_string()),
            password: Some(password.to_string()),
            serveraddress: Some(registry.to_string()),
            ..Default::default()
        });
        let mut stream = docker.create_image(Some(options), None, creds);
        let mut seen = Stream::default();
        while let Some(item) = stream.next().await {
            let info = item.map_err(|e| pull_error(repository, e))?;
            let detail = info.progress_detail.unwrap_or_default();
            if seen.take(
                info.id.as_deref(),
                info.status.as_deref().unwrap_or_default(),
                detail.current,
                detail.total,
            ) {
                progress(&seen.progress());
            }
        }
        if let Some(d) = seen.digest() {
            return Ok(d.to_string());
        }
        let name = if tag_or_digest.starts_with("sha256:") {
            format!("{repository}@{tag_or_digest}")
        } else {
            format!("{repository}:{tag_or_digest}")
        };
        let image = docker
            .inspect_image(&name)
            .await
            .map_err(|e| engine("inspect image", e))?;
        Ok(image.id.unwrap_or_default())
    })
}

/// Whether the engine at `socket` has the image `name` (`name:tag` or an id).
pub fn has_image(socket: &std::path::Path, name: &str) -> Result<bool, RuntimeError> {
    block_on(async {
        let docker = connect(socket, 30)?;
        match docker.inspect_image(name).await {
            Ok(_) => Ok(true),
            Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 404, ..
            }) => Ok(false),
            Err(e) => Err(engine("inspect image", e)),
        }
    })
}

/// Tags the engine's image `source` (`host/path:tag`, `host/path@sha256:...` or an id) as
/// `repository:tag`, moving the tag if another image had it. Idempotent.
///
/// Errors: `NotFound` when the engine has no image `source`; `Unavailable` otherwise, with
/// the node's fault code when the engine cannot be reached.
pub fn tag_image(
    socket: &std::path::Path,
    source: &str,
    repository: &str,
    tag: &str,
) -> Result<(), RuntimeError> {
    block_on(async {
        let docker = connect(socket, 30)?;
        let options = bollard::query_parameters::TagImageOptionsBuilder::default()
            .repo(repository)
            .tag(tag)
            .build();
        match docker.tag_image(source, Some(options)).await {
            Ok(()) => Ok(()),
            Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 404,
                message,
            }) => Err(RuntimeError::new(
                ErrorKind::NotFound,
                format!("tagging {source} as {repository}:{tag}: {message}"),
            )),
            Err(e) => Err(engine("tag image", e)),
        }
    })
}

/// The engine's refusal of a pull, kind by the registry's answer.
fn pull_error(repository: &str, e: bollard::errors::Error) -> RuntimeError {
    use bollard::errors::Error as E;
    let text = e.to_string();
    let lower = text.to_lowercase();
    let kind = match &e {
        E::DockerResponseServerError {
            status_code: 404, ..
        } => ErrorKind::NotFound,
        _ if lower.contains("manifest unknown") || lower.contains("not found") => {
            ErrorKind::NotFound
        }
        _ if lower.contains("unauthorized")
            || lower.contains("denied")
            || lower.contains("authentication required")
            || lower.contains("no basic auth credentials") =>
        {
            ErrorKind::PermissionDenied
        }
        E::DockerResponseServerError { .. } | E::DockerStreamError { .. } => ErrorKind::Unavailable,
        _ => return engine(&format!("pull {repository}"), e),
    };
    RuntimeError::new(kind, format!("docker pull {repository}: {text}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_engines_stream_is_counted_by_layer() {
        let mut s = Stream::default();
        assert!(!s.take(Some("v1"), "Pulling from test/app", None, None));
        assert!(s.take(Some("0123456789ab"), "Already exists", None, None));
        assert!(s.take(Some("abcdef012345"), "Pulling fs layer", None, None));
        assert!(s.take(Some("abcdef012345"), "Downloading", Some(100), Some(400)));
        let p = s.progress();
        assert_eq!(
            (
                p.layers,
                p.layers_done,
                p.layers_kept,
                p.bytes_done,
                p.bytes
            ),
            (2, 1, 1, 100, 400)
        );
        assert!(s.take(Some("abcdef012345"), "Download complete", None, None));
        assert!(!s.take(Some("abcdef012345"), "Extracting", Some(5), Some(9)));
        assert!(s.take(Some("abcdef012345"), "Pull complete", None, None));
        assert!(!s.take(None, "Digest: sha256:feed", None, None));
        assert!(!s.take(None, "Status: Downloaded newer image", None, None));
        let p = s.progress();
        assert_eq!(
            (p.layers, p.layers_done, p.bytes_done, p.bytes),
            (2, 2, 400, 400)
        );
        assert_eq!(s.digest(), Some("sha256:feed"));
    }
}
