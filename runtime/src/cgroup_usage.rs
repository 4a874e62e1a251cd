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

/// What the kernel has counted in a job's cgroup so far; `None` where this node's cgroups do
/// not count it (no such controller, or a kernel without the file).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CgroupUsage {
    /// CPU time of every process that ran in it, µs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_usec: Option<u64>,
    /// Memory in use now, bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_current: Option<u64>,
    /// The most memory it ever used, bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_peak: Option<u64>,
    /// Bytes read from block devices.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub io_read: Option<u64>,
    /// Bytes written to block devices.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub io_write: Option<u64>,
}

/// Reads what the kernel counted for the cgroup at `cgroup_path` (v2: `cpu.stat`,
/// `memory.current`, `memory.peak`, `io.stat`; v1: `cpuacct.usage`,
/// `memory.usage_in_bytes`, `memory.max_usage_in_bytes`, `blkio.throttle.io_service_bytes`).
pub fn usage(cgroup_path: &str) -> CgroupUsage {
    let rel = cgroup_path.trim_start_matches('/');
    let root = Path::new(CGROUP_ROOT);
    let read = |p: PathBuf| std::fs::read_to_string(p).ok();
    let number = |p: PathBuf| read(p).and_then(|t| t.trim().parse::<u64>().ok());
    if is_v2() {
        let dir = root.join(rel);
        let (io_read, io_write) = read(dir.join("io.stat")).map(|t| io_stat(&t)).unzip();
        CgroupUsage {
            cpu_usec: read(dir.join("cpu.stat")).and_then(|t| keyed(&t, "usage_usec")),
            memory_current: number(dir.join("memory.current")),
            memory_peak: number(dir.join("memory.peak")),
            io_read,
            io_write,
        }
    } else {
        let memory = root.join("memory").join(rel);
        let blkio = read(
            root.join("blkio")
                .join(rel)
                .join("blkio.throttle.io_service_bytes"),
        );
        let (io_read, io_write) = blkio.map(|t| blkio_bytes(&t)).unzip();
        CgroupUsage {
            cpu_usec: number(root.join("cpuacct").join(rel).join("cpuacct.usage"))
                .map(|ns| ns / 1000),
            memory_current: number(memory.join("memory.usage_in_bytes")),
            memory_peak: number(memory.join("memory.max_usage_in_bytes")),
            io_read,
            io_write,
        }
    }
}

/// The value of `key` in a `key value` per line file (`cpu.stat`).
fn keyed(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

/// Bytes read and written over every device of a v2 `io.stat`
/// (`8:0 rbytes=1 wbytes=2 rios=3 ...`).
fn io_stat(text: &str) -> (u64, u64) {
    let mut sum = (0u64, 0u64);
    for field in text.split_whitespace() {
        if let Some(v) = field
            .strip_prefix("rbytes=")
            .and_then(|v| v.parse::<u64>().ok())
        {
            sum.0 = sum.0.saturating_add(v);
        } else if let Some(v) = field
            .strip_prefix("wbytes=")
            .and_then(|v| v.parse::<u64>().ok())
        {
            sum.1 = sum.1.saturating_add(v);
        }
    }
    sum
}

/// Bytes read and written over every device of a v1 `blkio.throttle.io_service_bytes`
/// (`8:0 Read 1`, `8:0 Write 2`, ..., `Total 3`).
fn blkio_bytes(text: &str) -> (u64, u64) {
    let mut sum = (0u64, 0u64);
    for line in text.lines() {
        let mut f = line.split_whitespace();
        let (Some(_dev), Some(op), Some(v)) = (f.next(), f.next(), f.next()) else {
            continue;
        };
        let Ok(v) = v.parse::<u64>() else { continue };
        match op {
            "Read" => sum.0 = sum.0.saturating_add(v),
            "Write" => sum.1 = sum.1.saturating_add(v),
            _ => {}
        }
    }
    sum
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_are_read_from_both_hierarchies_formats() {
        let stat = "usage_usec 1500000\nuser_usec 1000000\nsystem_usec 500000\n";
        assert_eq!(keyed(stat, "usage_usec"), Some(1_500_000));
        assert_eq!(keyed(stat, "nr_throttled"), None);
        assert_eq!(
            io_stat("8:0 rbytes=100 wbytes=20 rios=1 wios=1\n259:0 rbytes=5 wbytes=7 rios=1\n"),
            (105, 27)
        );
        let blkio = "8:0 Read 4096\n8:0 Write 512\n8:0 Sync 0\n8:16 Read 10\nTotal 4618\n";
        assert_eq!(blkio_bytes(blkio), (4106, 512));
    }

    #[test]
    fn a_missing_cgroup_counts_nothing() {
        assert_eq!(usage("/wharf-no-such-cgroup/x"), CgroupUsage::default());
    }
}
