//! Separate hosts on one machine: network namespaces on a private bridge, a controller and one
//! `wharf agent` per host, all removed on drop.
//!
//! The bed is a small switched network that nothing else can see:
//!
//! ```text
//!   netns wharf-PID-N-sw          netns wharf-PID-N-h0 ... -hK
//!   ┌──────────────────────┐      ┌───────────────────────────┐
//!   │ br0 10.77.0.1/24     │      │ fab0 10.77.0.(10+i)/24    │
//!   │  ├─ p0 ══ veth ══════╪══════╪═ fab0   wharf agent nodeI │
//!   │  ├─ p1 ...           │      │         its jobs          │
//!   │ wharf controller     │      └───────────────────────────┘
//!   └──────────────────────┘
//! ```
//!
//! The bridge and the controller live in a namespace of their own, not in the machine's: the
//! machine's firewall (Docker's `FORWARD DROP` with `br_netfilter`) does not apply there, no
//! route is added to the machine, and two beds never collide, so every bed can use the same
//! subnet. Users reach the controller through its Unix socket, which is a file. Each agent
//! enters its host's namespace itself (setns before exec), so its jobs, which share the
//! node's network, live there too; unlike `ip netns exec`, nothing else (`/sys`, cgroups)
//! changes.

use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::harness::{
    cgroup_procs, kill9, kill_until_gone, remove_cgroup_parent, scratch, show_json, wait_ended,
    wharf_bin,
};

/// The interface every host talks over (its `fabric_interface`).
pub const FABRIC_IF: &str = "fab0";
/// The controller's address on the bridge.
pub const CONTROLLER_ADDR: &str = "10.77.0.1";
const CONTROLLER_PORT: u16 = 6817;

static NEXT: AtomicU32 = AtomicU32::new(0);

/// A named network namespace (`ip netns add`); on drop, every process in it is killed and it
/// is deleted.
pub struct Netns {
    pub name: String,
}

/// Runs `ip ARGS`; the error says what failed and why.
fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("cannot run `ip` (iproute2): {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "`ip {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

impl Netns {
    /// Creates namespace `name` with its loopback up.
    pub fn add(name: &str) -> Result<Netns, String> {
        ip(&["netns", "add", name])?;
        let ns = Netns { name: name.into() };
        ns.ip(&["link", "set", "lo", "up"])?;
        Ok(ns)
    }

    /// Runs `ip -n NAME ARGS`.
    pub fn ip(&self, args: &[&str]) -> Result<(), String> {
        ip(&[&["-n", self.name.as_str()][..], args].concat())
    }

    fn path(&self) -> PathBuf {
        Path::new("/run/netns").join(&self.name)
    }

    /// A command that runs `program` in this namespace (only the network changes).
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let ns = std::fs::File::open(self.path())
            .unwrap_or_else(|e| panic!("opening {}: {e}", self.path().display()));
        let mut cmd = Command::new(program);
        // SAFETY: setns is async-signal-safe; the file stays open until the child has
        // exec'd, since the closure owns it.
        unsafe {
            cmd.pre_exec(move || {
                use std::os::fd::AsRawFd;
                if libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        cmd
    }

    /// Every process whose network namespace this is.
    pub fn pids(&self) -> Vec<i32> {
        let Ok(me) = std::fs::metadata(self.path()) else {
            return vec![];
        };
        let mut pids = Vec::new();
        for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|p| p.parse::<i32>().ok()) else {
                continue;
            };
            if std::fs::metadata(e.path().join("ns/net"))
                .is_ok_and(|m| m.ino() == me.ino() && m.dev() == me.dev())
            {
                pids.push(pid);
            }
        }
        pids
    }

    /// Kills every process in the namespace with SIGKILL, until none is left (a dying
    /// parent's children may still be forking).
    pub fn kill_all(&self) {
        kill_until_gone(Duration::from_secs(10), || self.pids());
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        self.kill_all();
        if let Err(e) = ip(&["netns", "delete", &self.name]) {
            eprintln!("leaving network namespace {}: {e}", self.name);
        }
    }
}

/// Removes the namespaces of beds whose test process is gone (killed before its drop ran),
/// with whatever still runs in them: `wharf-PID-N-sw` and `wharf-PID-N-hI` where no process
/// PID exists.
fn sweep_stale() {
    let Ok(entries) = std::fs::read_dir("/run/netns") else {
        return;
    };
    for e in entries.flatten() {
        let Some(name) = e.file_name().to_str().map(str::to_string) else {
            continue;
        };
        let words: Vec<&str> = name.split('-').collect();
        let ours = matches!(words[..], ["wharf", pid, n, last]
            if pid.parse::<u32>().is_ok()
                && n.parse::<u32>().is_ok()
                && (last == "sw" || last.strip_prefix('h').is_some_and(|i| i.parse::<u32>().is_ok())));
        if ours && !Path::new("/proc").join(words[1]).exists() {
            drop(Netns { name });
        }
    }
}

/// A private bridge in a namespace of its own and `n` hosts, each a namespace with a veth
/// pair to the bridge and its own address.
pub struct Fabric {
    /// The hosts, in order (host `i` is at [`Fabric::addr`]`(i)`).
    pub hosts: Vec<Netns>,
    /// The bridge's namespace (dropped after the hosts: their veths go with them).
    pub switch: Netns,
}

impl Fabric {
    /// Builds the network; fails, removing what it made, when this machine cannot (no root,
    /// no `ip`, no veth or bridge support).
    pub fn new(n: usize) -> Result<Fabric, String> {
        sweep_stale();
        let tag = format!(
            "wharf-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::SeqCst)
        );
        let switch = Netns::add(&format!("{tag}-sw"))?;
        switch.ip(&["link", "add", "br0", "type", "bridge"])?;
        switch.ip(&[
            "addr",
            "add",
            &format!("{CONTROLLER_ADDR}/24"),
            "dev",
            "br0",
        ])?;
        switch.ip(&["link", "set", "br0", "up"])?;
        let mut fabric = Fabric {
            hosts: Vec::new(),
            switch,
        };
        for i in 0..n {
            let host = Netns::add(&format!("{tag}-h{i}"))?;
            let port = format!("p{i}");
            fabric.switch.ip(&[
                "link", "add", &port, "type", "veth", "peer", "name", FABRIC_IF, "netns",
                &host.name,
            ])?;
            fabric
                .switch
                .ip(&["link", "set", &port, "master", "br0", "up"])?;
            host.ip(&[
                "addr",
                "add",
                &format!("{}/24", Self::addr(i)),
                "dev",
                FABRIC_IF,
            ])?;
            host.ip(&["link", "set", FABRIC_IF, "up"])?;
            fabric.hosts.push(host);
        }
        Ok(fabric)
    }

    /// A network of `n` hosts for `test`; None (after printing why) when this machine cannot
    /// make one (not root, no `ip`, no veth or bridge), a panic instead under
    /// WHARF_TEST_STRICT=1.
    pub fn for_test(test: &str, n: usize) -> Option<Fabric> {
        if !crate::harness::can_run(test) {
            return None;
        }
        match Fabric::new(n) {
            Ok(f) => Some(f),
            Err(e) => {
                let why = format!("{test}: cannot make a network of separate hosts: {e}");
                if std::env::var("WHARF_TEST_STRICT").as_deref() == Ok("1") {
                    panic!("{why}");
                }
                eprintln!("SKIPPED {why}");
                None
            }
        }
    }

    /// Host `i`'s address.
    pub fn addr(i: usize) -> String {
        format!("10.77.0.{}", 10 + i)
    }

    /// Unplugs host `i` at the switch: it runs on, but nobody hears it.
    pub fn unplug(&self, i: usize) {
        self.switch
            .ip(&["link", "set", &format!("p{i}"), "down"])
            .unwrap();
    }

    /// Plugs host `i` back in.
    pub fn plug(&self, i: usize) {
        self.switch
            .ip(&["link", "set", &format!("p{i}"), "up"])
            .unwrap();
    }
}

/// A controller and one agent per host of a [`Fabric`], as separate processes: nodes
/// `node1`..`nodeN` (host `i` is `node{i+1}`), joined over TCP with the token, each with its
/// own state directory, cgroup parent and `fabric_interface`. Logs: `ctl.log`, `nodeI.log`.
pub struct MultiHost {
    pub socket: PathBuf,
    controller: Option<Child>,
    agents: Vec<Option<Child>>,
    /// Each host's own agent config keys.
    agent_more: Vec<String>,
    tag: String,
    /// Dropped after the processes are gone (see `Drop`), and before the directory.
    pub fabric: Fabric,
    pub dir: tempfile::TempDir,
}

impl MultiHost {
    /// Starts a bed of `n` hosts and waits until every node is UP; `more` is added to the
    /// controller's config after its `[controller]` keys (and may open further tables).
    /// Returns None (after printing why) when this machine cannot make the network, and
    /// panics instead under WHARF_TEST_STRICT=1.
    pub fn start(test: &str, n: usize, more: &str) -> Option<MultiHost> {
        Self::start_with_agents(test, n, more, &|_| String::new())
    }

    /// [`MultiHost::start`] with `agent(i)` added to host `i`'s agent config (after its
    /// `[agent]` keys), so that one node can differ from the others.
    pub fn start_with_agents(
        test: &str,
        n: usize,
        more: &str,
        agent: &dyn Fn(usize) -> String,
    ) -> Option<MultiHost> {
        let fabric = Fabric::for_test(test, n)?;
        let dir = scratch("wharf-hosts-");
        let d = dir.path();
        let tag = fabric.switch.name.trim_end_matches("-sw").to_string();
        let config = d.join("wharf.toml");
        std::fs::write(
            &config,
            format!(
                "[controller]\nstate_dir = \"{0}/ctl\"\nsocket = \"{0}/wharf.sock\"\n\
                 listen = \"{CONTROLLER_ADDR}:{CONTROLLER_PORT}\"\n\
                 node_timeout = \"10s\"\npoll_wait = \"2s\"\n{more}\n",
                d.display()
            ),
        )
        .unwrap();
        let mut bed = MultiHost {
            socket: d.join("wharf.sock"),
            controller: None,
            agents: (0..n).map(|_| None).collect(),
            agent_more: (0..n).map(agent).collect(),
            tag,
            fabric,
            dir,
        };
        bed.start_controller();
        for i in 0..n {
            bed.start_agent(i);
        }
        // An agent that stops at once (a config error) fails the test with its log, not
        // after the wait for its node.
        std::thread::sleep(Duration::from_millis(300));
        for (i, a) in bed.agents.iter_mut().enumerate() {
            if let Some(status) = a.as_mut().and_then(|a| a.try_wait().ok().flatten()) {
                panic!("agent {} exited ({status}):\n{}", Self::node(i), bed.logs());
            }
        }
        let names: Vec<String> = (0..n).map(Self::node).collect();
        bed.wait_nodes(&names, "UP", Duration::from_secs(60));
        Some(bed)
    }

    /// Starts the controller in the switch's namespace (its log appended to `ctl.log`) and
    /// waits for its socket and join token.
    fn start_controller(&mut self) {
        let d = self.dir.path();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(d.join("ctl.log"))
            .unwrap();
        let controller = self
            .fabric
            .switch
            .command(wharf_bin())
            .args(["controller", "--config"])
            .arg(d.join("wharf.toml"))
            .stderr(log)
            .stdout(Stdio::null())
            .spawn()
            .expect("start the controller");
        self.controller = Some(controller);
        let deadline = Instant::now() + Duration::from_secs(30);
        while !self.token().exists() || !self.socket.exists() {
            assert!(
                Instant::now() < deadline,
                "the controller did not start:\n{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The controller is killed (SIGKILL: what it held only in memory is lost) and started
    /// again from its state directory; agents and jobs run on.
    pub fn restart_controller(&mut self) {
        if let Some(mut c) = self.controller.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_file(&self.socket);
        self.start_controller();
    }

    /// Host `i`'s node name.
    pub fn node(i: usize) -> String {
        format!("node{}", i + 1)
    }

    fn token(&self) -> PathBuf {
        self.dir.path().join("ctl/join-token")
    }

    /// Host `i`'s agent's cgroup parent: its jobs' cgroups are made under it.
    pub fn cgroup_parent(&self, i: usize) -> String {
        format!("{}-{}", self.tag, Self::node(i))
    }

    /// Starts (again) host `i`'s agent, in its namespace; it keeps its state directory.
    pub fn start_agent(&mut self, i: usize) {
        let d = self.dir.path();
        let name = Self::node(i);
        let config = d.join(format!("agent-{name}.toml"));
        std::fs::write(
            &config,
            format!(
                "[agent]\nstate_dir = \"{0}/agent-{name}\"\nimage_store = \"{0}/images\"\n\
                 cgroup_parent = \"{1}\"\nfabric_interface = \"{FABRIC_IF}\"\ngrace = \"2s\"\n\
                 env = {{ GLOO_SOCKET_IFNAME = \"{FABRIC_IF}\", NCCL_SOCKET_IFNAME = \"{FABRIC_IF}\" }}\n{2}\n",
                d.display(),
                self.cgroup_parent(i),
                self.agent_more[i],
            ),
        )
        .unwrap();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(d.join(format!("{name}.log")))
            .unwrap();
        let agent = self.fabric.hosts[i]
            .command(wharf_bin())
            .args(["agent", "--config"])
            .arg(&config)
            .args([
                "--controller",
                &format!("{CONTROLLER_ADDR}:{CONTROLLER_PORT}"),
            ])
            .args(["--node-name", &name, "--join-token-file"])
            .arg(self.token())
            .stderr(log)
            .stdout(Stdio::null())
            .spawn()
            .expect("start an agent");
        self.agents[i] = Some(agent);
    }

    /// Host `i`'s agent is killed (SIGKILL: what it held only in memory is lost) and started
    /// again from its state directory; its shims and jobs run on.
    pub fn restart_agent(&mut self, i: usize) {
        self.kill_agent(i);
        self.start_agent(i);
    }

    /// Host `i`'s agent is killed (SIGKILL), and nothing else of the host.
    fn kill_agent(&mut self, i: usize) {
        if let Some(mut a) = self.agents[i].take() {
            let _ = a.kill();
            let _ = a.wait();
        }
    }

    /// Host `i` crashes: its agent, shims and every job process on it die at once (all of
    /// its namespace's processes, and anything left in its agent's cgroups).
    pub fn crash(&mut self, i: usize) {
        self.kill_agent(i);
        self.fabric.hosts[i].kill_all();
        self.job_pids(i).into_iter().for_each(kill9);
    }

    /// Every process in host `i`'s jobs' cgroups (its agent's cgroup parent, all levels).
    pub fn job_pids(&self, i: usize) -> Vec<i32> {
        cgroup_procs(&format!("/{}", self.cgroup_parent(i)))
    }

    /// The peak resident memory (`VmHWM`, KiB) of the controller and of each agent, by name.
    pub fn peak_memory_kib(&self) -> Vec<(String, u64)> {
        let peak = |pid: u32| {
            let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
            text.lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
                .unwrap_or(0)
        };
        let mut out = vec![];
        if let Some(c) = &self.controller {
            out.push(("controller".to_string(), peak(c.id())));
        }
        for (i, a) in self.agents.iter().enumerate() {
            if let Some(a) = a {
                out.push((Self::node(i), peak(a.id())));
            }
        }
        out
    }

    /// Runs the CLI as root against the controller's Unix socket, from the bed's directory
    /// (jobs' output files land there).
    pub fn wharf(&self, args: &[&str]) -> Output {
        Command::new(wharf_bin())
            .args(args)
            .env("WHARF_SOCKET", &self.socket)
            .current_dir(self.dir.path())
            .output()
            .unwrap()
    }

    /// `wharf nodes --json`: node name → state.
    pub fn node_states(&self) -> std::collections::BTreeMap<String, String> {
        let out = self.wharf(&["nodes", "--json"]);
        let v: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        v["nodes"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|n| {
                Some((
                    n["info"]["name"].as_str()?.to_string(),
                    n["state"].as_str()?.to_string(),
                ))
            })
            .collect()
    }

    /// Waits until every node in `names` is in `state` (`UP`, `DOWN`).
    pub fn wait_nodes(&self, names: &[String], state: &str, limit: Duration) {
        let deadline = Instant::now() + limit;
        loop {
            let states = self.node_states();
            if names
                .iter()
                .all(|n| states.get(n).map(String::as_str) == Some(state))
            {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "nodes {names:?} not all {state} after {limit:?}: {states:?}\n{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Job `id` as root sees it.
    pub fn job(&self, id: u64) -> Value {
        show_json(&self.wharf(&["show", &id.to_string(), "--json"]), id)
    }

    /// Waits until job `id` has ended; returns it.
    pub fn wait_done(&self, id: u64, limit: Duration) -> Value {
        wait_ended(|| self.job(id), id, limit, || self.logs())
    }

    /// Waits until `pred` holds of job `id`; returns it.
    pub fn wait_job(
        &self,
        id: u64,
        what: &str,
        limit: Duration,
        pred: impl Fn(&Value) -> bool,
    ) -> Value {
        let deadline = Instant::now() + limit;
        loop {
            let job = self.job(id);
            if pred(&job) {
                return job;
            }
            assert!(
                Instant::now() < deadline,
                "job {id} not {what} after {limit:?}: {job}\n{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Everything job `id` wrote to its output files in the bed's directory (`wharf-ID.out`
    /// and any per-node or per-task file named after it).
    pub fn output(&self, id: u64) -> String {
        let mut names: Vec<PathBuf> = std::fs::read_dir(self.dir.path())
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                p.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
                    n.strip_prefix(&format!("wharf-{id}"))
                        .is_some_and(|rest| rest.starts_with(['.', '-', '_']))
                })
            })
            .collect();
        names.sort();
        names
            .iter()
            .map(|p| std::fs::read_to_string(p).unwrap_or_default())
            .collect()
    }

    /// Waits up to a minute for job `id`'s output to hold `text` (a job's own mark that it
    /// got as far as that), failing with the beds' logs.
    pub fn wait_output(&self, id: u64, text: &str) {
        let started = std::time::Instant::now();
        while !self.output(id).contains(text) {
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "job {id} never wrote {text:?}:\n{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// The last lines of the controller's and every agent's log.
    pub fn logs(&self) -> String {
        let tail = |name: &str| {
            let text = std::fs::read_to_string(self.dir.path().join(name)).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            lines[lines.len().saturating_sub(15)..].join("\n")
        };
        let mut all = format!("controller:\n{}\n", tail("ctl.log"));
        for i in 0..self.agents.len() {
            let name = Self::node(i);
            all.push_str(&format!("{name}:\n{}\n", tail(&format!("{name}.log"))));
        }
        all
    }

    /// Submits `args` (after `submit`) as root; returns the job id.
    pub fn submit(&self, args: &[&str]) -> u64 {
        let out = self.wharf(&[&["submit"][..], args].concat());
        crate::harness::submitted_id(&out)
    }
}

impl Drop for MultiHost {
    fn drop(&mut self) {
        for p in self.agents.iter_mut().chain([&mut self.controller]) {
            if let Some(mut p) = p.take() {
                let _ = p.kill();
                let _ = p.wait();
            }
        }
        // Every process of the bed lives in one of its namespaces; jobs also in cgroups.
        for ns in self.fabric.hosts.iter().chain([&self.fabric.switch]) {
            ns.kill_all();
        }
        for i in 0..self.agents.len() {
            kill_until_gone(Duration::from_secs(5), || self.job_pids(i));
            // The agent's cgroup parent is the test's own.
            remove_cgroup_parent(&self.cgroup_parent(i));
        }
        if std::thread::panicking() {
            eprintln!("{}", self.logs());
        }
    }
}
