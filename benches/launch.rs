//! Launch-to-exec latency: from the moment the agent asks for a container to the first
//! instruction of the job's process, p50 and p99 over many launches, for Wharf's sandbox and,
//! on the same bundle in the same run, for runc, youki's CLI and crun where they run here.
//!
//! The job's process is a static program that prints CLOCK_MONOTONIC as its first act; the
//! clock is shared by every namespace, so `stamp - t0` is the launch latency.
//!
//! `cargo bench --bench launch` (as root). WHARF_BENCH_RUNS sets the launches per runtime;
//! WHARF_BENCH_STAMP names a prebuilt static stamp program for nodes without `cc`.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use wharf_runtime::conformance::template;
use wharf_runtime::{JobDir, JobStatus, Launcher};

const STAMP_C: &str = "#include <stdio.h>\n#include <time.h>\nint main(void){struct timespec t;\
clock_gettime(CLOCK_MONOTONIC,&t);printf(\"%lld\\n\",(long long)t.tv_sec*1000000000LL+t.tv_nsec);return 0;}\n";

use wharf_runtime::timeline::{self, monotonic_ns as mono_ns};

mod common;
use common::{percentile, summarize};

fn stamp_of(file: &Path) -> Option<i64> {
    std::fs::read_to_string(file).ok()?.trim().parse().ok()
}

/// Builds the bundle: a rootfs holding only the static stamp program.
fn bundle(dir: &Path) -> PathBuf {
    let rootfs = dir.join("rootfs");
    for d in ["proc", "sys", "dev", "tmp", "etc"] {
        std::fs::create_dir_all(rootfs.join(d)).unwrap();
    }
    // A node without a C toolchain (a GPU node, say) can be given the program built elsewhere.
    if let Some(prebuilt) = std::env::var_os("WHARF_BENCH_STAMP") {
        std::fs::copy(&prebuilt, rootfs.join("stamp"))
            .expect("WHARF_BENCH_STAMP: a static stamp program");
        return rootfs;
    }
    std::fs::write(dir.join("stamp.c"), STAMP_C).unwrap();
    let cc = Command::new("cc")
        .args(["-O2", "-static", "-o"])
        .arg(rootfs.join("stamp"))
        .arg(dir.join("stamp.c"))
        .status()
        .expect("cc (gcc) is needed to build the stamp program");
    assert!(
        cc.success(),
        "cannot build a static stamp program (libc6-dev?)"
    );
    rootfs
}

/// Wharf's launches: the latency of each, and for each step of the shim's timeline its time
/// after the launch call (ms), run by run.
fn wharf(
    launcher: &Launcher,
    runs: usize,
    dir: &Path,
    rootfs: &Path,
) -> (Vec<f64>, Vec<Vec<(String, f64)>>) {
    let out_dir = dir.join("out");
    std::fs::create_dir_all(&out_dir).unwrap();
    std::fs::set_permissions(
        &out_dir,
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )
    .unwrap();
    let mut ms = Vec::new();
    let mut steps = Vec::new();
    for i in 0..runs {
        let out = out_dir.join(format!("wharf-{i}"));
        let mut spec = template(
            &format!("wharf-bench-{}-{i}", std::process::id()),
            rootfs,
            4242,
            4242,
        );
        spec.argv = vec!["/stamp".into()];
        spec.env = vec!["PATH=/".into()];
        spec.hostname = "bench".into();
        spec.cpuset = vec![0];
        spec.pids = Some(64);
        spec.stdout = out.clone();
        spec.stderr = out.clone();
        spec.time_limit = Some(60);
        spec.cgroup_parent = "wharf-bench".into();
        let jd = JobDir::new(dir.join(format!("job-{i}")));
        let t0 = mono_ns();
        launcher.launch(&jd, &spec).expect("launch");
        loop {
            match launcher.status(&jd) {
                // Poll gently: the measurement must not compete with the launch for the CPUs.
                JobStatus::Running { .. } => std::thread::sleep(Duration::from_millis(20)),
                JobStatus::Exited(o) => {
                    assert!(o.error.is_none(), "wharf launch failed: {:?}", o.error);
                    break;
                }
                JobStatus::Lost(why) => panic!("{why}"),
            }
        }
        if let Some(stamp) = stamp_of(&out) {
            ms.push((stamp - t0) as f64 / 1e6);
            steps.push(
                timeline::read(&jd)
                    .into_iter()
                    .map(|(step, ns)| (step, (ns - t0) as f64 / 1e6))
                    .collect(),
            );
        }
        let _ = launcher.remove(&jd);
    }
    report_missing("wharf", runs, ms.len());
    (ms, steps)
}

/// Says how many launches left no stamp (and are not counted), if any did.
fn report_missing(name: &str, runs: usize, stamped: usize) {
    if stamped < runs {
        println!(
            "{name:<8} {} of {runs} launch(es) left no stamp (not counted)",
            runs - stamped
        );
    }
}

/// The median time after the launch call at which each step of the shim's timeline ended.
fn print_steps(runs: &[Vec<(String, f64)>], exec_p50: f64) {
    let Some(first) = runs.first() else { return };
    let mut line = String::from("wharf    steps (p50 ms after the launch call):");
    for (k, (step, _)) in first.iter().enumerate() {
        let mut at: Vec<f64> = runs
            .iter()
            .filter_map(|r| r.get(k).filter(|(s, _)| s == step).map(|(_, t)| *t))
            .collect();
        at.sort_by(|a, b| a.total_cmp(b));
        if !at.is_empty() {
            line.push_str(&format!(" {step} {:.2},", percentile(&at, 0.5)));
        }
    }
    println!("{line} first instruction {exec_p50:.2}");
}

/// An OCI CLI runtime (runc, youki, crun) on the same rootfs: `RUNTIME run` in the foreground.
fn oci_cli(
    name: &str,
    tag: &str,
    runs: usize,
    dir: &Path,
    rootfs: &Path,
) -> Result<Vec<f64>, String> {
    let bin = [
        "/usr/sbin",
        "/usr/bin",
        "/usr/local/bin",
        "/root/.cargo/bin",
    ]
    .iter()
    .map(|d| Path::new(d).join(name))
    .find(|p| p.exists())
    .ok_or_else(|| format!("{name} is not installed"))?;
    let bundle = dir.join(format!("bundle-{name}"));
    std::fs::create_dir_all(&bundle).unwrap();
    let spec = serde_json::json!({
        "ociVersion": "1.0.2",
        "root": { "path": rootfs, "readonly": true },
        "process": { "terminal": false, "user": { "uid": 4242, "gid": 4242 }, "args": ["/stamp"],
                     "env": ["PATH=/"], "cwd": "/", "noNewPrivileges": true },
        "hostname": "bench",
        "mounts": [
            { "destination": "/proc", "type": "proc", "source": "proc" },
            { "destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "strictatime", "mode=755", "size=65536k"] },
            { "destination": "/tmp", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "nodev"] }
        ],
        "linux": {
            "namespaces": [{ "type": "pid" }, { "type": "ipc" }, { "type": "uts" }, { "type": "mount" }],
            "cgroupsPath": format!("/{name}-bench"),
            "resources": { "devices": [{ "allow": false, "access": "rwm" }], "memory": { "limit": 268435456 } }
        }
    });
    std::fs::write(
        bundle.join("config.json"),
        serde_json::to_vec_pretty(&spec).unwrap(),
    )
    .unwrap();
    let mut ms = Vec::new();
    let mut hung = 0;
    for i in 0..runs {
        let out = dir.join("out").join(format!("{name}-{i}"));
        let file = std::fs::File::create(&out).unwrap();
        let id = format!("{name}-{tag}-{}-{i}", std::process::id());
        let t0 = mono_ns();
        let mut child = Command::new(&bin)
            .args(["run", "--bundle"])
            .arg(&bundle)
            .arg(&id)
            .stdin(Stdio::null())
            .stdout(file)
            .stderr(Stdio::piped())
            .env("RUST_BACKTRACE", "0")
            .spawn()
            .map_err(|e| format!("{name}: {e}"))?;
        // An anchor that hangs (youki 0.7 now and then waits forever on its exited child) is
        // killed and counted, not waited for.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let status = loop {
            match child.try_wait().map_err(|e| format!("{name}: {e}"))? {
                Some(s) => break Some(s),
                None if std::time::Instant::now() > deadline => {
                    let _ = child.kill();
                    let _ = child.wait();
                    break None;
                }
                None => std::thread::sleep(Duration::from_millis(2)),
            }
        };
        // runc removes a container run in the foreground; youki leaves it stopped.
        let _ = Command::new(&bin).args(["delete", "-f", &id]).output();
        let Some(status) = status else {
            hung += 1;
            continue;
        };
        if !status.success() {
            let mut err = String::new();
            if let Some(mut e) = child.stderr.take() {
                let _ = std::io::Read::read_to_string(&mut e, &mut err);
            }
            return Err(format!("{name} refused to run here: {}", err.trim()));
        }
        if let Some(stamp) = stamp_of(&out) {
            ms.push((stamp - t0) as f64 / 1e6);
        }
    }
    report_missing(name, runs - hung, ms.len());
    if hung > 0 {
        println!("{name:<8} hung {hung} time(s) of {runs} (killed after 10 s, not counted)");
    }
    Ok(ms)
}

fn main() {
    let (runs, dir) = common::start("launch", "it creates namespaces and cgroups", "", 100);
    let rootfs = bundle(dir.path());
    println!("launch-to-exec latency, {runs} launches each, same static program and rootfs");
    // One warm-up launch each so page cache and binaries are hot for everyone.
    // One launcher, as an agent has, with its shim spawner started as the agent starts it.
    let launcher = Launcher::new(PathBuf::from(env!("CARGO_BIN_EXE_wharf")));
    launcher.warm_up().expect("starting the shim spawner");
    let _ = wharf(&launcher, 1, dir.path(), &rootfs);
    let (ms, steps) = wharf(&launcher, runs, dir.path(), &rootfs);
    let ours = summarize("wharf", "launches", ms).expect("no wharf launches measured");
    print_steps(&steps, ours.p50);
    let mut anchors = Vec::new();
    for name in ["runc", "youki", "crun"] {
        let _ = oci_cli(name, "warm", 1, dir.path(), &rootfs);
        match oci_cli(name, "bench", runs, dir.path(), &rootfs) {
            Ok(ms) => anchors.extend(summarize(name, "launches", ms)),
            Err(why) => println!("{name:<8} not measured: {why}"),
        }
    }
    for a in &anchors {
        println!(
            "wharf/{:<6} p50 ratio {:.3}  p99 ratio {:.3}",
            a.name,
            ours.p50 / a.p50,
            ours.p99 / a.p99
        );
    }
    match anchors.iter().find(|a| a.name == "runc") {
        Some(runc) => println!(
            "RESULT launch p50_ms={:.2} runc_p50_ms={:.2} ratio={:.3}",
            ours.p50,
            runc.p50,
            ours.p50 / runc.p50
        ),
        None => println!(
            "RESULT launch p50_ms={:.2} runc_p50_ms=unavailable ratio=unavailable",
            ours.p50
        ),
    }
}
