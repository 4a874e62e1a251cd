//! Starting throw-away clusters and running the CLI as real users.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;

/// The binary under test.
pub fn wharf_bin() -> &'static str {
    env!("CARGO_BIN_EXE_wharf")
}

/// This binary under a Slurm command's `name` (`sinfo`, `scancel`, ...): a link to it in
/// `dir`, made once, which the binary runs as that command.
pub fn slurm_link(dir: &std::path::Path, name: &str) -> std::path::PathBuf {
    let link = dir.join(name);
    if !link.exists() {
        std::os::unix::fs::symlink(wharf_bin(), &link).unwrap();
    }
    link
}

/// A scratch directory under /var/tmp (jobs have their own /tmp), removed on drop.
pub fn scratch(prefix: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(prefix)
        .tempdir_in("/var/tmp")
        .unwrap()
}

/// Returns false (after printing why) when the test cannot run here; panics instead under
/// WHARF_TEST_STRICT=1.
pub fn can_run(test: &str) -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    let why = format!("{test}: needs root (sandboxes, cgroups, useradd)");
    if std::env::var("WHARF_TEST_STRICT").as_deref() == Ok("1") {
        panic!("{why}");
    }
    eprintln!("SKIPPED {why}");
    false
}

/// Returns false (after printing why) when siftool or mksquashfs, which SIF tests need to
/// make images, is missing; panics instead under WHARF_TEST_STRICT=1.
pub fn sif_tools() -> bool {
    let ok = ["siftool", "mksquashfs"].iter().all(|t| {
        Command::new("sh")
            .args(["-c", &format!("command -v {t}")])
            .output()
            .is_ok_and(|o| o.status.success())
    });
    if !ok {
        let why = "SIF tests need siftool and mksquashfs (apt-get install siftool squashfs-tools)";
        assert!(
            std::env::var("WHARF_TEST_STRICT").as_deref() != Ok("1"),
            "{why}"
        );
        eprintln!("SKIPPED {why}");
    }
    ok
}

/// Runs one of the `examples/` scripts with these arguments; panics with its output if it
/// fails.
fn example(script: &str, args: &[&std::ffi::OsStr]) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("examples")
        .join(script);
    let out = Command::new(&path).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "{script} {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Makes a root filesystem at `rootfs` holding these programs of this machine
/// (`examples/mkrootfs.sh`).
pub fn mkrootfs(rootfs: &Path, progs: &[&str]) {
    let mut args = vec![rootfs.as_os_str()];
    args.extend(progs.iter().map(std::ffi::OsStr::new));
    example("mkrootfs.sh", &args);
}

/// Makes the SIF image `sif` of the root filesystem `rootfs` (`examples/mksif.sh`).
pub fn mksif(rootfs: &Path, sif: &Path) {
    example("mksif.sh", &[rootfs.as_os_str(), sif.as_os_str()]);
}

/// A Unix user made for tests (created once, reused).
#[derive(Debug, Clone)]
pub struct User {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
}

/// Creates (if needed) and returns a test user.
pub fn user(name: &str) -> User {
    if nix::unistd::User::from_name(name).ok().flatten().is_none() {
        let out = Command::new("useradd")
            .args(["--no-create-home", "--shell", "/bin/sh", name])
            .output()
            .expect("useradd");
        // A concurrent test may have created it first.
        assert!(
            out.status.success() || String::from_utf8_lossy(&out.stderr).contains("already exists"),
            "useradd {name}: {out:?}"
        );
    }
    let u = nix::unistd::User::from_name(name).unwrap().unwrap();
    User {
        name: name.into(),
        uid: u.uid.as_raw(),
        gid: u.gid.as_raw(),
    }
}

/// Creates (if needed) the Unix group `name` and puts `members` in it (as supplementary
/// members). Retries while another test holds the group file's lock.
pub fn group(name: &str, members: &[&User]) {
    let run = |cmd: &mut Command| {
        for _ in 0..100 {
            let out = cmd.output().expect("groupadd/usermod");
            let err = String::from_utf8_lossy(&out.stderr);
            if out.status.success() || err.contains("already exists") {
                return;
            }
            assert!(err.contains("lock"), "{cmd:?}: {out:?}");
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("{cmd:?}: the group file stayed locked");
    };
    if nix::unistd::Group::from_name(name).ok().flatten().is_none() {
        run(Command::new("groupadd").arg(name));
    }
    for m in members {
        run(Command::new("usermod").args(["-a", "-G", name, &m.name]));
    }
}

static NEXT: AtomicU32 = AtomicU32::new(0);

/// A `wharf dev` cluster in a temp directory, killed on drop.
pub struct Cluster {
    pub dir: PathBuf,
    pub socket: PathBuf,
    pub cgroup_parent: String,
    child: Option<Child>,
    extra_config: String,
    /// Handed to the dev process as descriptor 9, inheritable (see [`Cluster::start_leaking`]).
    leaked: Option<std::fs::File>,
    /// Held while a cluster drives the Docker engine: an agent names its containers by job id
    /// alone (one agent per engine on a real node), so two test clusters on this machine's one
    /// engine would take each other's `wharf-1`. Released after the cluster is stopped.
    _engine: Option<std::sync::MutexGuard<'static, ()>>,
}

/// The Docker engine, one cluster at a time (see `Cluster::_engine`).
static ENGINE: std::sync::Mutex<()> = std::sync::Mutex::new(());

impl Cluster {
    /// Starts a dev cluster and waits for its node to be up.
    pub fn start() -> Cluster {
        Self::start_with("")
    }

    /// Starts with `file` open in the dev process as descriptor 9, not close-on-exec: what a
    /// careless service manager or shell would hand the daemons, and they to their children.
    pub fn start_leaking(file: std::fs::File) -> Cluster {
        Self::start_from("", Some(file))
    }

    /// Starts with extra `[agent]` settings (TOML lines) in the generated config.
    pub fn start_with(extra: &str) -> Cluster {
        Self::start_from(extra, None)
    }

    fn start_from(extra: &str, leaked: Option<std::fs::File>) -> Cluster {
        let n = NEXT.fetch_add(1, Ordering::SeqCst);
        let dir = PathBuf::from(format!("/tmp/wharf-e2e-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        let mut c = Cluster {
            socket: dir.join("wharf.sock"),
            cgroup_parent: format!("wharf-e2e-{}-{n}", std::process::id()),
            dir,
            child: None,
            extra_config: extra.to_string(),
            leaked,
            _engine: extra.contains("backend = \"docker\"").then(|| {
                ENGINE
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner())
            }),
        };
        c.spawn();
        c.wait_node_up();
        c
    }

    fn config(&self) -> PathBuf {
        let path = self.dir.join("wharf.toml");
        let text = format!(
            "[controller]\nsocket = \"{}\"\nnode_timeout = \"30s\"\npoll_wait = \"5s\"\n[agent]\nimage_store = \"{}\"\ngrace = \"2s\"\ncgroup_parent = \"{}\"\n{}\n",
            self.socket.display(),
            self.dir.join("images").display(),
            self.cgroup_parent,
            self.extra_config,
        );
        std::fs::write(&path, text).unwrap();
        path
    }

    /// Starts the dev process (again, after a kill).
    pub fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("dev.log"))
            .unwrap();
        let mut cmd = Command::new(wharf_bin());
        // The configuration names the socket; a WHARF_SOCKET of the caller's would move it.
        cmd.args(["dev", "--config"])
            .arg(self.config())
            .arg("--data-dir")
            .arg(&self.dir)
            .env_remove("WHARF_SOCKET")
            .stdout(Stdio::null())
            .stderr(log);
        if let Some(file) = &self.leaked {
            use std::os::fd::AsRawFd;
            use std::os::unix::process::CommandExt;
            let from = file.as_raw_fd();
            // SAFETY: dup2 is async-signal-safe; its copy is not close-on-exec.
            unsafe {
                cmd.pre_exec(move || {
                    if libc::dup2(from, 9) < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        let child = cmd.spawn().expect("start wharf dev");
        self.child = Some(child);
    }

    /// Kills the dev process with SIGKILL (controller and agent die together; shims live on).
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Waits until `wharf nodes` shows an UP node.
    pub fn wait_node_up(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let out = self.wharf(&["nodes", "--json"]);
            if out.status.success() && String::from_utf8_lossy(&out.stdout).contains("\"UP\"") {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "node never came up; log:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The agent's shim spawner (`wharf shim --spawner`, a child of the dev process; the
    /// shims it forks are its children, not the dev process's).
    pub fn spawner_pid(&self) -> Option<i32> {
        let parent = self.child.as_ref()?.id().to_string();
        std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
            let pid: i32 = e.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(e.path().join("stat")).ok()?;
            let ppid = stat
                .rsplit_once(')')?
                .1
                .split_whitespace()
                .nth(1)?
                .to_string();
            let cmdline = std::fs::read(e.path().join("cmdline")).ok()?;
            let spawner = cmdline.split(|&b| b == 0).any(|a| a == b"--spawner");
            (ppid == parent && spawner).then_some(pid)
        })
    }

    /// Kills job `id`'s shim with SIGKILL (its pid is the first word of `shim.pid`).
    pub fn kill9_shim(&self, id: u64) {
        let file = self
            .dir
            .join("agent/jobs")
            .join(id.to_string())
            .join("shim.pid");
        let text = std::fs::read_to_string(&file).unwrap();
        let pid: i32 = text.split_whitespace().next().unwrap().parse().unwrap();
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        )
        .unwrap_or_else(|e| panic!("killing shim {pid} of job {id}: {e}"));
    }

    /// The daemon's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("dev.log")).unwrap_or_default()
    }

    /// Runs the CLI as root in the cluster dir.
    pub fn wharf(&self, args: &[&str]) -> Output {
        Command::new(wharf_bin())
            .args(args)
            .env("WHARF_SOCKET", &self.socket)
            .current_dir(&self.dir)
            .output()
            .unwrap()
    }

    /// A directory owned by `user` inside the cluster dir, to submit from.
    pub fn home(&self, user: &User) -> PathBuf {
        let d = self.dir.join(format!("home-{}", user.name));
        std::fs::create_dir_all(&d).unwrap();
        nix::unistd::chown(&d, Some(user.uid.into()), Some(user.gid.into())).unwrap();
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
        d
    }

    /// The CPUs of the cluster's (first) node, as `wharf nodes --json` reports them.
    pub fn node_cpus(&self) -> u64 {
        let nodes: serde_json::Value =
            serde_json::from_slice(&self.wharf(&["nodes", "--json"]).stdout).expect("nodes --json");
        nodes["nodes"][0]["info"]["cpus"]
            .as_u64()
            .unwrap_or_else(|| panic!("no cpus in {nodes}"))
    }

    /// Whether the node has at least `n` CPUs; returns false (after printing why) when it has
    /// fewer, and panics instead under WHARF_TEST_STRICT=1.
    pub fn has_cpus(&self, test: &str, n: u64) -> bool {
        if self.node_cpus() >= n {
            return true;
        }
        let why = format!("{test}: needs a node with {n} CPUs");
        if std::env::var("WHARF_TEST_STRICT").as_deref() == Ok("1") {
            panic!("{why}");
        }
        eprintln!("SKIPPED {why}");
        false
    }

    /// Runs the CLI as `user` (real uid/gid, their groups) from their directory.
    pub fn wharf_as(&self, user: &User, args: &[&str]) -> Output {
        let home = self.home(user);
        as_user(user, &home, wharf_bin(), args, &self.socket)
    }

    /// `wharf run OPTS -- /bin/sh -c SCRIPT` as `user`.
    pub fn run_sh(&self, user: &User, opts: &[&str], script: &str) -> Output {
        let mut args = vec!["run"];
        args.extend_from_slice(opts);
        args.extend_from_slice(&["--", "/bin/sh", "-c", script]);
        self.wharf_as(user, &args)
    }

    /// Imports a tiny image built from this machine's programs as `tiny`.
    pub fn import_tiny(&self) {
        let rootfs = self.dir.join("rootfs");
        let progs = "sh ls cat id echo sleep true false head tail dd mount chown env grep ps stat touch readlink wc kill";
        mkrootfs(&rootfs, &progs.split(' ').collect::<Vec<_>>());
        self.import(&rootfs, "tiny");
    }

    /// Imports `rootfs` as `name` and waits until the node reports it.
    pub fn import(&self, rootfs: &Path, name: &str) {
        let store = self.dir.join("images");
        let out = Command::new(wharf_bin())
            .args(["image", "import"])
            .arg(rootfs)
            .args(["--name", name, "--store"])
            .arg(&store)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "import: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        // The agent reports its images at once when they change.
        let deadline = Instant::now() + Duration::from_secs(15);
        while !String::from_utf8_lossy(&self.wharf(&["nodes", "--json"]).stdout)
            .contains(&format!("\"{name}\""))
        {
            assert!(
                Instant::now() < deadline,
                "agent never reported image {name}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// A job as root sees it.
    pub fn job(&self, id: u64) -> Value {
        show_json(&self.wharf(&["show", &id.to_string(), "--json"]), id)
    }

    /// Waits until job `id` reaches a terminal state; returns it.
    pub fn wait_done(&self, id: u64, limit: Duration) -> Value {
        wait_ended(|| self.job(id), id, limit, || self.log())
    }

    /// Submits `script` as `user`'s job (`wharf submit FLAGS --wrap SCRIPT`) and waits up to
    /// `limit` for it to end, which must be COMPLETED; returns the job and its output file's
    /// text (in the user's home).
    pub fn completed(
        &self,
        user: &User,
        flags: &[&str],
        script: &str,
        limit: Duration,
    ) -> (Value, String) {
        let mut args = vec!["submit"];
        args.extend_from_slice(flags);
        args.extend_from_slice(&["--wrap", script]);
        let id = submitted_id(&self.wharf_as(user, &args));
        let job = self.wait_done(id, limit);
        let out = self.home(user).join(format!("wharf-{id}.out"));
        let text = std::fs::read_to_string(out).unwrap_or_default();
        assert_eq!(job["state"], "COMPLETED", "{job}\n{text}\n{}", self.log());
        (job, text)
    }

    /// `wharf cancel ID` as `user`, which must succeed; returns the job once ended, which must
    /// be CANCELLED.
    pub fn cancel_as(&self, user: &User, id: u64) -> Value {
        let out = self.wharf_as(user, &["cancel", &id.to_string()]);
        assert!(out.status.success(), "{}", stderr(&out));
        let done = self.wait_done(id, Duration::from_secs(30));
        assert_eq!(done["state"], "CANCELLED", "{done}");
        done
    }

    /// Waits until job `id` is RUNNING.
    pub fn wait_running(&self, id: u64) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while self.job(id)["state"] != "RUNNING" {
            assert!(
                Instant::now() < deadline,
                "job {id} never ran: {}",
                self.job(id)
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Cluster {
    /// Every shim this cluster's agent started, by the pid files in its job directories (a
    /// shim forked by the spawner is neither the dev process's child nor named after its job
    /// directory), with the start time recorded there, so a reused pid is never taken for one.
    fn shim_pids(&self) -> Vec<i32> {
        shim_pids_in(&self.dir.join("agent"))
    }

    /// Every process in the cluster's cgroups (its jobs' processes).
    fn job_pids(&self) -> Vec<i32> {
        cgroup_procs(&format!("/{}", self.cgroup_parent))
    }
}

/// Every live shim of the agent whose state directory is `state`, by the pid files in its job
/// directories, with the start time recorded there, so a reused pid is never taken for one.
fn shim_pids_in(state: &Path) -> Vec<i32> {
    let mut pids = Vec::new();
    for job in std::fs::read_dir(state.join("jobs"))
        .into_iter()
        .flatten()
        .flatten()
    {
        let Ok(text) = std::fs::read_to_string(job.path().join("shim.pid")) else {
            continue;
        };
        let mut words = text.split_whitespace();
        let (Some(pid), recorded) = (words.next().and_then(|p| p.parse().ok()), words.next())
        else {
            continue;
        };
        if recorded.is_some() && recorded == start_time(pid).as_deref() {
            pids.push(pid);
        }
    }
    pids
}

/// `dir` and every cgroup below it, deepest first (the order to remove them in).
pub fn cgroup_tree(dir: &Path) -> Vec<PathBuf> {
    let mut out = vec![];
    for child in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if child.path().is_dir() {
            out.extend(cgroup_tree(&child.path()));
        }
    }
    out.push(dir.to_path_buf());
    out
}

/// Removes the cgroup parent `name` and every (empty) cgroup below it, in every hierarchy.
pub fn remove_cgroup_parent(name: &str) {
    for dir in wharf_runtime::cgroup_dirs(&format!("/{name}")) {
        for d in cgroup_tree(&dir) {
            let _ = std::fs::remove_dir(d);
        }
    }
}

/// Every process in the cgroup `path` (relative to each hierarchy's root) and below it: a
/// job's cgroup holds none itself, its tasks' and steps' leaves do.
pub fn cgroup_procs(path: &str) -> Vec<i32> {
    let mut pids = Vec::new();
    for dir in wharf_runtime::cgroup_dirs(path) {
        for d in cgroup_tree(&dir) {
            let procs = std::fs::read_to_string(d.join("cgroup.procs")).unwrap_or_default();
            pids.extend(procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()));
        }
    }
    pids.sort_unstable();
    pids.dedup();
    pids
}

/// Field 22 of `/proc/PID/stat`: when the process started (clock ticks after boot).
fn start_time(pid: i32) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(19)
        .map(str::to_string)
}

/// Kills what `pids` lists with SIGKILL, again and again, until it lists none or `within` has
/// passed (a dying parent's children may still be forking).
pub fn kill_until_gone(within: Duration, pids: impl Fn() -> Vec<i32>) {
    let deadline = Instant::now() + within;
    loop {
        let left = pids();
        if left.is_empty() || Instant::now() > deadline {
            return;
        }
        left.into_iter().for_each(kill9);
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Sends SIGKILL to `pid`; one already gone is no error.
pub fn kill9(pid: i32) {
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    );
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let spawner = self.spawner_pid();
        self.kill9();
        // Cancelled or not, no shim and no job process may outlive the test.
        spawner.into_iter().chain(self.shim_pids()).for_each(kill9);
        kill_until_gone(Duration::from_secs(5), || self.job_pids());
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
        // The cgroup parent is the test's own: remove it (and any empty job cgroup left in it)
        // so that runs do not pile up cgroups on the machine.
        remove_cgroup_parent(&self.cgroup_parent);
    }
}

/// A `setpriv` command that runs what its further arguments name as `user`, with the user's
/// groups.
pub fn setpriv(user: &User) -> Command {
    let mut cmd = Command::new("setpriv");
    cmd.args([
        format!("--reuid={}", user.uid),
        format!("--regid={}", user.gid),
        "--init-groups".into(),
        "--".into(),
    ]);
    cmd
}

/// Runs `exe args` as `user` with setpriv, from `cwd`.
pub fn as_user(user: &User, cwd: &Path, exe: &str, args: &[&str], socket: &Path) -> Output {
    setpriv(user)
        .arg(exe)
        .args(args)
        .env("WHARF_SOCKET", socket)
        .current_dir(cwd)
        .output()
        .expect("setpriv")
}

/// The job that `wharf show ID --json` printed; panics with its error if it failed.
pub fn show_json(out: &Output, id: u64) -> Value {
    assert!(
        out.status.success(),
        "show {id}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Polls `job` (job `id` as some cluster shows it) until it reaches a terminal state and
/// returns it; after `limit`, fails with `log()`.
pub fn wait_ended(
    job: impl Fn() -> Value,
    id: u64,
    limit: Duration,
    log: impl Fn() -> String,
) -> Value {
    let deadline = Instant::now() + limit;
    loop {
        let job = job();
        let state = job["state"].as_str().unwrap_or_default().to_string();
        if !["PENDING", "STARTING", "RUNNING"].contains(&state.as_str()) {
            return job;
        }
        assert!(
            Instant::now() < deadline,
            "job {id} still {state} after {limit:?}: {job}\n{}",
            log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Parses `Submitted batch job N`.
pub fn submitted_id(out: &Output) -> u64 {
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "submit failed: {}{}",
        text,
        String::from_utf8_lossy(&out.stderr)
    );
    text.trim().rsplit(' ').next().unwrap().parse().unwrap()
}

/// A TLS connection to a controller's TCP port on loopback, checked as agents check it: by
/// the authority in `ca`, for the controller's name.
pub fn tls_stream(
    port: u16,
    ca: &Path,
) -> rustls::StreamOwned<rustls::ClientConnection, std::net::TcpStream> {
    let config = wharf_client::Tls::from_ca_file(ca).unwrap().config();
    let name = wharf_api::wire::CONTROLLER_TLS_NAME.try_into().unwrap();
    let conn = rustls::ClientConnection::new(config, name).unwrap();
    let tcp = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    rustls::StreamOwned::new(conn, tcp)
}

/// stdout as text.
pub fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// stderr as text.
pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A controller listening on TCP at 127.0.0.1 and the agents joined over it, as separate
/// processes (killed on drop), each logging to a file in `dir`.
pub struct TcpCluster {
    pub dir: tempfile::TempDir,
    pub port: u16,
    pub socket: PathBuf,
    config: PathBuf,
    procs: Vec<Child>,
    /// The prefix of its agents' cgroup parents: `PREFIX` for those on the shared config,
    /// `PREFIX-NAME` for each agent with a config of its own. Each "host" needs its own, as
    /// real hosts have: a job's cgroup is named by its id, so two agents under one parent
    /// would share the cgroup of a gang's ranks, and a rank that ends would kill the other
    /// one's processes with its own. Parallel tests' clusters would share job ids too.
    cgroup_parent: String,
    /// The agents started with a config of their own, by name.
    agents: Vec<String>,
}

impl Drop for TcpCluster {
    fn drop(&mut self) {
        for p in &mut self.procs {
            let _ = p.kill();
            let _ = p.wait();
        }
        // Shims outlive their agent by design: a test that ends (or fails) with a job still
        // running stops it here, then the cgroups go (in every hierarchy, on cgroup v1).
        let d = self.dir.path();
        let states = self.agents.iter().map(|n| d.join(format!("agent-{n}")));
        let states: Vec<PathBuf> = states.chain([d.join("agent")]).collect();
        states.iter().flat_map(|s| shim_pids_in(s)).for_each(kill9);
        let names = self.agents.iter().map(|n| self.cgroup_parent_of(n));
        let parents: Vec<String> = names.chain([self.cgroup_parent.clone()]).collect();
        let procs = || -> Vec<i32> {
            let each = parents.iter().map(|p| cgroup_procs(&format!("/{p}")));
            each.flatten().collect()
        };
        kill_until_gone(Duration::from_secs(5), procs);
        for parent in &parents {
            remove_cgroup_parent(parent);
        }
    }
}

impl TcpCluster {
    /// A controller and one agent, `n1`, registered over TCP with the join token; `limits`
    /// is the controller's `[limits]` table.
    pub fn start(limits: &str) -> TcpCluster {
        let mut c = TcpCluster::controller(
            "wharf-tcp-conn-",
            &format!("node_timeout = \"10s\"\n[limits]\n{limits}\n"),
        );
        c.agent("n1", &c.token());
        let deadline = Instant::now() + Duration::from_secs(20);
        while !c.nodes().contains("UP") {
            assert!(Instant::now() < deadline, "the agent never registered");
            std::thread::sleep(Duration::from_millis(100));
        }
        c
    }

    /// A controller alone, listening on a free port of 127.0.0.1, in a scratch directory
    /// named from `prefix`; `more` is added to its `[controller]` table (and may open further
    /// tables). Its log is `ctl.log`.
    pub fn controller(prefix: &str, more: &str) -> TcpCluster {
        let dir = scratch(prefix);
        let d = dir.path();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let socket = d.join("wharf.sock");
        let config = d.join("wharf.toml");
        let n = NEXT.fetch_add(1, Ordering::SeqCst);
        let cgroup_parent = format!("wharf-e2e-tcp-{}-{n}", std::process::id());
        std::fs::write(
            &config,
            format!(
                "[controller]\nstate_dir = \"{0}/ctl\"\nsocket = \"{1}\"\nlisten = \"127.0.0.1:{port}\"\n{more}\n[agent]\nstate_dir = \"{0}/agent\"\nimage_store = \"{0}/images\"\ncgroup_parent = \"{cgroup_parent}\"\n",
                d.display(),
                socket.display()
            ),
        )
        .unwrap();
        let ctl = Command::new(wharf_bin())
            .args(["controller", "--config"])
            .arg(&config)
            .stderr(std::fs::File::create(d.join("ctl.log")).unwrap())
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        let c = TcpCluster {
            dir,
            port,
            socket,
            config,
            procs: vec![ctl],
            cgroup_parent,
            agents: vec![],
        };
        let token = c.token();
        let deadline = Instant::now() + Duration::from_secs(10);
        while !token.exists() || !c.socket.exists() {
            assert!(Instant::now() < deadline, "controller did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
        c
    }

    /// The cgroup parent of agent `name` started by [`TcpCluster::agent_with`] (unless its
    /// `extra` named another).
    pub fn cgroup_parent_of(&self, name: &str) -> String {
        format!("{}-{name}", self.cgroup_parent)
    }

    /// The file holding the controller's join token.
    pub fn token(&self) -> PathBuf {
        self.dir.path().join("ctl/join-token")
    }

    /// The controller's certificate authority, which checks its TCP port.
    pub fn ca(&self) -> PathBuf {
        self.dir.path().join("ctl/ca.pem")
    }

    /// Starts an agent, node `name`, joining over TCP with the token read from `token`; its
    /// log is `NAME.log`.
    pub fn agent(&mut self, name: &str, token: &Path) {
        let config = self.config.clone();
        self.spawn_agent(name, token, &config, self.port, Some(self.ca()));
    }

    /// Starts agent `name` as [`TcpCluster::agent`] does, with a state directory of its own
    /// (`agent-NAME`) and `extra` (TOML lines) in its `[agent]` table: nodes that differ.
    /// The image store is the cluster's `images` and the cgroup parent its own unless `extra`
    /// names them; `extra` may open further tables after its `[agent]` lines.
    pub fn agent_with(&mut self, name: &str, token: &Path, extra: &str) {
        self.agent_at(name, token, extra, self.port);
    }

    /// Starts agent `name` as [`TcpCluster::agent_with`] does, with the join token, reaching
    /// the controller through `port` of 127.0.0.1 (a relay in front of it).
    pub fn agent_via(&mut self, name: &str, port: u16) {
        self.agent_at(name, &self.token(), "", port);
    }

    fn agent_at(&mut self, name: &str, token: &Path, extra: &str, port: u16) {
        let d = self.dir.path();
        let config = d.join(format!("agent-{name}.toml"));
        let store = if extra.contains("image_store") {
            String::new()
        } else {
            format!("image_store = \"{}/images\"\n", d.display())
        };
        let cgroup = if extra.contains("cgroup_parent") {
            String::new()
        } else {
            format!("cgroup_parent = \"{}\"\n", self.cgroup_parent_of(name))
        };
        self.agents.push(name.to_string());
        std::fs::write(
            &config,
            format!(
                "[agent]\nstate_dir = \"{}/agent-{name}\"\n{store}{cgroup}{extra}\n",
                d.display()
            ),
        )
        .unwrap();
        let ca = (!extra.contains("controller_ca")).then(|| self.ca());
        self.spawn_agent(name, token, &config, port, ca);
    }

    /// Starts agent `name` with `config`, the join token in `token`, the controller at
    /// `port`, and the controller's authority `ca` (the config's, or beside the token, if
    /// none).
    fn spawn_agent(
        &mut self,
        name: &str,
        token: &Path,
        config: &Path,
        port: u16,
        ca: Option<PathBuf>,
    ) {
        let log = std::fs::File::create(self.dir.path().join(format!("{name}.log"))).unwrap();
        let mut agent = Command::new(wharf_bin());
        agent
            .args(["agent", "--config"])
            .arg(config)
            .args(["--controller", &format!("127.0.0.1:{port}")])
            .args(["--node-name", name, "--join-token-file"])
            .arg(token);
        if let Some(ca) = ca {
            agent.arg("--controller-ca").arg(ca);
        }
        self.procs
            .push(agent.stderr(log).stdout(Stdio::null()).spawn().unwrap());
    }

    /// Runs the CLI against the controller's Unix socket, from `dir` (a job's output file
    /// goes to the submit directory).
    pub fn wharf(&self, args: &[&str]) -> Output {
        Command::new(wharf_bin())
            .args(args)
            .env("WHARF_SOCKET", &self.socket)
            .current_dir(self.dir.path())
            .output()
            .unwrap()
    }

    /// `wharf nodes`.
    pub fn nodes(&self) -> String {
        stdout(&self.wharf(&["nodes"]))
    }

    /// Waits (`secs` at most) until `n` agents are UP, failing with the node list.
    pub fn wait_nodes_up(&self, n: usize, secs: u64) {
        let deadline = Instant::now() + Duration::from_secs(secs);
        while stdout(&self.wharf(&["nodes", "--json"]))
            .matches("\"UP\"")
            .count()
            < n
        {
            assert!(
                Instant::now() < deadline,
                "agents never registered:\n{}",
                self.nodes()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Job `id` as root sees it.
    pub fn job(&self, id: u64) -> Value {
        show_json(&self.wharf(&["show", &id.to_string(), "--json"]), id)
    }

    /// Job `id` once it has ended (or `limit` passes, which fails the test).
    pub fn wait_done(&self, id: u64, limit: Duration) -> Value {
        wait_ended(|| self.job(id), id, limit, || self.logs())
    }

    /// Waits (up to 30 s, else fails the test) until job `id` runs.
    pub fn wait_running(&self, id: u64) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.job(id)["state"] != "RUNNING" {
            assert!(Instant::now() < deadline, "{}", self.job(id));
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The last lines of the controller's and agent `n1`'s logs.
    pub fn logs(&self) -> String {
        let tail = |name: &str| {
            let text = std::fs::read_to_string(self.dir.path().join(name)).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            lines[lines.len().saturating_sub(8)..].join("\n")
        };
        format!(
            "controller:\n{}\nagent:\n{}",
            tail("ctl.log"),
            tail("n1.log")
        )
    }
}

/// The `KEY=VALUE` lines of a file (a job's printed environment, say).
pub fn vars(path: &Path) -> std::collections::BTreeMap<String, String> {
    let text =
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    text.lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// The nodes of `job` (a record as `wharf show --json` prints it), in rank order.
pub fn nodes_of(job: &Value) -> Vec<String> {
    job["allocs"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|x| x["node"].as_str().unwrap_or_default().to_string())
                .collect()
        })
        .unwrap_or_default()
}
