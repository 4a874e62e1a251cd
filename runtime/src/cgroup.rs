//! Reading what the kernel recorded in a job's cgroup, for v1 and v2 hierarchies.

use std::path::{Path, PathBuf};

/// Root of the cgroup filesystems.
pub(crate) const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// True on a pure cgroup v2 host.
pub(crate) fn is_v2() -> bool {
    static V2: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *V2.get_or_init(|| Path::new(CGROUP_ROOT).join("cgroup.controllers").exists())
}

/// Number of OOM kills recorded in the job's memory cgroup (`memory.oom_control` on v1,
/// `memory.events` on v2). 0 when the cgroup or the counter is missing.
pub(crate) fn oom_kills(cgroup_path: &str) -> u64 {
    let rel = cgroup_path.trim_start_matches('/');
    let file = if is_v2() {
        Path::new(CGROUP_ROOT).join(rel).join("memory.events")
    } else {
        Path::new(CGROUP_ROOT)
            .join("memory")
            .join(rel)
            .join("memory.oom_control")
    };
    std::fs::read_to_string(file)
        .ok()
        .and_then(|text| {
            text.lines().find_map(|l| {
                let (k, v) = l.split_once(' ')?;
                (k == "oom_kill").then(|| v.trim().parse().ok()).flatten()
            })
        })
        .unwrap_or(0)
}

/// Pids still in the job's cgroup (any hierarchy that has the directory).
pub(crate) fn pids(cgroup_path: &str) -> Vec<i32> {
    let rel = cgroup_path.trim_start_matches('/');
    let file = if is_v2() {
        Path::new(CGROUP_ROOT).join(rel).join("cgroup.procs")
    } else {
        Path::new(CGROUP_ROOT)
            .join("pids")
            .join(rel)
            .join("cgroup.procs")
    };
    std::fs::read_to_string(file)
        .map(|t| t.lines().filter_map(|l| l.trim().parse().ok()).collect())
        .unwrap_or_default()
}

/// Every directory this job's cgroup has on the host (to check that none is left behind).
pub fn cgroup_dirs(cgroup_path: &str) -> Vec<PathBuf> {
    let rel = cgroup_path.trim_start_matches('/');
    if is_v2() {
        let p = Path::new(CGROUP_ROOT).join(rel);
        return if p.exists() { vec![p] } else { vec![] };
    }
    let Ok(entries) = std::fs::read_dir(CGROUP_ROOT) else {
        return vec![];
    };
    let mut dirs: Vec<PathBuf> = entries
        .flatten()
        .map(|e| e.path().join(rel))
        .filter(|p| p.is_dir())
        .collect();
    dirs.sort();
    dirs
}
