//! A small HTTP/1 client for the `/v1` API over the controller's Unix socket or TCP, used by the
//! CLI and the agent. One connection per request: calls are rare and this keeps failure
//! handling simple (a controller restart never leaves a dead pooled connection behind).

use std::path::PathBuf;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::Request;
use hyper_util::rt::TokioIo;
use serde::de::DeserializeOwned;
use serde::Serialize;
use wharf_api::wire::{ApiError, CONTROLLER_TLS_NAME};

/// Where the controller listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    /// A Unix socket path.
    Unix(PathBuf),
    /// `host:port`.
    Tcp(String),
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Endpoint::Unix(p) => write!(f, "{}", p.display()),
            Endpoint::Tcp(a) => write!(f, "tcp://{a}"),
        }
    }
}

impl Endpoint {
    /// Parses `tcp://host:port`, `host:port` or a socket path.
    pub fn parse(text: &str) -> Endpoint {
        if let Some(addr) = text.strip_prefix("tcp://") {
            Endpoint::Tcp(addr.to_string())
        } else if !text.contains('/') && text.contains(':') {
            Endpoint::Tcp(text.to_string())
        } else {
            Endpoint::Unix(PathBuf::from(text))
        }
    }
}

/// A failed call.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// No connection could be made.
    #[error("cannot reach the Wharf controller at {endpoint}: {err} (is `wharf controller` or `wharf dev` running? set WHARF_SOCKET to its socket)")]
    Unreachable {
        /// Where we tried.
        endpoint: Endpoint,
        /// Why it failed.
        err: std::io::Error,
    },
    /// The TCP port's TLS failed, or took longer than [`CONNECT_TIMEOUT`].
    #[error("no TLS with the controller at {endpoint}: {err}{}", tls_hint(.err))]
    Tls {
        /// Where we tried.
        endpoint: Endpoint,
        /// Why it failed.
        err: std::io::Error,
    },
    /// A TCP endpoint without the controller's authority: a user's tool, which has no
    /// business there (users reach the controller over its Unix socket).
    #[error("{endpoint}: the controller's TCP port is for node agents, which check it with its certificate authority; users reach the controller over its Unix socket")]
    NotForUsers {
        /// The endpoint given.
        endpoint: Endpoint,
    },
    /// The controller answered with an error.
    #[error("{}", .error.error)]
    Api {
        /// HTTP status.
        status: u16,
        /// The error body.
        error: ApiError,
    },
    /// The exchange broke or the answer made no sense.
    #[error("talking to the controller: {0}")]
    Protocol(String),
}

/// What to look at for a failed handshake: the authority for a certificate that does not
/// verify, the controller's version for an answer that is not TLS at all.
fn tls_hint(err: &std::io::Error) -> &'static str {
    match err
        .get_ref()
        .and_then(|e| e.downcast_ref::<rustls::Error>())
    {
        Some(rustls::Error::InvalidCertificate(_)) => {
            " (is the agent's controller_ca a copy of this controller's ca.pem?)"
        }
        Some(rustls::Error::InvalidMessage(_) | rustls::Error::InappropriateMessage { .. }) => {
            " (is the controller older, speaking plain HTTP on its TCP port? upgrade it)"
        }
        _ => "",
    }
}

/// Longest a connection and its TLS handshake may take: a controller that stops answering
/// mid-handshake is given up on and tried again, never waited on for ever.
pub const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

impl ClientError {
    /// True when retrying later may help (controller down or restarting; a TLS failure too,
    /// which an agent keeps logging: a restart with the right authority, or the controller's
    /// upgrade, mends it).
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            ClientError::Unreachable { .. } | ClientError::Tls { .. } | ClientError::Protocol(_)
        )
    }

    /// True when the controller did not know the credential (401): for an agent, its node's
    /// key, which it then replaces by joining again.
    pub fn is_unauthorized(&self) -> bool {
        matches!(self, ClientError::Api { status: 401, .. })
    }

    /// True when an agent retries later: the controller is away, or the node is joining
    /// again (see [`ClientError::is_unauthorized`]), as for a node cut off from it.
    pub fn agent_retries(&self) -> bool {
        self.is_transient() || self.is_unauthorized()
    }
}

/// `n` random bytes from the kernel, as lower-case hex: join tokens, node keys, the tokens
/// that make a submit idempotent.
pub fn random_hex(n: usize) -> std::io::Result<String> {
    use std::io::Read;
    let mut buf = vec![0u8; n];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut buf)?;
    Ok(buf.iter().map(|b| format!("{b:02x}")).collect())
}

/// How a client checks the controller's TCP port: by the controller's own certificate
/// authority (its `ca.pem`), for the name [`CONTROLLER_TLS_NAME`] whatever the address.
#[derive(Debug, Clone)]
pub struct Tls(std::sync::Arc<rustls::ClientConfig>);

/// The cryptography both ends of the TCP port use.
pub fn tls_provider() -> std::sync::Arc<rustls::crypto::CryptoProvider> {
    std::sync::Arc::new(rustls::crypto::ring::default_provider())
}

/// The certificates of the authority in `ca_file` (PEM), as roots of trust; an error names
/// the file.
pub fn tls_roots(ca_file: &std::path::Path) -> Result<rustls::RootCertStore, String> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::CertificateDer;
    let what = |e: &dyn std::fmt::Display| format!("{}: {e}", ca_file.display());
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca_file).map_err(|e| what(&e))? {
        roots
            .add(cert.map_err(|e| what(&e))?)
            .map_err(|e| what(&e))?;
    }
    if roots.is_empty() {
        return Err(what(&"holds no certificate"));
    }
    Ok(roots)
}

impl Tls {
    /// Trusts the certificate authority in `ca_file` (PEM) and nothing else.
    pub fn from_ca_file(ca_file: &std::path::Path) -> Result<Tls, String> {
        let roots = tls_roots(ca_file)?;
        let config = rustls::ClientConfig::builder_with_provider(tls_provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| format!("{}: {e}", ca_file.display()))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        Ok(Tls(std::sync::Arc::new(config)))
    }

    /// The settings, for a client of another kind (a test's own TLS stream).
    pub fn config(&self) -> std::sync::Arc<rustls::ClientConfig> {
        self.0.clone()
    }
}

/// A client for one controller.
#[derive(Debug, Clone)]
pub struct Client {
    endpoint: Endpoint,
    /// Shared by the client's clones, so that a new one reaches them all.
    token: Option<std::sync::Arc<std::sync::RwLock<String>>>,
    /// How the TCP port is checked; a TCP endpoint without it is not called.
    tls: Option<Tls>,
}

impl Client {
    /// A client; `token` is sent as a bearer token (agents).
    pub fn new(endpoint: Endpoint, token: Option<String>) -> Client {
        Client {
            endpoint,
            token: token.map(|t| std::sync::Arc::new(std::sync::RwLock::new(t))),
            tls: None,
        }
    }

    /// Checks a TCP endpoint's controller with `tls`.
    pub fn with_tls(mut self, tls: Tls) -> Client {
        self.tls = Some(tls);
        self
    }

    /// Sends `token` from now on, from this client and every clone of it (one made with a
    /// token; one made without stays without).
    pub fn set_token(&self, token: String) {
        if let Some(t) = &self.token {
            *t.write().unwrap_or_else(|p| p.into_inner()) = token;
        }
    }

    /// The endpoint.
    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    /// `GET path`.
    pub async fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T, ClientError> {
        self.call("GET", path, None).await
    }

    /// `POST path` with a JSON body.
    pub async fn post<B: Serialize, T: DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
    ) -> Result<T, ClientError> {
        let bytes = serde_json::to_vec(body).map_err(|e| ClientError::Protocol(e.to_string()))?;
        self.call("POST", path, Some(bytes)).await
    }

    /// `GET path`, the answer's body unparsed: for a caller that parses it borrowing from it
    /// (a long listing), or that takes more than one form of answer.
    pub async fn get_bytes(&self, path: &str) -> Result<Bytes, ClientError> {
        self.call_raw("GET", path, None).await
    }

    async fn call<T: DeserializeOwned>(
        &self,
        method: &str,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<T, ClientError> {
        let bytes = self.call_raw(method, path, body).await?;
        serde_json::from_slice(&bytes)
            .map_err(|e| ClientError::Protocol(format!("bad answer: {e}")))
    }

    /// A call's successful answer, unparsed; an error answer as [`ClientError::Api`].
    async fn call_raw(
        &self,
        method: &str,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<Bytes, ClientError> {
        let unreachable = |err| ClientError::Unreachable {
            endpoint: self.endpoint.clone(),
            err,
        };
        let proto = |e: hyper::Error| ClientError::Protocol(e.to_string());
        let mut req = Request::builder()
            .method(method)
            .uri(path)
            .header("host", "wharf")
            .header("content-type", "application/json");
        if let Some(t) = &self.token {
            let t = t.read().unwrap_or_else(|p| p.into_inner());
            req = req.header("authorization", format!("Bearer {t}"));
        }
        let req = req
            .body(Full::new(Bytes::from(body.unwrap_or_default())))
            .map_err(|e| ClientError::Protocol(e.to_string()))?;
        let resp = match &self.endpoint {
            Endpoint::Unix(p) => {
                let stream = tokio::net::UnixStream::connect(p)
                    .await
                    .map_err(unreachable)?;
                send(stream, req).await.map_err(proto)?
            }
            Endpoint::Tcp(a) => {
                let Some(Tls(tls)) = &self.tls else {
                    return Err(ClientError::NotForUsers {
                        endpoint: self.endpoint.clone(),
                    });
                };
                let late = || std::io::Error::new(std::io::ErrorKind::TimedOut, "timed out");
                let stream =
                    tokio::time::timeout(CONNECT_TIMEOUT, tokio::net::TcpStream::connect(a))
                        .await
                        .unwrap_or_else(|_| Err(late()))
                        .map_err(unreachable)?;
                let _ = stream.set_nodelay(true);
                let name = rustls::pki_types::ServerName::try_from(CONTROLLER_TLS_NAME)
                    .map_err(|e| ClientError::Protocol(e.to_string()))?;
                let handshake = tokio_rustls::TlsConnector::from(tls.clone()).connect(name, stream);
                let stream = tokio::time::timeout(CONNECT_TIMEOUT, handshake)
                    .await
                    .unwrap_or_else(|_| Err(late()))
                    .map_err(|err| ClientError::Tls {
                        endpoint: self.endpoint.clone(),
                        err,
                    })?;
                send(stream, req).await.map_err(proto)?
            }
        };
        let status = resp.status().as_u16();
        let bytes = resp.into_body().collect().await.map_err(proto)?.to_bytes();
        if (200..300).contains(&status) {
            Ok(bytes)
        } else {
            let error = serde_json::from_slice(&bytes).unwrap_or_else(|_| ApiError {
                error: format!("HTTP {status}: {}", String::from_utf8_lossy(&bytes)),
                kind: wharf_api::wire::ErrorKind::Internal,
            });
            Err(ClientError::Api { status, error })
        }
    }
}

async fn send<S>(
    stream: S,
    req: Request<Full<Bytes>>,
) -> Result<hyper::Response<hyper::body::Incoming>, hyper::Error>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(conn);
    sender.send_request(req).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_authority_file_without_a_certificate_is_named_and_refused() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("ca.pem");
        let e = Tls::from_ca_file(&missing).unwrap_err();
        assert!(e.contains(&*missing.to_string_lossy()), "{e}");
        std::fs::write(&missing, "not a certificate\n").unwrap();
        let e = Tls::from_ca_file(&missing).unwrap_err();
        assert!(e.contains("holds no certificate"), "{e}");
        std::fs::write(
            &missing,
            "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        assert!(Tls::from_ca_file(&missing).is_err());
    }

    #[tokio::test]
    async fn a_tcp_endpoint_is_not_called_without_tls() {
        let c = Client::new(Endpoint::Tcp("127.0.0.1:1".into()), None);
        let e = c.get::<serde_json::Value>("/v1/jobs").await.unwrap_err();
        assert!(e.to_string().contains("Unix socket"), "{e}");
    }
}
