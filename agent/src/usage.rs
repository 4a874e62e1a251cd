//! Measuring what running jobs use. A sampler thread looks at every running job at a fixed
//! interval: memory and CPU from its cgroup, and utilization, memory and energy of each of its
//! GPUs from NVML. What it gathers is kept in the job's directory (`usage`, 0600), so an agent
//! restart loses nothing, and summarised with the job's end, where the cgroup's final CPU time
//! and memory peak, read by the shim, are exact.

use std::collections::btree_map::Entry;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use wharf_api::usage::{GpuUsage, JobUsage, UsagePoint};
use wharf_runtime::{CgroupUsage, ContainerSpec, JobDir, Outcome};

use crate::discover::Machine;

/// NVIDIA's major number; minors below 255 are GPUs.
const NVIDIA_MAJOR: i64 = 195;

/// What the sampler has gathered for one job so far.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct Tally {
    /// When the first sample was taken, ms since the epoch.
    first_ms: u64,
    /// When the last one was.
    last_ms: u64,
    last_cpu_usec: Option<u64>,
    memory_sum: f64,
    memory_samples: u32,
    memory_peak: u64,
    gpus: Vec<GpuTally>,
    /// Samples and series, as reported.
    usage: JobUsage,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct GpuTally {
    id: u32,
    util_sum: f64,
    util_peak: u32,
    samples: u32,
    memory_peak: u64,
    energy_first_mj: Option<u64>,
    energy_last_mj: Option<u64>,
}

/// One GPU's readings at one sample.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct GpuReading {
    /// Percent of the last period a kernel ran.
    pub util: u32,
    /// Memory in use, bytes.
    pub memory: u64,
    /// Energy drawn since the driver loaded, mJ.
    pub energy_mj: Option<u64>,
}

/// Reads a GPU by its device minor.
pub(crate) trait GpuMeter {
    /// The GPU's readings now; `None` when it cannot be read.
    fn read(&self, minor: u32) -> Option<GpuReading>;
}

/// NVML, with the node's minors mapped to NVML's indices as discovery found them.
struct Nvml {
    nvml: nvml_wrapper::Nvml,
    machine: Machine,
}

impl GpuMeter for Nvml {
    fn read(&self, minor: u32) -> Option<GpuReading> {
        let index = self.machine.gpu(minor).nvml_index?;
        let dev = self.nvml.device_by_index(index).ok()?;
        Some(GpuReading {
            util: dev.utilization_rates().ok()?.gpu,
            memory: dev.memory_info().ok()?.used,
            energy_mj: dev.total_energy_consumption().ok(),
        })
    }
}

/// No GPU library on this node: GPUs are not measured.
struct NoGpus;

impl GpuMeter for NoGpus {
    fn read(&self, _: u32) -> Option<GpuReading> {
        None
    }
}

/// Starts the sampler thread: every `interval`, each running job under `jobs_dir`. GPUs are
/// measured through NVML when discovery described them through it.
pub fn spawn(jobs_dir: std::path::PathBuf, interval: Duration, machine: Machine) {
    if interval.is_zero() {
        return;
    }
    let spawned = std::thread::Builder::new()
        .name("usage".into())
        .spawn(move || {
            let by_nvml = machine.gpus.iter().any(|g| g.nvml_index.is_some());
            let meter: Box<dyn GpuMeter> = match by_nvml {
                true => match crate::discover::open_nvml() {
                    Ok(nvml) => Box::new(Nvml { nvml, machine }),
                    Err(e) => {
                        tracing::info!("GPUs are not measured: NVML is not available ({e})");
                        Box::new(NoGpus)
                    }
                },
                false => Box::new(NoGpus),
            };
            let mut known = BTreeMap::new();
            loop {
                sample_all(
                    &jobs_dir,
                    meter.as_ref(),
                    wharf_runtime::now_ms(),
                    &mut known,
                );
                std::thread::sleep(interval);
            }
        });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "cannot start the usage sampler; jobs are not measured");
    }
}

/// What the sampler keeps of a running job between samples: what it reads once (its cgroup
/// and GPUs, from its spec) and its tally.
#[derive(Debug)]
pub(crate) struct Sampled {
    cgroup: String,
    gpus: Vec<u32>,
    tally: Tally,
}

/// Takes one sample of every job under `jobs_dir` that has started and not ended; `known`
/// keeps what was read of each before (a job seen first, after an agent restart say, starts
/// from the tally in its directory).
pub(crate) fn sample_all(
    jobs_dir: &Path,
    meter: &dyn GpuMeter,
    now_ms: u64,
    known: &mut BTreeMap<PathBuf, Sampled>,
) {
    let Ok(entries) = std::fs::read_dir(jobs_dir) else {
        return;
    };
    let mut running = BTreeSet::new();
    for entry in entries.flatten() {
        let dir = JobDir::new(entry.path());
        if !dir.started().exists() || dir.outcome().exists() {
            continue;
        }
        let job = match known.entry(entry.path()) {
            Entry::Occupied(e) => e.into_mut(),
            Entry::Vacant(e) => {
                let Ok(spec) = dir.read_spec() else {
                    continue;
                };
                e.insert(Sampled {
                    cgroup: spec.cgroup_path(),
                    gpus: gpu_minors(&spec),
                    tally: read_tally(&dir),
                })
            }
        };
        running.insert(entry.path());
        let cgroup = wharf_runtime::cgroup_usage(&job.cgroup);
        let gpus: Vec<(u32, Option<GpuReading>)> =
            job.gpus.iter().map(|&m| (m, meter.read(m))).collect();
        job.tally.add(now_ms, &cgroup, &gpus);
        if let Err(e) = JobDir::write_replace(&dir.usage(), &job.tally) {
            tracing::warn!(dir = %dir.path().display(), error = %e, "cannot keep the job's usage");
        }
    }
    known.retain(|path, _| running.contains(path));
}

/// The job's usage at its end: the sampler's tally with the kernel's final counts.
pub fn summary(dir: &JobDir, outcome: &Outcome) -> Option<JobUsage> {
    let tally = std::fs::metadata(dir.usage())
        .is_ok()
        .then(|| read_tally(dir));
    match (tally, &outcome.usage) {
        (None, None) => None,
        (tally, last) => Some(tally.unwrap_or_default().finish(last.as_ref())),
    }
}

/// The GPUs a job was given: the NVIDIA GPU device nodes in its spec.
fn gpu_minors(spec: &ContainerSpec) -> Vec<u32> {
    let mut minors: Vec<u32> = spec
        .devices
        .iter()
        .filter(|d| d.major == NVIDIA_MAJOR && (0..255).contains(&d.minor))
        .map(|d| d.minor as u32)
        .collect();
    minors.sort_unstable();
    minors.dedup();
    minors
}

fn read_tally(dir: &JobDir) -> Tally {
    std::fs::read(dir.usage())
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default()
}

impl Tally {
    fn add(&mut self, now_ms: u64, cgroup: &CgroupUsage, gpus: &[(u32, Option<GpuReading>)]) {
        if self.usage.samples == 0 {
            self.first_ms = now_ms;
        }
        let cpu_pct = match (self.last_cpu_usec, cgroup.cpu_usec) {
            (Some(before), Some(now)) if now_ms > self.last_ms => {
                let busy_ms = now.saturating_sub(before) as f64 / 1000.0;
                Some((busy_ms * 100.0 / (now_ms - self.last_ms) as f64).round() as u32)
            }
            _ => None,
        };
        if let Some(m) = cgroup.memory_current {
            self.memory_sum += m as f64;
            self.memory_samples += 1;
            self.memory_peak = self.memory_peak.max(m);
        }
        let mut utils = Vec::new();
        for &(id, reading) in gpus {
            let Some(r) = reading else { continue };
            let pos = match self.gpus.iter().position(|g| g.id == id) {
                Some(p) => p,
                None => {
                    self.gpus.push(GpuTally {
                        id,
                        ..GpuTally::default()
                    });
                    self.gpus.len() - 1
                }
            };
            let g = &mut self.gpus[pos];
            g.util_sum += f64::from(r.util);
            g.util_peak = g.util_peak.max(r.util);
            g.samples += 1;
            g.memory_peak = g.memory_peak.max(r.memory);
            g.energy_first_mj = g.energy_first_mj.or(r.energy_mj);
            g.energy_last_mj = r.energy_mj.or(g.energy_last_mj);
            utils.push(r.util);
        }
        self.usage.samples += 1;
        self.usage.push_point(UsagePoint {
            at_ms: now_ms.saturating_sub(self.first_ms),
            cpu_pct,
            memory: cgroup.memory_current,
            gpu_util: (!utils.is_empty())
                .then(|| utils.iter().sum::<u32>().div_ceil(utils.len() as u32)),
        });
        self.last_ms = now_ms;
        self.last_cpu_usec = cgroup.cpu_usec.or(self.last_cpu_usec);
    }

    /// The summary, with the kernel's final counts where the shim read them.
    fn finish(self, last: Option<&CgroupUsage>) -> JobUsage {
        let last = last.copied().unwrap_or_default();
        let sampled_peak = (self.memory_samples > 0).then_some(self.memory_peak);
        JobUsage {
            cpu_time_ms: last.cpu_usec.or(self.last_cpu_usec).map(|us| us / 1000),
            memory_peak: match (last.memory_peak, sampled_peak) {
                (Some(a), Some(b)) => Some(a.max(b)),
                (a, b) => a.or(b),
            },
            memory_avg: (self.memory_samples > 0)
                .then(|| (self.memory_sum / f64::from(self.memory_samples)) as u64),
            io_read: last.io_read,
            io_write: last.io_write,
            gpus: self
                .gpus
                .iter()
                .map(|g| GpuUsage {
                    id: g.id,
                    util_avg: (g.util_sum / f64::from(g.samples.max(1))).round() as u32,
                    util_peak: g.util_peak,
                    memory_peak: g.memory_peak,
                    energy_j: g
                        .energy_first_mj
                        .zip(g.energy_last_mj)
                        .map(|(a, b)| b.saturating_sub(a) / 1000),
                })
                .collect(),
            ..self.usage
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A GPU that reads as the test says.
    struct Fixed(GpuReading);

    impl GpuMeter for Fixed {
        fn read(&self, minor: u32) -> Option<GpuReading> {
            (minor == 3).then_some(self.0)
        }
    }

    fn cg(cpu_usec: u64, memory: u64) -> CgroupUsage {
        CgroupUsage {
            cpu_usec: Some(cpu_usec),
            memory_current: Some(memory),
            ..CgroupUsage::default()
        }
    }

    #[test]
    fn samples_add_up_to_averages_peaks_and_energy() {
        let mut t = Tally::default();
        let busy = |util, energy_mj| {
            Some(GpuReading {
                util,
                memory: 1 << 30,
                energy_mj: Some(energy_mj),
            })
        };
        t.add(10_000, &cg(0, 100), &[(3, busy(90, 5_000))]);
        t.add(11_000, &cg(500_000, 300), &[(3, busy(100, 305_000))]);
        t.add(12_000, &cg(1_500_000, 200), &[(3, busy(80, 605_000))]);
        let u = t.finish(None);
        assert_eq!(u.samples, 3);
        assert_eq!(u.cpu_time_ms, Some(1_500));
        assert_eq!(u.memory_avg, Some(200));
        assert_eq!(u.memory_peak, Some(300));
        let g = &u.gpus[0];
        assert_eq!((g.id, g.util_avg, g.util_peak), (3, 90, 100));
        assert_eq!(g.energy_j, Some(600));
        let pcts: Vec<Option<u32>> = u.series.iter().map(|p| p.cpu_pct).collect();
        assert_eq!(pcts, [None, Some(50), Some(100)]);
        assert_eq!(u.series[2].at_ms, 2_000);
    }

    #[test]
    fn the_kernels_final_counts_win_over_samples() {
        let mut t = Tally::default();
        t.add(0, &cg(1_000, 5 << 20), &[]);
        let last = CgroupUsage {
            cpu_usec: Some(2_000_000),
            memory_peak: Some(9 << 20),
            io_write: Some(4096),
            ..CgroupUsage::default()
        };
        let u = t.finish(Some(&last));
        assert_eq!(u.cpu_time_ms, Some(2_000));
        assert_eq!(u.memory_peak, Some(9 << 20));
        assert_eq!(u.io_write, Some(4096));
        assert!(u.gpus.is_empty(), "no GPU was read: none is invented");
    }

    #[test]
    fn running_jobs_are_sampled_into_their_directory_and_summarised_at_the_end() {
        let jobs = tempfile::tempdir().unwrap();
        let dir = JobDir::new(jobs.path().join("7"));
        let mut spec = wharf_runtime::conformance::template("wharf-7", Path::new("/"), 1000, 1000);
        spec.devices = vec![wharf_runtime::DeviceNode {
            host_path: "/dev/nvidia3".into(),
            path: "/dev/nvidia3".into(),
            major: NVIDIA_MAJOR,
            minor: 3,
        }];
        dir.create(&spec).unwrap();
        let meter = Fixed(GpuReading {
            util: 40,
            memory: 2 << 30,
            energy_mj: None,
        });
        let mut known = BTreeMap::new();
        sample_all(jobs.path(), &meter, 1_000, &mut known);
        assert!(
            !dir.usage().exists(),
            "a job not yet started is not sampled"
        );
        std::fs::write(dir.started(), "1000").unwrap();
        sample_all(jobs.path(), &meter, 2_000, &mut known);
        // An agent restarted between samples starts from the tally in the directory.
        let mut known = BTreeMap::new();
        sample_all(jobs.path(), &meter, 3_000, &mut known);
        let outcome = Outcome {
            exit_code: Some(0),
            ..Outcome::default()
        };
        let u = summary(&dir, &outcome).unwrap();
        assert_eq!(u.samples, 2);
        assert_eq!(u.gpus.len(), 1);
        assert_eq!((u.gpus[0].id, u.gpus[0].util_avg), (3, 40));
        assert_eq!(u.gpus[0].memory_peak, 2 << 30);
        assert_eq!(u.gpus[0].energy_j, None);
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.usage()).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        // Ended: no more samples.
        JobDir::write_atomic(&dir.outcome(), &outcome).unwrap();
        sample_all(jobs.path(), &meter, 4_000, &mut known);
        assert!(known.is_empty(), "an ended job is forgotten");
        assert_eq!(summary(&dir, &outcome).unwrap().samples, 2);
    }
}
