//! A loopback registry for tests and benchmarks: Debian's `docker-registry` serving a scratch
//! directory on a free 127.0.0.1 port, fed by `skopeo copy`. The image crate's registry tests,
//! the end-to-end registry tests and the image benchmark all include this one file (by
//! `#[path]`), so the launcher is not repeated; each uses a part of it.
#![allow(dead_code)]

use std::fs;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use wharf_images::ImageRef;

/// Which of `tools` are not on `PATH`.
pub fn missing(tools: &[&'static str]) -> Vec<&'static str> {
    tools
        .iter()
        .copied()
        .filter(|t| {
            !Command::new("sh")
                .args(["-c", &format!("command -v {t}")])
                .stdout(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        })
        .collect()
}

/// Whether `docker-registry` and `skopeo` are installed; else says why (and fails when
/// `WHARF_TEST_STRICT=1`).
pub fn tools(test: &str) -> bool {
    let missing = missing(&["docker-registry", "skopeo"]);
    if missing.is_empty() {
        return true;
    }
    let why = format!(
        "{test}: needs {} (apt-get install docker-registry skopeo)",
        missing.join(" and ")
    );
    assert!(
        std::env::var("WHARF_TEST_STRICT").as_deref() != Ok("1"),
        "{why}"
    );
    eprintln!("SKIPPED {why}");
    false
}

/// A `docker-registry` serving a scratch directory on 127.0.0.1, killed when dropped.
pub struct Loopback {
    child: Child,
    /// `127.0.0.1:port`.
    pub addr: String,
    /// The registry's storage root (blobs and manifests as it serves them).
    pub storage: PathBuf,
    /// Its scratch directory: storage, config and `registry.log` (errors, and the access log
    /// of every request, which the registry writes whatever the log level).
    dir: tempfile::TempDir,
}

impl Loopback {
    /// Starts one, its scratch directory in the system's temporary directory, and waits until
    /// it accepts connections; with `htpasswd`, a user `u` with password `p` is required.
    pub fn start(htpasswd: bool) -> Loopback {
        Loopback::start_in(&std::env::temp_dir(), htpasswd)
    }

    /// As [`Loopback::start`], its scratch directory (storage, config, log) under `parent`:
    /// where large images need room that the temporary directory may lack.
    pub fn start_in(parent: &Path, htpasswd: bool) -> Loopback {
        Loopback::start_with_users(parent, if htpasswd { &[("u", "p")] } else { &[] })
    }

    /// As [`Loopback::start_in`], requiring one of `users` (name, password) when there are any.
    pub fn start_with_users(parent: &Path, users: &[(&str, &str)]) -> Loopback {
        let dir = tempfile::tempdir_in(parent).unwrap();
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let addr = format!("127.0.0.1:{port}");
        let storage = dir.path().join("storage");
        let mut config = format!(
            "version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: {}\n\
             http:\n  addr: {addr}\n",
            storage.display()
        );
        if !users.is_empty() {
            let file = dir.path().join("htpasswd");
            let mut lines = Vec::new();
            for (user, password) in users {
                let out = Command::new("htpasswd")
                    .args(["-Bbn", user, password])
                    .output()
                    .expect("htpasswd (apache2-utils)");
                assert!(out.status.success());
                lines.extend_from_slice(out.stdout.trim_ascii_end());
                lines.push(b'\n');
            }
            fs::write(&file, lines).unwrap();
            config.push_str(&format!(
                "auth:\n  htpasswd:\n    realm: test\n    path: {}\n",
                file.display()
            ));
        }
        let cfg = dir.path().join("config.yml");
        fs::write(&cfg, config).unwrap();
        let log = fs::File::create(dir.path().join("registry.log")).unwrap();
        let child = Command::new("docker-registry")
            .arg("serve")
            .arg(&cfg)
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        let reg = Loopback {
            child,
            addr,
            storage,
            dir,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(&reg.addr).is_err() {
            assert!(Instant::now() < deadline, "the registry did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
        reg
    }

    /// Pushes tag `tag` of the OCI layout at `layout` as `repo:tag` (every platform), with
    /// `creds` (`user:password`) when given.
    pub fn push(&self, layout: &Path, tag: &str, repo: &str, creds: Option<&str>) {
        self.push_with(layout, tag, repo, creds, &[]);
    }

    /// [`Loopback::push`] with more `skopeo copy` options (`--dest-compress-format zstd`, say).
    pub fn push_with(
        &self,
        layout: &Path,
        tag: &str,
        repo: &str,
        creds: Option<&str>,
        options: &[&str],
    ) {
        let mut cmd = Command::new("skopeo");
        cmd.args(["copy", "--quiet", "--all", "--dest-tls-verify=false"]);
        cmd.args(options);
        if let Some(c) = creds {
            cmd.args(["--dest-creds", c]);
        }
        let out = cmd
            .arg(format!("oci:{}:{tag}", layout.display()))
            .arg(format!("docker://{}/{repo}:{tag}", self.addr))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "skopeo: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// How many `GET`s of each blob (by digest) the registry has answered so far, whatever
    /// their status, read from its access log (one line per request, Apache's combined format).
    pub fn blob_gets(&self) -> std::collections::BTreeMap<String, usize> {
        let log = fs::read_to_string(self.dir.path().join("registry.log")).unwrap_or_default();
        let mut gets = std::collections::BTreeMap::new();
        for line in log.lines() {
            let Some((_, request)) = line.split_once("\"GET /v2/") else {
                continue;
            };
            let path = request.split_whitespace().next().unwrap_or_default();
            if let Some((_, digest)) = path.split_once("/blobs/") {
                *gets.entry(digest.to_string()).or_insert(0) += 1;
            }
        }
        gets
    }

    /// `addr/repo_tag` as a reference string.
    pub fn name(&self, repo_tag: &str) -> String {
        format!("{}/{repo_tag}", self.addr)
    }

    /// `addr/repo_tag` as a reference.
    pub fn reference(&self, repo_tag: &str) -> ImageRef {
        self.name(repo_tag).parse().unwrap()
    }
}

impl Drop for Loopback {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
