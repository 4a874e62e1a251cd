//! The submitting user's own registry credential, sent with a submit whose image is a
//! registry reference: looked up where Podman and Docker keep them, for the registry the job
//! names and no other, in this order (the first file with an entry for it wins):
//!
//! 1. `$REGISTRY_AUTH_FILE`
//! 2. `$XDG_RUNTIME_DIR/containers/auth.json`
//! 3. `$HOME/.config/containers/auth.json`
//! 4. `$HOME/.docker/config.json`
//!
//! Credential helpers (`credHelpers`, `credsStore`) are not run: a registry whose secret
//! lives in one gets a warning that says so, and the job is submitted without it.

use std::path::PathBuf;

use wharf_api::image_ref::ImageRef;
use wharf_api::wire::RegistryCredential;
use wharf_images::registry::authfile::{AuthFile, Found};

/// Where credentials are looked for, in order, given the environment (`var`).
pub fn auth_files(var: impl Fn(&str) -> Option<String>) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let set = |name: &str| var(name).filter(|v| !v.is_empty());
    if let Some(f) = set("REGISTRY_AUTH_FILE") {
        out.push(PathBuf::from(f));
    }
    if let Some(d) = set("XDG_RUNTIME_DIR") {
        out.push(PathBuf::from(d).join("containers/auth.json"));
    }
    if let Some(h) = set("HOME") {
        let home = PathBuf::from(h);
        out.push(home.join(".config/containers/auth.json"));
        out.push(home.join(".docker/config.json"));
    }
    out
}

/// The credential for `image`'s registry from `files`, when `image` is a registry reference
/// and one of them has it. Files that are missing are skipped; one that cannot be read or
/// parsed, an unusable entry and a credential helper are skipped with a warning to `warn`.
pub fn for_image(
    image: &str,
    files: &[PathBuf],
    warn: &mut dyn FnMut(String),
) -> Option<RegistryCredential> {
    if image == "host" || image.starts_with('/') {
        return None;
    }
    let reference: ImageRef = image.parse().ok()?;
    for path in files {
        let file = match AuthFile::read(path) {
            Ok(f) => f,
            Err(e) if e.kind == wharf_images::ErrorKind::NotFound => continue,
            Err(e) => {
                warn(format!("ignoring registry auth file: {e}"));
                continue;
            }
        };
        match file.lookup(&reference) {
            Found::Credentials(_, c) => {
                return Some(RegistryCredential {
                    registry: reference.registry.clone(),
                    username: c.username,
                    password: c.password,
                })
            }
            Found::Helper(helper) => warn(format!(
                "{}: the credential for {} is kept by the credential helper \
                 docker-credential-{helper}, which wharf does not run; the job is submitted \
                 without it (log in with `podman login --authfile FILE` or write an `auth` \
                 entry, and point REGISTRY_AUTH_FILE at it)",
                path.display(),
                reference.registry
            )),
            Found::Bad(why) => warn(format!("{}: ignoring {why}", path.display())),
            Found::Nothing => {}
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_are_searched_in_order_for_the_jobs_registry_only() {
        let dir = tempfile::tempdir().unwrap();
        let env = |name: &str| match name {
            "REGISTRY_AUTH_FILE" => Some(dir.path().join("explicit.json").display().to_string()),
            "XDG_RUNTIME_DIR" => Some(dir.path().join("run").display().to_string()),
            "HOME" => Some(dir.path().join("home").display().to_string()),
            _ => None,
        };
        let files = auth_files(env);
        assert_eq!(files.len(), 4);
        assert!(files[1].ends_with("run/containers/auth.json"));
        assert!(files[3].ends_with("home/.docker/config.json"));
        std::fs::create_dir_all(files[3].parent().unwrap()).unwrap();
        std::fs::create_dir_all(files[1].parent().unwrap()).unwrap();
        // dTpw = u:p
        std::fs::write(
            &files[3],
            r#"{"auths": {"127.0.0.1:5000": {"auth": "dTpw"},
                          "nvcr.io": {}}, "credsStore": "desktop"}"#,
        )
        .unwrap();
        std::fs::write(&files[0], "not json").unwrap();
        let mut warnings = Vec::new();
        let mut warn = |w: String| warnings.push(w);
        let c = for_image("127.0.0.1:5000/team/app:v1", &files, &mut warn).unwrap();
        assert_eq!(
            (
                c.registry.as_str(),
                c.username.as_str(),
                c.password.as_str()
            ),
            ("127.0.0.1:5000", "u", "p")
        );
        assert!(for_image("docker.io/library/ubuntu", &files, &mut warn).is_none());
        assert!(for_image("host", &files, &mut warn).is_none());
        assert!(for_image("nvcr.io/nvidia/pytorch:1", &files, &mut warn).is_none());
        assert!(
            warnings.iter().any(|w| w.contains("explicit.json")),
            "{warnings:?}"
        );
        assert!(
            warnings
                .iter()
                .any(|w| w.contains("docker-credential-desktop")),
            "{warnings:?}"
        );
        // An earlier file wins.
        std::fs::write(
            &files[1],
            r#"{"auths": {"127.0.0.1:5000": {"username": "x", "password": "y"}}}"#,
        )
        .unwrap();
        let c = for_image("127.0.0.1:5000/team/app:v1", &files, &mut |_| {}).unwrap();
        assert_eq!(c.username, "x");
    }
}
