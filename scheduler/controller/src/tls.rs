//! TLS on the controller's TCP port, which is the agents' only way in from other hosts: their
//! node keys, their jobs' commands, environments and registry credentials, and the steps'
//! input and output all cross it.
//!
//! At its first start with a TCP port the controller makes a certificate authority of its
//! own and, signed by it, a certificate for [`CONTROLLER_TLS_NAME`]. It keeps the
//! authority's certificate (`ca.pem`, for the agents), its own certificate (`tls.pem`) and
//! its own key (`tls.key`, 0600) in its state directory. The authority's key signs that one
//! certificate and is never written anywhere: nobody, not even whoever reads the state
//! directory later, can make the authority sign another. Agents trust `ca.pem` alone and
//! check the name, whatever address they dial.
//!
//! `ca.pem` is written last, each file whole (written beside, synced, renamed): a start cut
//! short before it leaves no authority that an agent could have been given, so the next
//! start makes all three again. An authority given out (`ca.pem` there) is never replaced
//! behind the agents' backs: if its certificate or key is missing, the start fails and says
//! how to make a new one.

use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::Arc;

use rustls::client::danger::ServerCertVerifier;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use wharf_api::wire::CONTROLLER_TLS_NAME;
use wharf_client::tls_provider as provider;

/// The authority's certificate, for the agents.
pub const CA_FILE: &str = "ca.pem";
/// The controller's certificate.
pub const CERT_FILE: &str = "tls.pem";
/// The controller's private key (root's, 0600).
pub const KEY_FILE: &str = "tls.key";

/// The TLS settings of the TCP port, from `state_dir`'s files, made first if there are none.
pub fn server_config(state_dir: &Path) -> io::Result<Arc<rustls::ServerConfig>> {
    let ca = state_dir.join(CA_FILE);
    if !is_file(&ca)? {
        make(state_dir)?;
        tracing::info!(ca = %ca.display(), "made the certificate authority of the TCP port; copy this file to every node, beside its join token");
    }
    let (cert, key) = (state_dir.join(CERT_FILE), state_dir.join(KEY_FILE));
    for f in [&cert, &key] {
        if !is_file(f)? {
            return Err(io::Error::other(format!(
                "{} is missing while {} is there; to make a new certificate authority, \
                 remove {} and restart, then copy the new one to every node and restart \
                 their agents",
                f.display(),
                ca.display(),
                ca.display()
            )));
        }
    }
    // A key restored or copied with another mode is made private again.
    std::fs::set_permissions(&key, std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
    let bad = |f: &Path, e: &dyn std::fmt::Display| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("reading {}: {e}", f.display()),
        )
    };
    let chain = CertificateDer::pem_file_iter(&cert)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| bad(&cert, &e))?;
    let private = PrivateKeyDer::from_pem_file(&key).map_err(|e| bad(&key, &e))?;
    signed_by_authority(&chain, &ca).map_err(|e| bad(&cert, &e))?;
    let config = rustls::ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(io::Error::other)?
        .with_no_client_auth()
        .with_single_cert(chain, private)
        .map_err(|e| bad(&cert, &e))?;
    Ok(Arc::new(config))
}

/// Whether `path` is a file: `false` when nothing is there; an error for anything else in its
/// place (a link, a directory), which the controller never made.
fn is_file(path: &Path) -> io::Result<bool> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.is_file() => Ok(true),
        Ok(_) => Err(io::Error::other(format!(
            "{} is not a plain file; remove it",
            path.display()
        ))),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

/// Checks that `chain` is what agents trusting `ca_file` accept: a certificate for
/// [`CONTROLLER_TLS_NAME`] that the authority signed, so that a restore that mixed the
/// files of two authorities stops the controller here, not every agent later.
fn signed_by_authority(chain: &[CertificateDer<'static>], ca_file: &Path) -> Result<(), String> {
    let roots = wharf_client::tls_roots(ca_file)?;
    let verifier =
        rustls::client::WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider())
            .build()
            .map_err(|e| e.to_string())?;
    let (leaf, rest) = chain.split_first().ok_or("holds no certificate")?;
    let name =
        rustls::pki_types::ServerName::try_from(CONTROLLER_TLS_NAME).map_err(|e| e.to_string())?;
    verifier
        .verify_server_cert(leaf, rest, &name, &[], rustls::pki_types::UnixTime::now())
        .map(|_| ())
        .map_err(|e| format!("not what agents trusting {} accept: {e}", ca_file.display()))
}

/// Makes the authority and the controller's certificate and key, `ca.pem` last.
fn make(state_dir: &Path) -> io::Result<()> {
    let fail = |e: rcgen::Error| io::Error::other(format!("making the TLS certificates: {e}"));
    let ca_key = rcgen::KeyPair::generate().map_err(fail)?;
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).map_err(fail)?;
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Constrained(0));
    ca_params.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::CrlSign,
    ];
    ca_params.distinguished_name = name("Wharf controller authority");
    let ca_cert = ca_params.self_signed(&ca_key).map_err(fail)?;
    let issuer = rcgen::Issuer::new(ca_params, ca_key);

    let key = rcgen::KeyPair::generate().map_err(fail)?;
    let mut params =
        rcgen::CertificateParams::new(vec![CONTROLLER_TLS_NAME.to_string()]).map_err(fail)?;
    params.distinguished_name = name(CONTROLLER_TLS_NAME);
    params.key_usages = vec![rcgen::KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    let cert = params.signed_by(&key, &issuer).map_err(fail)?;

    save(
        &state_dir.join(KEY_FILE),
        key.serialize_pem().as_bytes(),
        0o600,
    )?;
    save(&state_dir.join(CERT_FILE), cert.pem().as_bytes(), 0o644)?;
    save(&state_dir.join(CA_FILE), ca_cert.pem().as_bytes(), 0o644)
}

fn name(common: &str) -> rcgen::DistinguishedName {
    let mut n = rcgen::DistinguishedName::new();
    n.push(rcgen::DnType::CommonName, common);
    n
}

/// Writes `bytes` to `path` whole: beside it (never through a link), synced, renamed over
/// it, and the rename synced.
fn save(path: &Path, bytes: &[u8], mode: u32) -> io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".new");
    let tmp = Path::new(&tmp);
    let _ = std::fs::remove_file(tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    std::fs::rename(tmp, path)?;
    match path.parent() {
        Some(dir) => std::fs::File::open(dir)?.sync_all(),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn mode(p: &Path) -> u32 {
        std::fs::metadata(p).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn the_authority_is_made_once_and_its_key_is_never_kept() {
        let dir = tempfile::tempdir().unwrap();
        server_config(dir.path()).unwrap();
        let ca = std::fs::read(dir.path().join(CA_FILE)).unwrap();
        assert_eq!(mode(&dir.path().join(KEY_FILE)), 0o600);
        assert_eq!(mode(&dir.path().join(CA_FILE)), 0o644);
        // The state directory holds the controller's one key and no other.
        let keys: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| {
                std::fs::read_to_string(dir.path().join(n))
                    .unwrap()
                    .contains("PRIVATE KEY")
            })
            .collect();
        assert_eq!(keys, [KEY_FILE]);
        // A second start keeps the authority the agents were given.
        server_config(dir.path()).unwrap();
        assert_eq!(std::fs::read(dir.path().join(CA_FILE)).unwrap(), ca);
    }

    /// A client that trusts the authority in `ca` alone, as agents do.
    fn client(ca: &Path) -> tokio_rustls::TlsConnector {
        tokio_rustls::TlsConnector::from(wharf_client::Tls::from_ca_file(ca).unwrap().config())
    }

    #[tokio::test]
    async fn its_certificate_is_trusted_by_its_own_authority_for_its_name_alone() {
        let (ours, theirs) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let server = server_config(ours.path()).unwrap();
        server_config(theirs.path()).unwrap();
        for (ca, name, trusted) in [
            (ours.path(), CONTROLLER_TLS_NAME, true),
            (theirs.path(), CONTROLLER_TLS_NAME, false),
            (ours.path(), "other-host", false),
        ] {
            let (near, far) = tokio::io::duplex(1 << 16);
            let acceptor = tokio_rustls::TlsAcceptor::from(server.clone());
            let name = rustls::pki_types::ServerName::try_from(name.to_string()).unwrap();
            let connect = client(&ca.join(CA_FILE)).connect(name, near);
            let (c, _) = tokio::join!(connect, acceptor.accept(far));
            assert_eq!(c.is_ok(), trusted, "{ca:?} {c:?}");
        }
    }

    /// What an agent is told when the handshake fails: which file to look at for another
    /// authority, and the controller's version for a port that answers in plain HTTP.
    #[tokio::test]
    async fn a_failed_handshake_says_what_to_look_at() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (ours, theirs) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let server = server_config(ours.path()).unwrap();
        server_config(theirs.path()).unwrap();
        let tls = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let plain = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let (tls_addr, plain_addr) = (tls.local_addr().unwrap(), plain.local_addr().unwrap());
        tokio::spawn(async move {
            let acceptor = tokio_rustls::TlsAcceptor::from(server);
            while let Ok((s, _)) = tls.accept().await {
                let _ = acceptor.accept(s).await;
            }
        });
        tokio::spawn(async move {
            while let Ok((mut s, _)) = plain.accept().await {
                let mut buf = [0u8; 1024];
                let _ = s.read(&mut buf).await;
                let _ = s
                    .write_all(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n")
                    .await;
            }
        });
        let trusting = |ca: &Path, addr: std::net::SocketAddr| {
            let tls = wharf_client::Tls::from_ca_file(&ca.join(CA_FILE)).unwrap();
            wharf_client::Client::new(wharf_client::Endpoint::Tcp(addr.to_string()), None)
                .with_tls(tls)
        };
        let e = trusting(theirs.path(), tls_addr)
            .get::<serde_json::Value>("/v1/agent/poll")
            .await
            .unwrap_err()
            .to_string();
        assert!(e.contains("no TLS") && e.contains("controller_ca"), "{e}");
        let e = trusting(ours.path(), plain_addr)
            .get::<serde_json::Value>("/v1/agent/poll")
            .await
            .unwrap_err()
            .to_string();
        assert!(e.contains("plain HTTP"), "{e}");
    }

    #[test]
    fn an_authority_given_out_is_never_replaced_behind_the_agents_backs() {
        let dir = tempfile::tempdir().unwrap();
        server_config(dir.path()).unwrap();
        let ca = std::fs::read(dir.path().join(CA_FILE)).unwrap();
        std::fs::remove_file(dir.path().join(KEY_FILE)).unwrap();
        let e = server_config(dir.path()).unwrap_err().to_string();
        assert!(
            e.contains("tls.key is missing") && e.contains("remove"),
            "{e}"
        );
        assert_eq!(std::fs::read(dir.path().join(CA_FILE)).unwrap(), ca);
        // A start cut short before ca.pem: nobody can hold that authority, so all are made again.
        std::fs::remove_file(dir.path().join(CA_FILE)).unwrap();
        server_config(dir.path()).unwrap();
        assert_ne!(std::fs::read(dir.path().join(CA_FILE)).unwrap(), ca);
        // Files of two authorities mixed (a bad restore) stop the controller, naming them.
        let other = tempfile::tempdir().unwrap();
        server_config(other.path()).unwrap();
        std::fs::copy(other.path().join(CA_FILE), dir.path().join(CA_FILE)).unwrap();
        let e = server_config(dir.path()).unwrap_err().to_string();
        assert!(
            e.contains("tls.pem") && e.contains("not what agents"),
            "{e}"
        );
        // A link in the authority's place is refused, not followed or replaced.
        std::fs::remove_file(dir.path().join(CA_FILE)).unwrap();
        std::os::unix::fs::symlink("/nonexistent", dir.path().join(CA_FILE)).unwrap();
        let e = server_config(dir.path()).unwrap_err().to_string();
        assert!(e.contains("not a plain file"), "{e}");
        std::fs::remove_file(dir.path().join(CA_FILE)).unwrap();
        server_config(dir.path()).unwrap();
        // A key with another mode is made private again.
        std::fs::set_permissions(
            dir.path().join(KEY_FILE),
            std::fs::Permissions::from_mode(0o644),
        )
        .unwrap();
        server_config(dir.path()).unwrap();
        assert_eq!(mode(&dir.path().join(KEY_FILE)), 0o600);
        // A damaged key says which file.
        std::fs::write(dir.path().join(KEY_FILE), "not a key").unwrap();
        let e = server_config(dir.path()).unwrap_err().to_string();
        assert!(e.contains("tls.key"), "{e}");
    }
}
