//! A throwaway PostgreSQL server for tests and benchmarks: `initdb` into a temporary directory as the
//! `postgres` user, started with `pg_ctl` on a free port (TCP on 127.0.0.1, its Unix socket
//! in the same directory), with a role `wharf` whose password is in a 0600 file. Stopped and
//! removed when dropped, also when the test fails.
//!
//! Where PostgreSQL is missing (Debian's `postgresql` puts it under
//! `/usr/lib/postgresql/*/bin`), [`PgServer::start`] says why and returns `None`; under
//! `WHARF_TEST_STRICT=1` it panics instead, as every other test that needs something does.

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use super::postgres::PgSettings;

/// A running server.
#[derive(Debug)]
pub struct PgServer {
    dir: Scratch,
    bin: PathBuf,
    port: u16,
    uid: u32,
    gid: u32,
    databases: u32,
}

fn skip(why: &str) -> Option<PgServer> {
    let why = format!("PostgreSQL tests: {why}");
    if std::env::var("WHARF_TEST_STRICT").as_deref() == Ok("1") {
        panic!("{why}");
    }
    eprintln!("SKIPPED {why}");
    None
}

/// The newest `/usr/lib/postgresql/*/bin` with `initdb` in it.
fn bin_dir() -> Option<PathBuf> {
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let v = e.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").exists().then_some((v, bin))
        })
        .collect();
    found.sort();
    found.pop().map(|(_, b)| b)
}

/// A fresh directory under the system's temporary directory, removed when dropped.
#[derive(Debug)]
struct Scratch(PathBuf);

impl Scratch {
    fn new() -> Scratch {
        use std::sync::atomic::{AtomicU32, Ordering};
        static N: AtomicU32 = AtomicU32::new(0);
        let path = std::env::temp_dir().join(format!(
            "wharf-pg-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir(&path).expect("temp dir");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o700)).expect("chmod");
        Scratch(path)
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

impl PgServer {
    /// Starts a fresh server, or says why it cannot (see the module doc).
    pub fn start() -> Option<PgServer> {
        let Some(bin) = bin_dir() else {
            return skip("no /usr/lib/postgresql/*/bin/initdb (apt-get install postgresql)");
        };
        if !nix::unistd::geteuid().is_root() {
            return skip("needs root, to run the server as the postgres user");
        }
        let Ok(Some(pg)) = nix::unistd::User::from_name("postgres") else {
            return skip("no postgres user (apt-get install postgresql makes it)");
        };
        let dir = Scratch::new();
        let (uid, gid) = (pg.uid.as_raw(), pg.gid.as_raw());
        std::os::unix::fs::chown(dir.path(), Some(uid), Some(gid)).expect("chown");
        let server = PgServer {
            dir,
            bin,
            port: free_port(),
            uid,
            gid,
            databases: 0,
        };
        let pwfile = server.dir.path().join("superuser.pw");
        std::fs::write(&pwfile, "not-used-over-tcp\n").unwrap();
        std::os::unix::fs::chown(&pwfile, Some(uid), Some(gid)).unwrap();
        server.run(
            "initdb",
            &[
                "-D",
                &server.data().display().to_string(),
                "-U",
                "postgres",
                "--auth-local=trust",
                "--auth-host=scram-sha-256",
                "--pwfile",
                &pwfile.display().to_string(),
                "--no-sync",
            ],
        );
        server.start_again();
        server.admin(&["CREATE ROLE wharf LOGIN PASSWORD 'wharf-test-password'".to_string()]);
        Some(server)
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn run(&self, tool: &str, args: &[&str]) {
        let out = Command::new(self.bin.join(tool))
            .args(args)
            .current_dir(self.dir.path())
            .uid(self.uid)
            .gid(self.gid)
            .env_remove("PGDATA")
            .output()
            .unwrap_or_else(|e| panic!("{tool}: {e}"));
        assert!(
            out.status.success(),
            "{tool} {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Starts the server (again, after [`PgServer::stop`]) and waits until it answers.
    pub fn start_again(&self) {
        let opts = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off",
            self.port,
            self.dir.path().display()
        );
        let log = self.dir.path().join("server.log").display().to_string();
        self.run(
            "pg_ctl",
            &[
                "start",
                "-w",
                "-t",
                "60",
                "-D",
                &self.data().display().to_string(),
                "-l",
                &log,
                "-o",
                &opts,
            ],
        );
    }

    /// Stops the server (fast shutdown: connections are cut).
    pub fn stop(&self) {
        self.run(
            "pg_ctl",
            &[
                "stop",
                "-w",
                "-m",
                "fast",
                "-D",
                &self.data().display().to_string(),
            ],
        );
    }

    /// Runs statements as the superuser over the Unix socket.
    fn admin(&self, statements: &[String]) {
        let mut c = postgres::Config::new()
            .host_path(self.dir.path())
            .port(self.port)
            .user("postgres")
            .dbname("postgres")
            .connect(postgres::NoTls)
            .expect("superuser connection");
        for s in statements {
            c.batch_execute(s).unwrap_or_else(|e| panic!("{s}: {e}"));
        }
    }

    /// A new, empty database owned by `wharf`, and the settings that reach it over TCP
    /// with the password file.
    pub fn database(&mut self) -> PgSettings {
        self.databases += 1;
        let name = format!("ledger{}", self.databases);
        self.admin(&[format!("CREATE DATABASE {name} OWNER wharf")]);
        let pw = self.dir.path().join(format!("{name}.pw"));
        std::fs::write(&pw, "wharf-test-password\n").unwrap();
        std::fs::set_permissions(&pw, std::fs::Permissions::from_mode(0o600)).unwrap();
        PgSettings {
            url: None,
            host: Some("127.0.0.1".into()),
            port: Some(self.port),
            user: Some("wharf".into()),
            dbname: Some(name),
            password_file: Some(pw),
            connect_timeout: Duration::from_secs(5),
        }
    }

    /// A directory for the test's own files (spools).
    pub fn scratch(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for PgServer {
    // Runs before the fields' drops: the server stops, then its directory goes.
    fn drop(&mut self) {
        let _ = Command::new(self.bin.join("pg_ctl"))
            .args(["stop", "-w", "-m", "immediate", "-D"])
            .arg(self.data())
            .uid(self.uid)
            .gid(self.gid)
            .output();
    }
}
