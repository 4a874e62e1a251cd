//! A client of the OCI distribution API (v2): manifests and blobs of one repository, with
//! anonymous bearer tokens or basic credentials.
//!
//! Built on `ureq`, a small blocking HTTP client with rustls: a blob's body is a plain
//! [`Read`], so it streams straight through digest checks and the decompressor into the safe
//! unpacker, with no async runtime to bridge, and the crate compiles in a fraction of the time
//! of an async stack. HTTPS always, except for loopback registries (`localhost`, `127.0.0.0/8`,
//! `::1`) and those the site lists as insecure (`[images] insecure_registries`), spoken to over
//! plain HTTP.
//!
//! ```no_run
//! use wharf_images::registry::{Registry, RegistryOptions};
//! let reference = "127.0.0.1:5000/test/img:v1".parse().unwrap();
//! let registry = Registry::new(&reference, &RegistryOptions::default());
//! let manifest = registry.manifest(reference.reference(), 4 << 20)?;
//! println!("{} {}", manifest.media_type, manifest.digest);
//! # Ok::<(), wharf_images::ImageError>(())
//! ```

use std::collections::BTreeMap;
use std::io::Read;
use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

use wharf_api::image_ref::{host_of, ImageRef};

use crate::error::{ErrorKind, ImageError, Result};
use crate::stream::sha256_digest;

mod auth;
pub mod authfile;

pub use auth::Credentials;
use auth::{fetch_token, parse_challenge, Challenge};
use authfile::AuthFile;

/// Manifest and index media types asked for, in order of preference.
const ACCEPT: &str = "application/vnd.oci.image.index.v1+json, \
     application/vnd.docker.distribution.manifest.list.v2+json, \
     application/vnd.oci.image.manifest.v1+json, \
     application/vnd.docker.distribution.manifest.v2+json";

/// How a node talks to registries: `[images]` in the configuration.
#[derive(Debug, Clone)]
pub struct RegistryOptions {
    /// Registries (`host` or `host:port`) spoken to over plain HTTP besides loopback ones.
    pub insecure: Vec<String>,
    /// Credentials per registry (`host` or `host:port`, as in references): the site's, from
    /// `[images] auth_file`, for registries and mirrors alike.
    pub credentials: BTreeMap<String, Credentials>,
    /// Mirrors per registry (`docker.io`), tried in order before it: `http://host[:port]`,
    /// `https://host[:port]`, or `host[:port]` (HTTPS unless loopback or insecure).
    pub mirrors: BTreeMap<String, Vec<String>>,
    /// The credential of the user this pull is for, for the reference's own registry: used
    /// there in place of the site's, never sent to a mirror.
    pub user: Option<Credentials>,
    /// Longest wait to connect, and between two reads of an answer.
    pub timeout: Duration,
}

impl Default for RegistryOptions {
    fn default() -> Self {
        RegistryOptions {
            insecure: vec![],
            credentials: BTreeMap::new(),
            mirrors: BTreeMap::new(),
            user: None,
            timeout: Duration::from_secs(60),
        }
    }
}

/// Where a pull may fetch an image from: a mirror of its registry, or the registry itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Source {
    /// `http` or `https`.
    pub scheme: &'static str,
    /// `host[:port]` to connect to.
    pub host: String,
    /// A mirror (else the reference's own registry).
    pub mirror: bool,
}

/// Parses a mirror as `[images] mirrors` writes it: `http://host[:port]`,
/// `https://host[:port]` or `host[:port]`; `None` for the scheme when none is written.
pub fn parse_mirror(text: &str) -> std::result::Result<(Option<&'static str>, String), String> {
    let (scheme, rest) = if let Some(r) = text.strip_prefix("http://") {
        (Some("http"), r)
    } else if let Some(r) = text.strip_prefix("https://") {
        (Some("https"), r)
    } else if text.contains("://") {
        return Err(format!(
            "mirror {text:?}: only http:// and https:// are spoken"
        ));
    } else {
        (None, text)
    };
    let host = rest.trim_end_matches('/');
    let valid = !host.is_empty()
        && host.len() <= 255
        && host
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || ".-:[]".contains(c));
    if !valid {
        return Err(format!(
            "mirror {text:?}: write it as http://HOST[:PORT], https://HOST[:PORT] or \
             HOST[:PORT] (no path: the mirror serves the registry's repositories at its root)"
        ));
    }
    Ok((scheme, host.to_ascii_lowercase()))
}

impl RegistryOptions {
    /// Reads credentials from a Docker `config.json`-style file: `{"auths": {"REGISTRY":
    /// {"auth": "<base64 of USER:PASSWORD>"}}}` (also `username` and `password` fields).
    ///
    /// Errors: `NotFound`/`PermissionDenied` reading it; `InvalidInput` when malformed.
    pub fn read_auth_file(path: &Path) -> Result<BTreeMap<String, Credentials>> {
        AuthFile::read(path)?
            .all()
            .map_err(|e| ImageError::invalid(format!("{}: {e}", path.display())))
    }

    /// Where to fetch `reference` from, in order: its registry's mirrors, then the registry.
    ///
    /// Errors: `InvalidInput` for a mirror written wrong.
    pub fn sources(&self, reference: &ImageRef) -> Result<Vec<Source>> {
        let mut out = Vec::new();
        for m in self.mirrors.get(&reference.registry).into_iter().flatten() {
            let (scheme, host) = parse_mirror(m).map_err(ImageError::invalid)?;
            let scheme = scheme.unwrap_or(if self.is_insecure(&host) {
                "http"
            } else {
                "https"
            });
            out.push(Source {
                scheme,
                host,
                mirror: true,
            });
        }
        out.push(Source {
            scheme: if self.is_insecure(&reference.registry) {
                "http"
            } else {
                "https"
            },
            host: reference.api_host().to_string(),
            mirror: false,
        });
        Ok(out)
    }

    /// Whether `registry` is spoken to over plain HTTP.
    pub fn is_insecure(&self, registry: &str) -> bool {
        let host = host_of(registry);
        host == "localhost"
            || host == "::1"
            || host
                .parse::<std::net::Ipv4Addr>()
                .is_ok_and(|a| a.is_loopback())
            || self
                .insecure
                .iter()
                .any(|i| i.eq_ignore_ascii_case(registry) || i.eq_ignore_ascii_case(host))
    }
}

/// A manifest or index as the registry served it, checked against its digest.
#[derive(Debug, Clone)]
pub struct Fetched {
    /// The `Content-Type` the registry gave.
    pub media_type: String,
    /// `sha256:<hex>` of `bytes`.
    pub digest: String,
    /// The document.
    pub bytes: Vec<u8>,
}

/// One repository of one registry (or of a mirror of it). Tokens are fetched on the first
/// `401` and reused.
#[derive(Debug)]
pub struct Registry {
    agent: ureq::Agent,
    /// `http(s)://host[:port]/v2/<repository>`.
    base: String,
    /// `registry/repository` (and the mirror's host), for messages.
    name: String,
    repository: String,
    creds: Option<Credentials>,
    /// The `Authorization` value that worked last.
    auth: Mutex<Option<String>>,
    /// Whether credentials were sent in answer to a challenge that was then met.
    authenticated: std::sync::atomic::AtomicBool,
}

impl Registry {
    /// A client for `reference`'s repository at its own registry.
    pub fn new(reference: &ImageRef, opts: &RegistryOptions) -> Registry {
        let upstream = Source {
            scheme: if opts.is_insecure(&reference.registry) {
                "http"
            } else {
                "https"
            },
            host: reference.api_host().to_string(),
            mirror: false,
        };
        Registry::at(reference, &upstream, opts)
    }

    /// A client for `reference`'s repository at `source`. The registry itself gets the
    /// user's credential if the options carry one, else the site's for it; a mirror only the
    /// site's credential for the mirror's own host.
    pub fn at(reference: &ImageRef, source: &Source, opts: &RegistryOptions) -> Registry {
        let agent = ureq::AgentBuilder::new()
            .timeout_connect(opts.timeout)
            .timeout_read(opts.timeout)
            .user_agent(concat!("wharf/", env!("CARGO_PKG_VERSION")))
            // Blob stores redirect; credentials follow to the same host only.
            .redirect_auth_headers(ureq::RedirectAuthHeaders::SameHost)
            .build();
        let site = |key: &str| {
            opts.credentials
                .get(key)
                .or_else(|| opts.credentials.get(host_of(key)))
                .cloned()
        };
        let (creds, name) = if source.mirror {
            (
                site(&source.host),
                format!(
                    "{}/{} (mirror {})",
                    reference.registry, reference.repository, source.host
                ),
            )
        } else {
            (
                opts.user.clone().or_else(|| site(&reference.registry)),
                format!("{}/{}", reference.registry, reference.repository),
            )
        };
        Registry {
            agent,
            base: format!(
                "{}://{}/v2/{}",
                source.scheme, source.host, reference.repository
            ),
            name,
            repository: reference.repository.clone(),
            creds,
            auth: Mutex::new(None),
            authenticated: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Whether this client had to send credentials (the user's or the site's) to be
    /// answered: the image is then taken for private.
    pub fn authenticated(&self) -> bool {
        self.authenticated.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Asks (`HEAD`) whether the repository serves manifest `digest` to this client's
    /// credentials: proof of access to that content without fetching it.
    ///
    /// Errors: as [`Registry::manifest`]; `InvalidInput` when the registry names another
    /// digest.
    pub fn has_manifest(&self, digest: &str) -> Result<()> {
        let what = format!("manifest {digest} of {}", self.name);
        let resp = self.request(
            "HEAD",
            &format!("{}/manifests/{digest}", self.base),
            Some(ACCEPT),
            &what,
        )?;
        match resp.header("Docker-Content-Digest") {
            Some(d) if d.trim() != digest => Err(ImageError::invalid(format!(
                "{what}: the registry answers for {d}; refused"
            ))),
            _ => Ok(()),
        }
    }

    /// Fetches the manifest or index `reference` (a tag or a digest), at most `max` bytes,
    /// and checks it against the digest when `reference` is one.
    ///
    /// Errors: `NotFound` (no such tag or repository), `Refused` (credentials needed or
    /// refused), `InvalidInput` (too large, wrong digest), `Unreachable`.
    pub fn manifest(&self, reference: &str, max: u64) -> Result<Fetched> {
        let what = format!("manifest {reference} of {}", self.name);
        let resp = self.get(
            &format!("{}/manifests/{reference}", self.base),
            Some(ACCEPT),
            &what,
        )?;
        let media_type = resp
            .header("Content-Type")
            .unwrap_or("")
            .split(';')
            .next()
            .unwrap_or("")
            .trim()
            .to_string();
        let mut bytes = Vec::new();
        resp.into_reader()
            .take(max + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| ImageError::new(ErrorKind::Unreachable, format!("reading {what}: {e}")))?;
        if bytes.len() as u64 > max {
            return Err(ImageError::invalid(format!(
                "{what} is larger than {max} bytes; refused"
            )));
        }
        let digest = sha256_digest(&bytes);
        if reference.starts_with("sha256:") && digest != reference {
            return Err(ImageError::invalid(format!(
                "{what}: the registry's answer hashes to {digest}; refused"
            )));
        }
        Ok(Fetched {
            media_type,
            digest,
            bytes,
        })
    }

    /// Opens blob `digest` as a stream; the caller checks its size and digest as it reads.
    ///
    /// Errors: as [`Registry::manifest`].
    pub fn blob(&self, digest: &str) -> Result<Box<dyn Read + Send + Sync>> {
        let what = format!("blob {digest} of {}", self.name);
        let url = format!("{}/blobs/{digest}", self.base);
        let resp = self.get(&url, None, &what)?;
        Ok(Box::new(Download {
            agent: self.agent.clone(),
            auth: self.auth.lock().map(|a| a.clone()).unwrap_or(None),
            url,
            inner: resp.into_reader(),
            what,
            read: 0,
            resumes: 0,
        }))
    }

    /// GET `url`, authenticating on a `401` as the registry asks, once.
    fn get(&self, url: &str, accept: Option<&str>, what: &str) -> Result<ureq::Response> {
        self.request("GET", url, accept, what)
    }

    /// `method` `url`, authenticating on a `401` as the registry asks, once.
    fn request(
        &self,
        method: &str,
        url: &str,
        accept: Option<&str>,
        what: &str,
    ) -> Result<ureq::Response> {
        let send = |auth: Option<&str>| {
            let mut req = self.agent.request(method, url);
            if let Some(a) = accept {
                req = req.set("Accept", a);
            }
            if let Some(a) = auth {
                req = req.set("Authorization", a);
            }
            // Boxed: ureq's error is large, and only the unhappy path carries it.
            req.call().map_err(Box::new)
        };
        let cached = self.auth.lock().map(|a| a.clone()).unwrap_or(None);
        match send(cached.as_deref()).map_err(|e| *e) {
            Ok(r) => Ok(r),
            Err(ureq::Error::Status(401, resp)) => {
                let challenge = resp.header("WWW-Authenticate").map(str::to_string);
                let auth = self.authenticate(challenge.as_deref(), what)?;
                let answer = send(Some(&auth));
                if answer.is_ok() {
                    if self.creds.is_some() {
                        self.authenticated
                            .store(true, std::sync::atomic::Ordering::SeqCst);
                    }
                    if let Ok(mut a) = self.auth.lock() {
                        *a = Some(auth);
                    }
                }
                answer.map_err(|e| self.failure(*e, what))
            }
            Err(e) => Err(self.failure(e, what)),
        }
    }

    /// The `Authorization` value that answers `challenge`.
    fn authenticate(&self, challenge: Option<&str>, what: &str) -> Result<String> {
        match challenge.and_then(parse_challenge) {
            Some(Challenge::Bearer {
                realm,
                service,
                scope,
            }) => {
                let scope = scope.unwrap_or_else(|| format!("repository:{}:pull", self.repository));
                fetch_token(
                    &self.agent,
                    &realm,
                    service.as_deref(),
                    &scope,
                    self.creds.as_ref(),
                )
            }
            Some(Challenge::Basic) => match &self.creds {
                Some(c) => Ok(c.basic()),
                None => Err(ImageError::new(
                    ErrorKind::Refused,
                    format!(
                        "{what}: the registry requires credentials, and neither the job's user \
                         (their Docker or Podman auth file, sent with the submit) nor the node \
                         ([images] auth_file) has one for it"
                    ),
                )),
            },
            None => Err(ImageError::new(
                ErrorKind::Refused,
                format!("{what}: the registry refused access without saying how to authenticate"),
            )),
        }
    }

    /// An error of the registry's answer, with the reason it gave.
    fn failure(&self, err: ureq::Error, what: &str) -> ImageError {
        match err {
            ureq::Error::Status(code, resp) => {
                let reason = registry_reason(resp);
                let kind = match code {
                    404 => ErrorKind::NotFound,
                    401 | 403 => ErrorKind::Refused,
                    429 => ErrorKind::Unreachable,
                    400..=499 => ErrorKind::InvalidInput,
                    _ => ErrorKind::Unreachable,
                };
                let hint = match code {
                    401 => ": the credentials were refused",
                    _ => "",
                };
                ImageError::new(kind, format!("{what}: HTTP {code}{hint}{reason}"))
            }
            ureq::Error::Transport(t) => ImageError::new(
                ErrorKind::Unreachable,
                format!("{what}: cannot reach the registry: {t}"),
            ),
        }
    }
}

/// How many times one blob download is resumed after breaking off.
const MAX_RESUMES: u32 = 4;

/// A blob's body that resumes from the last byte read when the connection breaks off (a
/// `Range` request; a registry that ignores it is read again and the bytes already had are
/// skipped), after a short backoff, up to [`MAX_RESUMES`] times. Its read errors then say the
/// download broke off (`Unavailable`, worth a later retry), not that the content is bad,
/// whatever reader they pass through. The caller checks size and digest as ever.
struct Download {
    agent: ureq::Agent,
    auth: Option<String>,
    url: String,
    inner: Box<dyn Read + Send + Sync>,
    what: String,
    read: u64,
    resumes: u32,
}

impl Download {
    /// A body from byte `self.read` on.
    fn resume(&mut self) -> std::result::Result<Box<dyn Read + Send + Sync>, String> {
        let mut req = self
            .agent
            .get(&self.url)
            .set("Range", &format!("bytes={}-", self.read));
        if let Some(a) = &self.auth {
            req = req.set("Authorization", a);
        }
        let resp = req.call().map_err(|e| e.to_string())?;
        let from = format!("bytes {}-", self.read);
        match resp.status() {
            206 if resp
                .header("Content-Range")
                .is_some_and(|r| r.starts_with(&from)) =>
            {
                Ok(resp.into_reader())
            }
            200 => {
                let mut body = resp.into_reader();
                let skipped = std::io::copy(&mut (&mut body).take(self.read), &mut std::io::sink())
                    .map_err(|e| e.to_string())?;
                if skipped != self.read {
                    return Err("the blob is shorter than what was already read".into());
                }
                Ok(body)
            }
            code => Err(format!("HTTP {code} to a range request")),
        }
    }
}

impl Read for Download {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        loop {
            let err = match self.inner.read(buf) {
                Ok(n) => {
                    self.read += n as u64;
                    return Ok(n);
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => e.to_string(),
            };
            let mut why = err;
            while self.resumes < MAX_RESUMES {
                self.resumes += 1;
                std::thread::sleep(Duration::from_millis(200 << self.resumes));
                tracing::warn!(blob = %self.what, at = self.read, error = %why, "resuming a download");
                match self.resume() {
                    Ok(body) => {
                        self.inner = body;
                        why.clear();
                        break;
                    }
                    Err(e) => why = e,
                }
            }
            if !why.is_empty() {
                return Err(ImageError::new(
                    ErrorKind::Unreachable,
                    format!(
                        "downloading {} broke off after {} bytes and {} attempts to resume: \
                         {why}",
                        self.what, self.read, self.resumes
                    ),
                )
                .into_io());
            }
        }
    }
}

/// The registry's own words from an error body: `{"errors": [{"code", "message"}]}`.
fn registry_reason(resp: ureq::Response) -> String {
    #[derive(serde::Deserialize)]
    struct Body {
        #[serde(default)]
        errors: Vec<Item>,
    }
    #[derive(serde::Deserialize)]
    struct Item {
        #[serde(default)]
        code: String,
        #[serde(default)]
        message: String,
    }
    let mut bytes = Vec::new();
    let _ = resp.into_reader().take(64 << 10).read_to_end(&mut bytes);
    match serde_json::from_slice::<Body>(&bytes) {
        Ok(b) if !b.errors.is_empty() => {
            let items: Vec<String> = b
                .errors
                .iter()
                .map(|e| format!("{} ({})", e.message, e.code))
                .collect();
            format!(" ({})", wharf_api::text::bounded(&items.join("; "), 512))
        }
        _ => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_and_listed_registries_are_plain_http() {
        let opts = RegistryOptions {
            insecure: vec!["mirror.lan:5000".into(), "other.lan".into()],
            ..Default::default()
        };
        for r in [
            "localhost:5000",
            "127.0.0.1:5000",
            "127.1.2.3",
            "localhost",
            "mirror.lan:5000",
            "other.lan:443",
        ] {
            assert!(opts.is_insecure(r), "{r}");
        }
        for r in ["nvcr.io", "mirror.lan:5001", "docker.io", "10.0.0.1:5000"] {
            assert!(!opts.is_insecure(r), "{r}");
        }
    }

    #[test]
    fn reads_auth_files() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("auth.json");
        std::fs::write(
            &path,
            r#"{"auths": {"https://index.docker.io/v1/": {"auth": "dTpw"},
                "127.0.0.1:5000": {"username": "a", "password": "b"}}}"#,
        )
        .unwrap();
        let creds = RegistryOptions::read_auth_file(&path).unwrap();
        assert_eq!(creds["docker.io"].username, "u");
        assert_eq!(creds["127.0.0.1:5000"].password, "b");
        std::fs::write(&path, r#"{"auths": {"x": {}}}"#).unwrap();
        assert!(RegistryOptions::read_auth_file(&path)
            .unwrap_err()
            .message
            .contains("neither"));
    }
}
