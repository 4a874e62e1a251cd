//! What the benchmarks share: percentiles and the summary line of one measured series.

/// The `p` quantile (0..=1) of sorted values, nearest rank.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

/// The p50, p90 and p99 of one series.
pub struct Stats {
    pub name: String,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
}

/// Prints `name`'s count of `what` (launches, runs) with p50, p90 and p99; `None` for no
/// values.
pub fn summarize(name: &str, what: &str, mut ms: Vec<f64>) -> Option<Stats> {
    if ms.is_empty() {
        return None;
    }
    ms.sort_by(|a, b| a.total_cmp(b));
    let s = Stats {
        name: name.into(),
        p50: percentile(&ms, 0.5),
        p90: percentile(&ms, 0.9),
        p99: percentile(&ms, 0.99),
    };
    println!(
        "{:<8} {what}={:<4} p50={:>8.2} ms  p90={:>8.2} ms  p99={:>8.2} ms",
        s.name,
        ms.len(),
        s.p50,
        s.p90,
        s.p99
    );
    Some(s)
}

/// What every benchmark starts with: it exits unless run as root (saying `why` root is
/// needed), reads the runs asked for in WHARF_BENCH_RUNS (else `default_runs`) and makes a
/// scratch directory `wharf-bench-PREFIX...` under /var/tmp, 0755 (the jobs' users pass
/// through it), removed when dropped.
pub fn start(
    bench: &str,
    why: &str,
    prefix: &str,
    default_runs: usize,
) -> (usize, tempfile::TempDir) {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("{bench} benchmark: needs root ({why})");
        std::process::exit(1);
    }
    let runs = std::env::var("WHARF_BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default_runs);
    let dir = tempfile::Builder::new()
        .prefix(&format!("wharf-bench-{prefix}"))
        .tempdir_in("/var/tmp")
        .unwrap();
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    (runs, dir)
}
