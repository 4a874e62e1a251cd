//! End to end: `wharf run --image host -- /bin/true` against a one-node `wharf dev` cluster,
//! from the command's start to its exit (submit, schedule, launch, the job's end reported and
//! committed, the client woken), p50 and p99; and, as the anchor, `srun /bin/true` against a
//! private one-node Slurm started in the same run when Debian's `slurm-wlm` and `munge` are
//! installed (its own munged, config, state and ports 16817/16818, all in a temp directory).
//! Without them the anchor is the documented figure for this machine class.
//!
//! `cargo bench --bench e2e` (as root). WHARF_BENCH_RUNS sets the runs of each (default 200).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::summarize;

/// `srun /bin/true` p50 measured with Debian's Slurm 22.05 on the 2-core development VM, the
/// anchor when Slurm is not installed here.
const SRUN_DOCUMENTED_MS: f64 = 29.0;

/// Daemons started for the benchmark, killed (and reaped) when dropped, and the cgroup
/// parent of their jobs, removed then.
struct Daemons(Vec<Child>, Option<String>);

impl Drop for Daemons {
    fn drop(&mut self) {
        for c in self.0.iter_mut().rev() {
            let _ = c.kill();
            let _ = c.wait();
        }
        for dir in self.1.iter().flat_map(|p| wharf_runtime::cgroup_dirs(p)) {
            let _ = std::fs::remove_dir(dir);
        }
    }
}

/// Runs `cmd` (stdout and stderr discarded) `runs` times; the wall time of each, ms.
fn time_runs(runs: usize, mut cmd: impl FnMut() -> Command) -> Vec<f64> {
    (0..runs)
        .map(|_| {
            let t0 = Instant::now();
            let status = cmd()
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .expect("starting the client");
            let ms = t0.elapsed().as_secs_f64() * 1e3;
            assert!(status.success(), "{:?} failed: {status}", cmd());
            ms
        })
        .collect()
}

/// Waits until `ready` says yes, 30 s at most.
fn wait_for(what: &str, mut ready: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !ready() {
        assert!(Instant::now() < deadline, "{what} did not come up in 30 s");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A one-node `wharf dev` cluster in `dir`; returns it and the socket.
fn wharf_dev(dir: &Path) -> (Daemons, PathBuf) {
    let socket = dir.join("wharf.sock");
    let config = dir.join("wharf.toml");
    let cgroup_parent = format!("wharf-bench-e2e-{}", std::process::id());
    std::fs::write(
        &config,
        format!(
            "[controller]\nsocket = \"{}\"\n[agent]\nimage_store = \"{}\"\ncgroup_parent = \"{cgroup_parent}\"\n",
            socket.display(),
            dir.join("images").display(),
        ),
    )
    .unwrap();
    let log = std::fs::File::create(dir.join("dev.log")).unwrap();
    let dev = Command::new(env!("CARGO_BIN_EXE_wharf"))
        .args(["dev", "--config"])
        .arg(&config)
        .arg("--data-dir")
        .arg(dir.join("data"))
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("starting wharf dev");
    let daemons = Daemons(vec![dev], Some(format!("/{cgroup_parent}")));
    wait_for("wharf dev", || {
        Command::new(env!("CARGO_BIN_EXE_wharf"))
            .args(["nodes", "--json"])
            .env("WHARF_SOCKET", &socket)
            .output()
            .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("\"UP\""))
    });
    (daemons, socket)
}

/// Whether `tool` is on the PATH or in /usr/sbin.
fn installed(tool: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("PATH=$PATH:/usr/sbin command -v {tool}")])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// A private one-node Slurm in `dir` (munged, slurmctld, slurmd in the foreground); returns
/// the daemons and the config clients are given through SLURM_CONF.
fn slurm(dir: &Path) -> (Daemons, PathBuf) {
    use std::os::unix::fs::PermissionsExt;
    let key = dir.join("munge.key");
    let mut bytes = vec![0u8; 1024];
    std::io::Read::read_exact(
        &mut std::fs::File::open("/dev/urandom").unwrap(),
        &mut bytes,
    )
    .unwrap();
    std::fs::write(&key, bytes).unwrap();
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o400)).unwrap();
    let munge_socket = dir.join("munge.sock");
    let munged = Command::new("munged")
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .arg("--foreground")
        .arg("--force")
        .arg(format!("--socket={}", munge_socket.display()))
        .arg(format!("--key-file={}", key.display()))
        .arg(format!("--pid-file={}", dir.join("munged.pid").display()))
        .arg(format!("--log-file={}", dir.join("munged.log").display()))
        .arg(format!("--seed-file={}", dir.join("munged.seed").display()))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("starting munged");
    let mut daemons = Daemons(vec![munged], None);
    wait_for("munged", || munge_socket.exists());
    let host = String::from_utf8(Command::new("hostname").arg("-s").output().unwrap().stdout)
        .unwrap()
        .trim()
        .to_string();
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap();
    let total_mb: u64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map(|kb| kb / 1024)
        .unwrap();
    for d in ["state", "spool"] {
        std::fs::create_dir_all(dir.join(d)).unwrap();
    }
    let d = dir.display();
    let conf = dir.join("slurm.conf");
    std::fs::write(
        &conf,
        format!(
            "ClusterName=wharfbench\nSlurmctldHost={host}\nSlurmctldPort=16817\nSlurmdPort=16818\n\
             AuthType=auth/munge\nCredType=cred/munge\nAuthInfo=socket={d}/munge.sock\n\
             SlurmUser=root\nSlurmdUser=root\nStateSaveLocation={d}/state\nSlurmdSpoolDir={d}/spool\n\
             SlurmctldPidFile={d}/slurmctld.pid\nSlurmdPidFile={d}/slurmd.pid\n\
             SlurmctldLogFile={d}/slurmctld.log\nSlurmdLogFile={d}/slurmd.log\n\
             ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\nSelectType=select/cons_tres\n\
             SchedulerType=sched/backfill\nAccountingStorageType=accounting_storage/none\n\
             JobAcctGatherType=jobacct_gather/none\nJobCompType=jobcomp/none\nMpiDefault=none\n\
             ReturnToService=2\n\
             NodeName={host} CPUs=2 RealMemory={} State=UNKNOWN\n\
             PartitionName=main Nodes={host} Default=YES MaxTime=INFINITE State=UP\n",
            total_mb.saturating_sub(512)
        ),
    )
    .unwrap();
    for daemon in ["slurmctld", "slurmd"] {
        let child = Command::new(daemon)
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .arg("-D")
            .arg("-f")
            .arg(&conf)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("starting {daemon}: {e}"));
        daemons.0.push(child);
    }
    wait_for("slurm's node", || {
        Command::new("sinfo")
            .args(["-h", "-o", "%T"])
            .env("SLURM_CONF", &conf)
            .output()
            .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "idle")
    });
    (daemons, conf)
}

fn main() {
    let (runs, dir) = common::start("e2e", "`wharf dev` runs the node agent", "e2e-", 200);
    println!("run-and-wait of /bin/true, {runs} runs each, one node");
    let wharf = {
        let (_dev, socket) = wharf_dev(dir.path());
        let run = || {
            let mut c = Command::new(env!("CARGO_BIN_EXE_wharf"));
            c.args(["run", "--image", "host", "--", "/bin/true"])
                .env("WHARF_SOCKET", &socket)
                .current_dir(dir.path());
            c
        };
        time_runs(5, run);
        summarize("wharf", "runs", time_runs(runs, run)).expect("no runs measured")
    };
    let tools = ["munged", "slurmctld", "slurmd", "srun", "sinfo"];
    let srun = match tools.iter().find(|t| !installed(t)) {
        None => {
            let slurm_dir = dir.path().join("slurm");
            std::fs::create_dir(&slurm_dir).unwrap();
            let (_slurm, conf) = slurm(&slurm_dir);
            let run = || {
                let mut c = Command::new("srun");
                c.arg("/bin/true")
                    .env("SLURM_CONF", &conf)
                    .current_dir(&slurm_dir);
                c
            };
            time_runs(5, run);
            summarize("srun", "runs", time_runs(runs, run)).expect("no runs measured")
        }
        Some(missing) => {
            println!(
                "srun     not measured: {missing} is not installed (apt-get install slurm-wlm \
                 munge); the anchor is the documented {SRUN_DOCUMENTED_MS} ms of this machine class"
            );
            common::Stats {
                name: "srun".into(),
                p50: SRUN_DOCUMENTED_MS,
                p99: f64::NAN,
            }
        }
    };
    println!(
        "{}/{} p50 ratio {:.3} (>1: Wharf is faster)",
        srun.name,
        wharf.name,
        srun.p50 / wharf.p50
    );
    println!(
        "RESULT e2e run_p50_ms={:.2} srun_p50_ms={:.2} ratio={:.3}",
        wharf.p50,
        srun.p50,
        srun.p50 / wharf.p50
    );
}
