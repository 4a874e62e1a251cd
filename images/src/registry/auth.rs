//! Registry authentication: the `WWW-Authenticate` challenge, bearer tokens and basic
//! credentials, as Docker's token specification describes them.

use std::collections::BTreeMap;

use base64::Engine;

use crate::error::{ErrorKind, ImageError, Result};

/// A user name and password (or token) for one registry.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    /// User name.
    pub username: String,
    /// Password or access token.
    pub password: String,
}

impl std::fmt::Debug for Credentials {
    /// Never shows the password.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("username", &self.username)
            .finish_non_exhaustive()
    }
}

impl Credentials {
    /// The `Authorization` value for HTTP basic authentication.
    pub(crate) fn basic(&self) -> String {
        let raw = format!("{}:{}", self.username, self.password);
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(raw)
        )
    }

    /// Reads the `auth` field of a Docker `config.json` entry (base64 of `user:password`).
    pub fn from_docker_auth(auth: &str) -> Result<Credentials> {
        let bad =
            || ImageError::invalid("a registry credential's `auth` is not base64 of USER:PASSWORD");
        let raw = base64::engine::general_purpose::STANDARD
            .decode(auth.trim())
            .map_err(|_| bad())?;
        let text = String::from_utf8(raw).map_err(|_| bad())?;
        let (user, pass) = text.split_once(':').ok_or_else(bad)?;
        Ok(Credentials {
            username: user.to_string(),
            password: pass.to_string(),
        })
    }
}

/// A parsed `WWW-Authenticate` challenge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Challenge {
    /// Ask `realm` for a token for `service` and `scope`.
    Bearer {
        realm: String,
        service: Option<String>,
        scope: Option<String>,
    },
    /// Send credentials with every request.
    Basic,
}

/// Parses a challenge header; `None` when it is neither a bearer nor a basic challenge.
pub(crate) fn parse_challenge(header: &str) -> Option<Challenge> {
    let (scheme, rest) = header.trim().split_once(' ').unwrap_or((header.trim(), ""));
    let params = parse_params(rest);
    match scheme.to_ascii_lowercase().as_str() {
        "bearer" => Some(Challenge::Bearer {
            realm: params.get("realm")?.clone(),
            service: params.get("service").cloned(),
            scope: params.get("scope").cloned(),
        }),
        "basic" => Some(Challenge::Basic),
        _ => None,
    }
}

/// `key="value",key=value` pairs; quoted values may hold commas.
fn parse_params(s: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut rest = s.trim();
    while !rest.is_empty() {
        let Some((key, after)) = rest.split_once('=') else {
            break;
        };
        let key = key
            .trim()
            .trim_start_matches(',')
            .trim()
            .to_ascii_lowercase();
        let (value, after) = if let Some(q) = after.strip_prefix('"') {
            match q.find('"') {
                Some(end) => (&q[..end], &q[end + 1..]),
                None => (q, ""),
            }
        } else {
            match after.find(',') {
                Some(end) => (&after[..end], &after[end..]),
                None => (after, ""),
            }
        };
        out.insert(key, value.to_string());
        rest = after.trim_start_matches([',', ' ']);
    }
    out
}

/// Fetches a bearer token from `realm` for `service` and `scope`, with `creds` when given
/// (anonymous otherwise); returns the `Authorization` value.
pub(crate) fn fetch_token(
    agent: &ureq::Agent,
    realm: &str,
    service: Option<&str>,
    scope: &str,
    creds: Option<&Credentials>,
) -> Result<String> {
    let mut req = agent.get(realm).query("scope", scope);
    if let Some(service) = service {
        req = req.query("service", service);
    }
    if let Some(c) = creds {
        req = req.set("Authorization", &c.basic());
    }
    let resp = match req.call() {
        Ok(r) => r,
        Err(ureq::Error::Status(code @ (401 | 403), _)) => {
            return Err(ImageError::new(
                ErrorKind::Refused,
                format!(
                    "the registry's token service {realm} refused {} (HTTP {code})",
                    if creds.is_some() {
                        "the credentials"
                    } else {
                        "an anonymous token; the image may need credentials"
                    }
                ),
            ))
        }
        Err(e) => {
            return Err(ImageError::new(
                ErrorKind::Unreachable,
                format!("asking {realm} for a token: {e}"),
            ))
        }
    };
    #[derive(serde::Deserialize)]
    struct Token {
        token: Option<String>,
        access_token: Option<String>,
    }
    let mut body = Vec::new();
    std::io::Read::read_to_end(
        &mut std::io::Read::take(resp.into_reader(), 1 << 20),
        &mut body,
    )
    .map_err(|e| {
        ImageError::new(
            ErrorKind::Unreachable,
            format!("reading a token from {realm}: {e}"),
        )
    })?;
    let token: Token = serde_json::from_slice(&body).map_err(|e| {
        ImageError::invalid(format!("the token from {realm} is not valid JSON: {e}"))
    })?;
    token
        .token
        .or(token.access_token)
        .filter(|t| !t.is_empty())
        .map(|t| format!("Bearer {t}"))
        .ok_or_else(|| ImageError::invalid(format!("the answer from {realm} holds no token")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_challenges() {
        let c = parse_challenge(
            r#"Bearer realm="https://auth.docker.io/token",service="registry.docker.io",scope="repository:library/ubuntu:pull,push""#,
        );
        assert_eq!(
            c,
            Some(Challenge::Bearer {
                realm: "https://auth.docker.io/token".into(),
                service: Some("registry.docker.io".into()),
                scope: Some("repository:library/ubuntu:pull,push".into()),
            })
        );
        assert_eq!(
            parse_challenge(r#"Basic realm="Registry Realm""#),
            Some(Challenge::Basic)
        );
        assert_eq!(parse_challenge("Negotiate"), None);
        assert_eq!(
            parse_challenge("Bearer service=x"),
            None,
            "a bearer needs a realm"
        );
    }

    #[test]
    fn reads_docker_auth_and_hides_passwords() {
        let c = Credentials::from_docker_auth("dXNlcjpwYTpzcw==").unwrap();
        assert_eq!(
            (c.username.as_str(), c.password.as_str()),
            ("user", "pa:ss")
        );
        assert!(!format!("{c:?}").contains("pa:ss"));
        assert_eq!(c.basic(), "Basic dXNlcjpwYTpzcw==");
        assert!(Credentials::from_docker_auth("!!").is_err());
        assert!(Credentials::from_docker_auth("bm9jb2xvbg==").is_err());
    }
}
