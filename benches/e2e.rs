//! End to end: `wharf run --image host -- /bin/true` against a one-node `wharf dev` cluster,
//! from the command's start to its exit (submit, schedule, launch, the job's end reported and
//! committed, the client woken), p50 and p99; and, as the anchor, `srun /bin/true` against a
//! private one-node Slurm started in the same run when Debian's `slurm-wlm` and `munge` are
//! installed (its own munged, config, state and ports 16817/16818, all in a temp directory).
//! Without them the anchor is the documented figure for this machine class.
//!
//! Then, on each side: the throughput of `WHARF_BENCH_JOBS` (1,000) short jobs (`wharf submit
//! --wrap true` / `sbatch --wrap true`, from 8 client threads, until the last has ended), and
//! the time to list a queue `WHARF_BENCH_QUEUE_DEPTH` (100,000) held jobs deep (`wharf queue`
//! / `squeue`, printing every row to a pipe, median of 5). Wharf's held jobs are submitted
//! through the client library, Slurm's by `sbatch -H` from 8 threads (its MaxJobCount raised
//! to hold them); 0 skips the listing. Slurm runs with `batch_sched_delay=0`: by default a
//! batch job waits up to 3 s to be scheduled, which made 1,000 trivial jobs on two CPUs take
//! 0.76 jobs/s against 2.07 without the delay.
//!
//! `cargo bench --bench e2e` (as root). WHARF_BENCH_RUNS sets the runs of each (default 200).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use wharf_api::wire::{JobList, SubmitRequest, SubmitResponse};
use wharf_api::JobRequest;
use wharf_client::{Client, Endpoint};

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

/// Client threads for throughput and queue filling.
const CLIENTS: usize = 8;

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Runs `cmd(n)` for n in 0..count from [`CLIENTS`] threads, each to success.
fn from_clients(count: usize, cmd: impl Fn(usize) -> Command + Sync) {
    let next = AtomicUsize::new(0);
    std::thread::scope(|s| {
        for _ in 0..CLIENTS {
            s.spawn(|| loop {
                let n = next.fetch_add(1, Ordering::SeqCst);
                if n >= count {
                    return;
                }
                let out = cmd(n)
                    .stdin(Stdio::null())
                    .output()
                    .expect("starting a client");
                assert!(
                    out.status.success(),
                    "{:?}: {}",
                    cmd(n),
                    String::from_utf8_lossy(&out.stderr)
                );
            });
        }
    });
}

/// Lines `cmd` prints, when it succeeds.
fn lines(mut cmd: Command) -> Option<usize> {
    let out = cmd
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| out.stdout.iter().filter(|&&b| b == b'\n').count())
}

/// Jobs per second of `count` short jobs: submitted by `submit(n)` from [`CLIENTS`] threads,
/// until `left()` (jobs not ended yet) says none is left.
fn throughput(
    name: &str,
    count: usize,
    submit: impl Fn(usize) -> Command + Sync,
    left: impl Fn() -> Option<usize>,
) -> f64 {
    let t0 = Instant::now();
    from_clients(count, submit);
    let submitted = t0.elapsed().as_secs_f64();
    // Slurm on two CPUs runs about two trivial batch jobs a second.
    let limit = Duration::from_secs(600.max(count as u64));
    while left() != Some(0) {
        assert!(
            t0.elapsed() < limit,
            "{name}: jobs still queued after {limit:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let secs = t0.elapsed().as_secs_f64();
    let rate = count as f64 / secs;
    println!(
        "{name:<8} {count} short jobs: submitted in {submitted:.2} s, all ended after {secs:.2} s: \
         {rate:.1} jobs/s"
    );
    rate
}

/// The median of 5 runs of `list` (which must print `rows` lines), ms.
fn listing_ms(name: &str, rows: usize, list: impl Fn() -> Command) -> f64 {
    let mut ms: Vec<f64> = (0..5)
        .map(|_| {
            let t0 = Instant::now();
            let printed = lines(list()).expect("listing the queue");
            let ms = t0.elapsed().as_secs_f64() * 1e3;
            assert_eq!(printed, rows, "{name}: a row per job and a header");
            ms
        })
        .collect();
    ms.sort_by(|a, b| a.total_cmp(b));
    println!(
        "{name:<8} listing {} queued jobs: {:.1} ms (median of 5)",
        rows - 1,
        ms[2]
    );
    ms[2]
}

/// `depth` held jobs submitted to Wharf through the client library.
fn fill_wharf(socket: &Path, depth: usize) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let next = Arc::new(AtomicUsize::new(0));
        let tasks: Vec<_> = (0..CLIENTS)
            .map(|_| {
                let client = Client::new(Endpoint::Unix(socket.to_path_buf()), None);
                let next = next.clone();
                tokio::spawn(async move {
                    loop {
                        let n = next.fetch_add(1, Ordering::SeqCst);
                        if n >= depth {
                            return;
                        }
                        let req = SubmitRequest {
                            job: JobRequest {
                                command: Some(vec!["/bin/true".into()]),
                                name: Some(format!("held-{n}")),
                                hold: Some(true),
                                ..Default::default()
                            },
                            cwd: "/tmp".into(),
                            client_token: Some(format!("e2e-{}-{n}", std::process::id())),
                            registry_auth: None,
                        };
                        let r: SubmitResponse =
                            client.post("/v1/jobs", &req).await.expect("submit");
                        assert!(r.id > 0);
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
    });
}

/// Jobs of Wharf's queue not ended yet.
fn wharf_left(socket: &Path) -> Option<usize> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .ok()?;
    let client = Client::new(Endpoint::Unix(socket.to_path_buf()), None);
    rt.block_on(client.get::<JobList>("/v1/jobs?finished=0&brief=true"))
        .ok()
        .map(|l| l.jobs.len())
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
            "[controller]\nsocket = \"{}\"\n[limits]\nmax_pending_per_user = {}\n\
             [agent]\nimage_store = \"{}\"\ncgroup_parent = \"{cgroup_parent}\"\n",
            socket.display(),
            // The deep queue is one user's.
            queue_depth() + 20_000,
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
        .env_remove("WHARF_SOCKET")
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
             SchedulerType=sched/backfill\nSchedulerParameters=batch_sched_delay=0\n\
             AccountingStorageType=accounting_storage/none\n\
             JobAcctGatherType=jobacct_gather/none\nJobCompType=jobcomp/none\nMpiDefault=none\n\
             ReturnToService=2\nMaxJobCount={}\n\
             NodeName={host} CPUs=2 RealMemory={} State=UNKNOWN\n\
             PartitionName=main Nodes={host} Default=YES MaxTime=INFINITE State=UP\n",
            queue_depth() + 20_000,
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

fn queue_depth() -> usize {
    env_or("WHARF_BENCH_QUEUE_DEPTH", 100_000)
}

fn main() {
    let (runs, dir) = common::start("e2e", "`wharf dev` runs the node agent", "e2e-", 200);
    let (jobs, depth) = (env_or("WHARF_BENCH_JOBS", 1000), queue_depth());
    println!("run-and-wait of /bin/true, {runs} runs each, one node");
    let (wharf, wharf_rate, wharf_list) = {
        let (_dev, socket) = wharf_dev(dir.path());
        let wharf = |args: &[&str]| {
            let mut c = Command::new(env!("CARGO_BIN_EXE_wharf"));
            c.args(args)
                .env("WHARF_SOCKET", &socket)
                .current_dir(dir.path());
            c
        };
        let run = || wharf(&["run", "--image", "host", "--", "/bin/true"]);
        time_runs(5, run);
        let stats = summarize("wharf", "runs", time_runs(runs, run)).expect("no runs measured");
        let rate = throughput(
            "wharf",
            jobs,
            |_| wharf(&["submit", "--image", "host", "--wrap", "true"]),
            || wharf_left(&socket),
        );
        let list = (depth > 0).then(|| {
            fill_wharf(&socket, depth);
            listing_ms("wharf", depth + 1, || wharf(&["queue"]))
        });
        (stats, rate, list)
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
            let stats = summarize("srun", "runs", time_runs(runs, run)).expect("no runs measured");
            let slurm_cmd = |tool: &str, args: &[&str]| {
                let mut c = Command::new(tool);
                c.args(args)
                    .env("SLURM_CONF", &conf)
                    .current_dir(&slurm_dir);
                c
            };
            let rate = throughput(
                "slurm",
                jobs,
                |_| slurm_cmd("sbatch", &["-Q", "-o", "/dev/null", "--wrap", "true"]),
                || lines(slurm_cmd("squeue", &["-h"])),
            );
            let list = (depth > 0).then(|| {
                from_clients(depth, |_| {
                    slurm_cmd("sbatch", &["-Q", "-H", "-o", "/dev/null", "--wrap", "true"])
                });
                listing_ms("squeue", depth + 1, || slurm_cmd("squeue", &[]))
            });
            (stats, Some(rate), list)
        }
        Some(missing) => {
            println!(
                "srun     not measured: {missing} is not installed (apt-get install slurm-wlm \
                 munge); the anchor is the documented {SRUN_DOCUMENTED_MS} ms of this machine class"
            );
            let stats = common::Stats {
                name: "srun".into(),
                p50: SRUN_DOCUMENTED_MS,
                p90: f64::NAN,
                p99: f64::NAN,
            };
            (stats, None, None)
        }
    };
    let (srun, slurm_rate, squeue) = srun;
    if let Some(slurm_rate) = slurm_rate {
        println!(
            "short jobs: wharf {wharf_rate:.1} jobs/s, slurm {slurm_rate:.1} jobs/s (ratio {:.2})",
            wharf_rate / slurm_rate
        );
    }
    if let (Some(w), Some(s)) = (wharf_list, squeue) {
        println!(
            "queue listing at {depth}: wharf queue {w:.1} ms, squeue {s:.1} ms (ratio {:.2}; \
             the goal is at most 0.5)",
            w / s
        );
    }
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
