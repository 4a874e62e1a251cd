//! The controller at scale: submits per second at increasing queue depths, the time to list
//! the queue at each depth, and the controller's memory per pending job.
//!
//! A controller (no nodes, so every job stays pending; SQLite with full sync, as always) runs
//! in a scratch directory. `WHARF_BENCH_CLIENTS` (8) clients submit over its Unix socket
//! through the client library, each a fresh connection with a client token, as the CLI does.
//! At each depth of `WHARF_BENCH_DEPTHS` (0,10000,30000,50000,100000 pending jobs) the queue is
//! filled to that depth, then a window of `WHARF_BENCH_WINDOW` (10000) submits is timed (long
//! enough to hold several scheduling passes, which at depth come every second or so); then, at
//! the depth after the window, listing the queue is timed (median of 5) as the raw API call
//! and as `wharf queue` printing the table, and the controller's resident memory is read. Last, the same
//! clients run `wharf submit` itself (`WHARF_BENCH_CLI` submits, 400), as a person or a
//! workflow tool would, at the deepest depth.
//!
//! The anchor is Slurm's documented submit rate, 500 jobs/s for `sbatch` (420–550/s measured
//! with 8 clients on the development VM).
//!
//! `cargo bench --bench submit`. `WHARF_BENCH_BIN` names a prebuilt `wharf` binary to run
//! instead of the one Cargo built (to run the benchmark on another machine).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use wharf_api::listing::Rows;
use wharf_api::wire::{JobList, SubmitRequest, SubmitResponse};
use wharf_api::JobRequest;
use wharf_client::{Client, Endpoint};

/// Slurm's documented `sbatch` rate, jobs per second.
const SLURM_SUBMITS_PER_S: f64 = 500.0;

/// The `wharf` binary under test.
fn wharf_bin() -> PathBuf {
    std::env::var_os("WHARF_BENCH_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| env!("CARGO_BIN_EXE_wharf").into())
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A controller alone in a scratch directory, killed on drop.
struct Controller {
    child: Child,
    socket: PathBuf,
    _dir: tempfile::TempDir,
}

impl Drop for Controller {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Controller {
    fn start() -> Controller {
        let dir = tempfile::Builder::new()
            .prefix("wharf-bench-submit-")
            .tempdir_in("/var/tmp")
            .unwrap();
        let d = dir.path();
        let socket = d.join("wharf.sock");
        let config = d.join("wharf.toml");
        std::fs::write(
            &config,
            format!(
                "[controller]\nstate_dir = \"{}\"\nsocket = \"{}\"\n[limits]\nmax_pending_per_user = 100000000\n",
                d.join("ctl").display(),
                socket.display()
            ),
        )
        .unwrap();
        let child = Command::new(wharf_bin())
            .args(["controller", "--config"])
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(d.join("ctl.log")).unwrap())
            .spawn()
            .expect("start wharf controller");
        let deadline = Instant::now() + Duration::from_secs(20);
        while !socket.exists() {
            assert!(Instant::now() < deadline, "the controller did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        Controller {
            child,
            socket,
            _dir: dir,
        }
    }

    /// Resident memory, bytes.
    fn rss(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map_or(0, |kb| kb * 1024)
    }
}

/// `count` submits from `clients` concurrent clients; returns the seconds they took.
async fn submit_burst(socket: &Path, clients: usize, count: usize, next: &Arc<AtomicUsize>) -> f64 {
    let end = next.load(Ordering::SeqCst) + count;
    let t0 = Instant::now();
    let tasks: Vec<_> = (0..clients)
        .map(|_| {
            let client = Client::new(Endpoint::Unix(socket.to_path_buf()), None);
            let next = next.clone();
            tokio::spawn(async move {
                loop {
                    let n = next.fetch_add(1, Ordering::SeqCst);
                    if n >= end {
                        next.fetch_min(end, Ordering::SeqCst);
                        return;
                    }
                    let req = SubmitRequest {
                        job: JobRequest {
                            command: Some(vec!["/bin/true".into()]),
                            name: Some(format!("bench-{n}")),
                            ..Default::default()
                        },
                        cwd: "/tmp".into(),
                        client_token: Some(format!("bench-{}-{n}", std::process::id())),
                        registry_auth: None,
                    };
                    let r: SubmitResponse = client.post("/v1/jobs", &req).await.expect("submit");
                    assert!(r.id > 0);
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    t0.elapsed().as_secs_f64()
}

/// `count` runs of `wharf submit` from `clients` threads; returns the seconds they took.
fn cli_burst(socket: &Path, clients: usize, count: usize) -> f64 {
    let next = Arc::new(AtomicUsize::new(0));
    let t0 = Instant::now();
    let threads: Vec<_> = (0..clients)
        .map(|_| {
            let (socket, next) = (socket.to_path_buf(), next.clone());
            std::thread::spawn(move || {
                while next.fetch_add(1, Ordering::SeqCst) < count {
                    let out = Command::new(wharf_bin())
                        .args(["submit", "--json", "--wrap", "true"])
                        .env("WHARF_SOCKET", &socket)
                        .current_dir("/tmp")
                        .output()
                        .unwrap();
                    assert!(
                        out.status.success(),
                        "{}",
                        String::from_utf8_lossy(&out.stderr)
                    );
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    t0.elapsed().as_secs_f64()
}

/// The median of 5 timings of `f`, ms.
async fn median_ms<F: std::future::Future<Output = ()>>(mut f: impl FnMut() -> F) -> f64 {
    let mut ms = Vec::new();
    for _ in 0..5 {
        let t0 = Instant::now();
        f().await;
        ms.push(t0.elapsed().as_secs_f64() * 1000.0);
    }
    ms.sort_by(|a, b| a.total_cmp(b));
    ms[2]
}

/// Listing times at the depth reached, ms (each the median of 5): the list call alone (whole
/// records, and rows as `wharf queue` asks), and `wharf queue` printing the table; and the
/// jobs listed.
async fn list_times(socket: &Path) -> (f64, f64, f64, usize) {
    let client = Client::new(Endpoint::Unix(socket.to_path_buf()), None);
    let listed = client
        .get::<JobList>("/v1/jobs?finished=0")
        .await
        .unwrap()
        .jobs
        .len();
    let api_ms = median_ms(|| async {
        let list: JobList = client.get("/v1/jobs?finished=0").await.unwrap();
        assert_eq!(list.jobs.len(), listed);
    })
    .await;
    let rows_ms = median_ms(|| async {
        let body = client
            .get_bytes("/v1/jobs?finished=0&brief=true&rows=true")
            .await
            .unwrap();
        let list: Rows = serde_json::from_slice(&body).unwrap();
        assert_eq!(list.rows.len(), listed);
    })
    .await;
    let cli_ms = median_ms(|| async {
        let out = Command::new(wharf_bin())
            .arg("queue")
            .env("WHARF_SOCKET", socket)
            .stdout(Stdio::piped())
            .output()
            .unwrap();
        assert!(out.status.success());
        let rows = out.stdout.iter().filter(|&&b| b == b'\n').count();
        assert_eq!(rows, listed + 1, "one row per job and a header");
    })
    .await;
    (api_ms, rows_ms, cli_ms, listed)
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let clients: usize = env_or("WHARF_BENCH_CLIENTS", 8);
    let window: usize = env_or("WHARF_BENCH_WINDOW", 10_000);
    let cli_count: usize = env_or("WHARF_BENCH_CLI", 400);
    let depths: Vec<usize> = std::env::var("WHARF_BENCH_DEPTHS")
        .unwrap_or_else(|_| "0,10000,30000,50000,100000".into())
        .split(',')
        .map(|d| d.trim().parse().expect("WHARF_BENCH_DEPTHS: numbers"))
        .collect();
    let ctl = Controller::start();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let next = Arc::new(AtomicUsize::new(0));
    let rss0 = ctl.rss();
    println!(
        "controller: no nodes, SQLite full sync; {clients} clients over the Unix socket; \
         windows of {window} submits"
    );
    println!(
        "{:>8} {:>10} {:>8} {:>10} {:>10} {:>10} {:>8} {:>10}",
        "depth", "submits/s", "listed", "list API", "rows API", "queue CLI", "RSS MiB", "bytes/job"
    );
    let mut last_rate = 0.0;
    let mut per_job = 0.0;
    for &depth in &depths {
        let have = next.load(Ordering::SeqCst);
        if depth > have {
            rt.block_on(submit_burst(&ctl.socket, clients, depth - have, &next));
        }
        let at = next.load(Ordering::SeqCst);
        let secs = rt.block_on(submit_burst(&ctl.socket, clients, window, &next));
        last_rate = window as f64 / secs;
        // Taken before the listings, whose answers (megabytes at depth) are not the queue's.
        let rss = ctl.rss();
        per_job = rss.saturating_sub(rss0) as f64 / (at + window) as f64;
        let (api_ms, rows_ms, cli_ms, listed) = rt.block_on(list_times(&ctl.socket));
        assert_eq!(listed, at + window, "every acknowledged submit is listed");
        println!(
            "{:>8} {:>10.0} {:>8} {:>8.1}ms {:>8.1}ms {:>8.1}ms {:>8.1} {:>10.0}",
            at,
            last_rate,
            listed,
            api_ms,
            rows_ms,
            cli_ms,
            rss as f64 / (1u64 << 20) as f64,
            per_job
        );
    }
    let deepest = next.load(Ordering::SeqCst);
    let cli_secs = cli_burst(&ctl.socket, clients, cli_count);
    println!(
        "wharf submit (the CLI as client, {cli_count} submits at depth {deepest}): {:.0} submits/s",
        cli_count as f64 / cli_secs
    );
    println!(
        "memory: {per_job:.0} bytes per pending job ({} MiB at start)",
        rss0 >> 20
    );
    println!(
        "anchor: Slurm's documented sbatch rate, {SLURM_SUBMITS_PER_S:.0} jobs/s (420-550/s \
         measured from 8 clients on the development VM)"
    );
    println!(
        "RESULT submit submits_per_s={last_rate:.0} slurm_submits_per_s={SLURM_SUBMITS_PER_S:.0} ratio={:.2}",
        last_rate / SLURM_SUBMITS_PER_S
    );
}
