//! Registry image references: what a job names when its image comes from a registry.
//!
//! Parsed here, in the shared API crate, because the CLI and the controller check a job's
//! reference at submit (a bad one never reaches the queue) and the node's image crate pulls
//! with the same value. Accepted spellings:
//!
//! | written | registry | repository | tag / digest |
//! |---|---|---|---|
//! | `ubuntu:24.04` | `docker.io` | `library/ubuntu` | `24.04` |
//! | `docker://alpine` | `docker.io` | `library/alpine` | `latest` |
//! | `nvcr.io/nvidia/pytorch:24.05-py3` | `nvcr.io` | `nvidia/pytorch` | `24.05-py3` |
//! | `nvcr.io#nvidia/pytorch:24.05-py3` (Pyxis, Enroot) | `nvcr.io` | `nvidia/pytorch` | `24.05-py3` |
//! | `localhost:5000/team/app@sha256:<64 hex>` | `localhost:5000` | `team/app` | the digest |
//!
//! The first component is a registry when it holds a `.` or a `:` or is `localhost`, as Docker
//! reads it; Docker Hub's API lives at `registry-1.docker.io`.
//!
//! ```
//! use wharf_api::image_ref::ImageRef;
//! let r: ImageRef = "ubuntu:24.04".parse().unwrap();
//! assert_eq!((r.registry.as_str(), r.repository.as_str()), ("docker.io", "library/ubuntu"));
//! assert_eq!(r.to_string(), "docker.io/library/ubuntu:24.04");
//! assert!("Ubuntu".parse::<ImageRef>().unwrap_err().contains("lowercase"));
//! ```

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Docker Hub's name in references.
pub const DOCKER_HUB: &str = "docker.io";
/// Where Docker Hub's registry API answers.
pub const DOCKER_HUB_API: &str = "registry-1.docker.io";
/// Longest repository name (registry and path together), as the distribution spec bounds it.
const MAX_NAME: usize = 255;
/// Longest tag.
const MAX_TAG: usize = 128;

/// A parsed registry reference. `Display` gives the canonical form, which is also the name a
/// pulled image has in the node's store.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ImageRef {
    /// `host[:port]`, lowercase (`docker.io` for Docker Hub).
    pub registry: String,
    /// Path in the registry, `library/` added for Docker Hub's official images.
    pub repository: String,
    /// Tag; `latest` when neither a tag nor a digest is written.
    pub tag: Option<String>,
    /// `sha256:<64 hex>` when written; then it alone decides the content.
    pub digest: Option<String>,
}

impl ImageRef {
    /// Whether `s` is written so that it can only be a registry reference (`docker://`,
    /// `host#path`, or a first component that is a registry), never an imported image's name.
    pub fn is_explicit(s: &str) -> bool {
        s.starts_with("docker://")
            || s.contains('#')
            || s.split_once('/')
                .is_some_and(|(first, _)| is_registry(first))
    }

    /// The host (and port) to talk to: Docker Hub's API host for `docker.io`.
    pub fn api_host(&self) -> &str {
        if self.registry == DOCKER_HUB {
            DOCKER_HUB_API
        } else {
            &self.registry
        }
    }

    /// The host without its port, lowercase.
    pub fn host(&self) -> &str {
        host_of(&self.registry)
    }

    /// What to ask the registry for: the digest when there is one, else the tag.
    pub fn reference(&self) -> &str {
        self.digest
            .as_deref()
            .or(self.tag.as_deref())
            .unwrap_or("latest")
    }
}

/// `host` of `host:port` (an IPv6 literal keeps its brackets).
pub fn host_of(registry: &str) -> &str {
    if registry.starts_with('[') {
        return registry.split_once(']').map_or(registry, |(h, _)| &h[1..]);
    }
    registry.split_once(':').map_or(registry, |(h, _)| h)
}

fn is_registry(first: &str) -> bool {
    first.contains('.') || first.contains(':') || first == "localhost" || first.starts_with('[')
}

impl fmt::Display for ImageRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.registry, self.repository)?;
        if let Some(tag) = &self.tag {
            write!(f, ":{tag}")?;
        }
        if let Some(digest) = &self.digest {
            write!(f, "@{digest}")?;
        }
        Ok(())
    }
}

impl FromStr for ImageRef {
    type Err = String;

    /// Parses a reference; the error says what is wrong, quoting the reference.
    fn from_str(s: &str) -> Result<ImageRef, String> {
        parse(s).map_err(|why| format!("image reference {s:?}: {why}"))
    }
}

fn parse(s: &str) -> Result<ImageRef, String> {
    if s.is_empty() {
        return Err("is empty".into());
    }
    if let Some(bad) = s.chars().find(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!("contains {bad:?}"));
    }
    let body = s.strip_prefix("docker://").unwrap_or(s);
    if body.contains("://") {
        return Err("only the docker:// transport is understood".into());
    }
    let (registry, rest) = match body.split_once('#') {
        Some((reg, rest)) => {
            if reg.is_empty() {
                return Err("nothing before '#' (write REGISTRY#REPOSITORY)".into());
            }
            (reg.to_string(), rest)
        }
        None => match body.split_once('/') {
            Some((first, rest)) if is_registry(first) => (first.to_string(), rest),
            _ => (DOCKER_HUB.to_string(), body),
        },
    };
    check_registry(&registry)?;
    let registry = registry.to_ascii_lowercase();
    let (rest, digest) = match rest.split_once('@') {
        Some((r, d)) => (r, Some(check_digest(d)?)),
        None => (rest, None),
    };
    // A tag follows the last ':' that comes after the last '/'.
    let last_slash = rest.rfind('/').map_or(0, |i| i + 1);
    let (path, tag) = match rest[last_slash..].rfind(':') {
        Some(i) => (&rest[..last_slash + i], Some(&rest[last_slash + i + 1..])),
        None => (rest, None),
    };
    if let Some(tag) = tag {
        check_tag(tag)?;
    }
    if path.is_empty() {
        return Err("names no repository".into());
    }
    for comp in path.split('/') {
        check_component(comp)?;
    }
    let repository = if registry == DOCKER_HUB && !path.contains('/') {
        format!("library/{path}")
    } else {
        path.to_string()
    };
    if registry.len() + 1 + repository.len() > MAX_NAME {
        return Err(format!("the name is longer than {MAX_NAME} characters"));
    }
    let tag = match (tag, &digest) {
        (Some(t), _) => Some(t.to_string()),
        (None, None) => Some("latest".into()),
        (None, Some(_)) => None,
    };
    Ok(ImageRef {
        registry,
        repository,
        tag,
        digest,
    })
}

fn check_registry(reg: &str) -> Result<(), String> {
    let (host, port) = if let Some(v6) = reg.strip_prefix('[') {
        let (addr, after) = v6
            .split_once(']')
            .ok_or_else(|| format!("registry {reg:?} has an unclosed '['"))?;
        if addr.is_empty() || !addr.chars().all(|c| c.is_ascii_hexdigit() || c == ':') {
            return Err(format!("registry {reg:?} is not an IPv6 address"));
        }
        (None, after.strip_prefix(':').map(Some).unwrap_or(None))
    } else {
        let (h, p) = match reg.split_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (reg, None),
        };
        (Some(h), p)
    };
    if let Some(host) = host {
        let label_ok = |l: &str| {
            !l.is_empty()
                && l.len() <= 63
                && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        };
        if host.is_empty() || host.len() > 253 || !host.split('.').all(label_ok) {
            return Err(format!(
                "registry {reg:?} is not a host name (letters, digits, '-' and '.', with an \
                 optional :PORT)"
            ));
        }
    }
    if let Some(port) = port {
        match port.parse::<u16>() {
            Ok(p) if p > 0 && port.chars().all(|c| c.is_ascii_digit()) => {}
            _ => {
                return Err(format!(
                    "registry {reg:?} has a bad port {port:?} (1 to 65535)"
                ))
            }
        }
    }
    Ok(())
}

/// One path component: lowercase letters and digits, separated by `.`, `_`, `__` or dashes.
fn check_component(comp: &str) -> Result<(), String> {
    if comp.is_empty() {
        return Err("has an empty path component ('//' or a trailing '/')".into());
    }
    if comp.chars().any(|c| c.is_ascii_uppercase()) {
        return Err(format!(
            "repository component {comp:?} has uppercase letters; repository names are lowercase"
        ));
    }
    let bytes = comp.as_bytes();
    let alnum = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    if !alnum(bytes[0]) || !alnum(bytes[bytes.len() - 1]) {
        return Err(format!(
            "repository component {comp:?} must start and end with a letter or digit"
        ));
    }
    let mut i = 0;
    while i < bytes.len() {
        if alnum(bytes[i]) {
            i += 1;
            continue;
        }
        let start = i;
        while i < bytes.len() && !alnum(bytes[i]) {
            i += 1;
        }
        let sep = &comp[start..i];
        let ok = matches!(sep, "." | "_" | "__") || sep.chars().all(|c| c == '-');
        if !ok {
            return Err(format!(
                "repository component {comp:?} has {sep:?}; use letters, digits and single \
                 '.', '_' or '__', or dashes between them"
            ));
        }
    }
    Ok(())
}

fn check_tag(tag: &str) -> Result<(), String> {
    let ok_first = tag
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
    if !ok_first
        || tag.len() > MAX_TAG
        || !tag
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
    {
        return Err(format!(
            "tag {tag:?} is not valid (1 to {MAX_TAG} letters, digits, '_', '.' or '-', not \
             starting with '.' or '-')"
        ));
    }
    Ok(())
}

fn check_digest(d: &str) -> Result<String, String> {
    let Some(hex) = d.strip_prefix("sha256:") else {
        return Err(format!(
            "digest {d:?} is not sha256:<64 hex digits> (the only algorithm supported)"
        ));
    };
    if hex.len() != 64
        || !hex
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        return Err(format!(
            "digest {d:?} is not sha256:<64 lowercase hex digits>"
        ));
    }
    Ok(d.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    fn p(s: &str) -> ImageRef {
        s.parse().unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn reads_every_spelling() {
        for (written, canon, api) in [
            (
                "ubuntu:24.04",
                "docker.io/library/ubuntu:24.04",
                "registry-1.docker.io",
            ),
            (
                "ubuntu",
                "docker.io/library/ubuntu:latest",
                "registry-1.docker.io",
            ),
            (
                "docker://alpine",
                "docker.io/library/alpine:latest",
                "registry-1.docker.io",
            ),
            (
                "docker://nvcr.io/nvidia/pytorch:24.05-py3",
                "nvcr.io/nvidia/pytorch:24.05-py3",
                "nvcr.io",
            ),
            (
                "nvcr.io#nvidia/pytorch:24.05-py3",
                "nvcr.io/nvidia/pytorch:24.05-py3",
                "nvcr.io",
            ),
            (
                "team/app",
                "docker.io/team/app:latest",
                "registry-1.docker.io",
            ),
            (
                "localhost:5000/team/app",
                "localhost:5000/team/app:latest",
                "localhost:5000",
            ),
            (
                "127.0.0.1:5000/test/img:tag",
                "127.0.0.1:5000/test/img:tag",
                "127.0.0.1:5000",
            ),
            ("localhost/app", "localhost/app:latest", "localhost"),
            (
                "Registry.Example.COM/a/b__c/d-e--f",
                "registry.example.com/a/b__c/d-e--f:latest",
                "registry.example.com",
            ),
            ("[::1]:5000/x", "[::1]:5000/x:latest", "[::1]:5000"),
        ] {
            let r = p(written);
            assert_eq!(r.to_string(), canon, "{written}");
            assert_eq!(r.api_host(), api, "{written}");
            assert_eq!(p(canon), r, "canonical form of {written} parses back");
        }
        let r = p(&format!("localhost:5000/team/app@{D}"));
        assert_eq!((r.tag.as_deref(), r.digest.as_deref()), (None, Some(D)));
        assert_eq!(r.reference(), D);
        let r = p(&format!("app:v1@{D}"));
        assert_eq!((r.tag.as_deref(), r.reference()), (Some("v1"), D));
        assert_eq!(p("localhost:5000/a").host(), "localhost");
        assert_eq!(p("[::1]:5000/x").host(), "::1");
    }

    #[test]
    fn tells_explicit_references() {
        for s in [
            "docker://a",
            "nvcr.io#a/b",
            "nvcr.io/a",
            "localhost:5000/a",
            "localhost/a",
        ] {
            assert!(ImageRef::is_explicit(s), "{s}");
        }
        for s in ["ubuntu:24.04", "tiny", "team/app", "host"] {
            assert!(!ImageRef::is_explicit(s), "{s}");
        }
    }

    #[test]
    fn names_what_is_wrong() {
        let long = format!("a/{}", "b".repeat(300));
        for (s, why) in [
            ("", "empty"),
            ("Ubuntu", "lowercase"),
            ("a b", "contains ' '"),
            ("ubuntu:", "tag \"\""),
            ("ubuntu:-x", "tag"),
            ("ubuntu:a/b", "bad port"),
            ("a//b", "empty path component"),
            ("a/", "empty path component"),
            ("-a", "start and end"),
            ("a..b", "\"..\""),
            ("a@sha256:abc", "64"),
            ("a@md5:abc", "only algorithm"),
            ("#a", "nothing before '#'"),
            ("bad_host!#a", "not a host name"),
            ("localhost:99999/a", "bad port"),
            ("localhost:x/a", "bad port"),
            ("oci://x", "docker:// transport"),
            ("nvcr.io/", "no repository"),
            (long.as_str(), "longer than"),
        ] {
            let err = s.parse::<ImageRef>().expect_err(s);
            assert!(err.contains(why), "{s}: {err}");
            assert!(err.starts_with("image reference"), "{err}");
        }
    }
}
