//! Docker `config.json` and containers `auth.json` files: `{"auths": {"KEY": {"auth":
//! "<base64 of USER:PASSWORD>"}}}` (or `username` and `password` fields), with `credHelpers`
//! and `credsStore` naming credential helpers, which Wharf does not run.
//!
//! A key is a registry (`nvcr.io`, `127.0.0.1:5000`, Docker's `https://index.docker.io/v1/`)
//! or, as `containers-auth.json(5)` allows, a registry and a repository namespace
//! (`quay.io/team`); the longest key that covers a reference is its entry.

use std::collections::BTreeMap;
use std::path::Path;

use wharf_api::image_ref::ImageRef;

use super::auth::Credentials;
use crate::error::{ImageError, Result};

/// One parsed auth file.
#[derive(Debug, Clone, Default)]
pub struct AuthFile {
    /// Normalized key -> the entry's credentials, or why the entry is unusable.
    auths: BTreeMap<String, std::result::Result<Credentials, String>>,
    /// Normalized key -> helper name (`credHelpers`).
    helpers: BTreeMap<String, String>,
    /// The default helper (`credsStore`).
    store: Option<String>,
}

/// What an auth file holds for one reference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found {
    /// Credentials, under this key.
    Credentials(String, Credentials),
    /// Only a credential helper (`docker-credential-NAME`), which Wharf does not run.
    Helper(String),
    /// An entry that is not usable: why.
    Bad(String),
    /// Nothing for it.
    Nothing,
}

impl AuthFile {
    /// Reads and parses `path`.
    ///
    /// Errors: `NotFound`/`PermissionDenied` reading it; `InvalidInput` when it is not JSON
    /// of this shape.
    pub fn read(path: &Path) -> Result<AuthFile> {
        let bytes = std::fs::read(path).map_err(|e| ImageError::io(path.display(), e))?;
        AuthFile::parse(&bytes).map_err(|e| ImageError::invalid(format!("{}: {e}", path.display())))
    }

    /// Parses an auth file's bytes; the error says what is wrong.
    pub fn parse(bytes: &[u8]) -> std::result::Result<AuthFile, String> {
        #[derive(serde::Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct File {
            #[serde(default)]
            auths: BTreeMap<String, Entry>,
            #[serde(default)]
            cred_helpers: BTreeMap<String, String>,
            #[serde(default)]
            creds_store: Option<String>,
        }
        #[derive(serde::Deserialize)]
        struct Entry {
            auth: Option<String>,
            username: Option<String>,
            password: Option<String>,
        }
        let file: File = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
        let auths = file
            .auths
            .into_iter()
            .map(|(key, entry)| {
                let creds = match (
                    entry.auth.filter(|a| !a.is_empty()),
                    entry.username,
                    entry.password,
                ) {
                    (Some(a), _, _) => Credentials::from_docker_auth(&a)
                        .map_err(|e| format!("{key}: {}", e.message)),
                    (None, Some(username), Some(password)) => {
                        Ok(Credentials { username, password })
                    }
                    _ => Err(format!(
                        "{key} has neither `auth` nor `username` and `password`"
                    )),
                };
                (normalize(&key), creds)
            })
            .collect();
        let helpers = file
            .cred_helpers
            .into_iter()
            .map(|(k, v)| (normalize(&k), v))
            .collect();
        Ok(AuthFile {
            auths,
            helpers,
            store: file.creds_store.filter(|s| !s.is_empty()),
        })
    }

    /// Every entry by registry key, refusing the first unusable one (a site's file must be
    /// right as a whole).
    pub fn all(&self) -> std::result::Result<BTreeMap<String, Credentials>, String> {
        self.auths
            .iter()
            .map(|(k, v)| v.clone().map(|c| (k.clone(), c)))
            .collect()
    }

    /// What the file holds for `reference`: the entry of the longest key that covers it
    /// (its registry, or its registry and a leading part of its repository), else the
    /// helper named for its registry or the default helper.
    pub fn lookup(&self, reference: &ImageRef) -> Found {
        let full = format!("{}/{}", reference.registry, reference.repository);
        let covers = |key: &str| {
            key == reference.registry
                || (full.starts_with(key) && full.as_bytes().get(key.len()) == Some(&b'/'))
                || full == key
        };
        let best = self
            .auths
            .iter()
            .filter(|(k, _)| covers(k))
            .max_by_key(|(k, _)| k.len());
        match best {
            Some((key, Ok(c))) => Found::Credentials(key.clone(), c.clone()),
            // An empty entry is how Docker lists a registry whose secret is in a helper.
            Some((_, Err(_))) if self.helper(reference).is_some() => {
                Found::Helper(self.helper(reference).unwrap_or_default())
            }
            Some((_, Err(why))) => Found::Bad(why.clone()),
            None => match self.helper(reference) {
                Some(h) if self.helpers.contains_key(&reference.registry) => Found::Helper(h),
                _ => Found::Nothing,
            },
        }
    }

    fn helper(&self, reference: &ImageRef) -> Option<String> {
        self.helpers
            .get(&reference.registry)
            .or(self.store.as_ref())
            .cloned()
    }
}

/// A key as references name registries: no scheme, no trailing `/` or API version, Docker
/// Hub as `docker.io`.
pub fn normalize(key: &str) -> String {
    let k = key
        .trim()
        .trim_start_matches("https://")
        .trim_start_matches("http://")
        .trim_end_matches('/');
    let k = k
        .strip_suffix("/v1")
        .or_else(|| k.strip_suffix("/v2"))
        .unwrap_or(k)
        .trim_end_matches('/')
        .to_ascii_lowercase();
    for hub in ["index.docker.io", "registry-1.docker.io"] {
        if let Some(rest) = k.strip_prefix(hub) {
            return format!("docker.io{rest}");
        }
    }
    k
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(s: &str) -> ImageRef {
        s.parse().unwrap()
    }

    #[test]
    fn keys_are_matched_by_registry_then_longest_namespace() {
        let file = AuthFile::parse(
            br#"{"auths": {
                "https://index.docker.io/v1/": {"auth": "aHViOnB3"},
                "quay.io": {"username": "q", "password": "1"},
                "quay.io/team": {"username": "t", "password": "2"},
                "127.0.0.1:5000": {"auth": ""}
              },
              "credHelpers": {"123.dkr.ecr.us-east-1.amazonaws.com": "ecr-login"}}"#,
        )
        .unwrap();
        let user = |s: &str| match file.lookup(&r(s)) {
            Found::Credentials(_, c) => c.username,
            other => format!("{other:?}"),
        };
        assert_eq!(user("ubuntu"), "hub");
        assert_eq!(user("quay.io/other/x"), "q");
        assert_eq!(user("quay.io/team/x:1"), "t");
        assert_eq!(
            user("quay.io/teamx/x"),
            "q",
            "a namespace is a whole component"
        );
        assert_eq!(user("nvcr.io/nvidia/pytorch:1"), "Nothing");
        assert!(user("127.0.0.1:5000/a").starts_with("Bad"));
        assert_eq!(
            file.lookup(&r("123.dkr.ecr.us-east-1.amazonaws.com/app")),
            Found::Helper("ecr-login".into())
        );
        let docker =
            AuthFile::parse(br#"{"auths": {"127.0.0.1:5000": {}}, "credsStore": "desktop"}"#)
                .unwrap();
        assert_eq!(
            docker.lookup(&r("127.0.0.1:5000/a")),
            Found::Helper("desktop".into())
        );
        assert_eq!(docker.lookup(&r("nvcr.io/a")), Found::Nothing);
        assert!(AuthFile::parse(b"[1]").is_err());
    }
}
