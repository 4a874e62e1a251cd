//! What a job used, as its node measured it: CPU time, memory and block I/O from its cgroup,
//! and for each of its GPUs the utilization, memory and energy NVML reported. Absent where the
//! node could not measure it (no such cgroup controller, no NVML), never invented.

use serde::{Deserialize, Serialize};

/// Most points kept in a job's time series; older points are merged pairwise to make room.
pub const SERIES_POINTS: usize = 48;

/// What a job used over its run.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobUsage {
    /// CPU time of all its processes, ms (exact: the kernel's count at its end).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_time_ms: Option<u64>,
    /// The most memory it used at once, bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_peak: Option<u64>,
    /// Its memory averaged over the samples, bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_avg: Option<u64>,
    /// Bytes read from block devices.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub io_read: Option<u64>,
    /// Bytes written to block devices.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub io_write: Option<u64>,
    /// Each of its GPUs, by the node's id for it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpus: Vec<GpuUsage>,
    /// How many samples the averages are over.
    #[serde(default)]
    pub samples: u32,
    /// A coarse time series, at most [`SERIES_POINTS`] points.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub series: Vec<UsagePoint>,
}

/// One GPU's use over a job's run.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuUsage {
    /// The node's id for it (device minor).
    pub id: u32,
    /// Mean of the sampled utilization (percent of time a kernel ran), rounded.
    pub util_avg: u32,
    /// Highest sampled utilization, percent.
    pub util_peak: u32,
    /// Most GPU memory in use at a sample, bytes.
    pub memory_peak: u64,
    /// Energy it drew while the job ran, joules (GPUs since Volta report it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub energy_j: Option<u64>,
}

/// One point of a job's time series.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UsagePoint {
    /// Since the job started, ms.
    pub at_ms: u64,
    /// CPU busy since the previous point, percent of one CPU (200 = two CPUs all the time).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_pct: Option<u32>,
    /// Memory in use, bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<u64>,
    /// Mean utilization of its GPUs, percent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_util: Option<u32>,
}

impl JobUsage {
    /// Adds what a step used, or a step's node (`other`): CPU time summed, the higher
    /// memory peak kept (as sacct's TotalCPU and MaxRSS add up steps).
    pub fn add_step(&mut self, other: &JobUsage) {
        self.cpu_time_ms = match (self.cpu_time_ms, other.cpu_time_ms) {
            (Some(x), Some(y)) => Some(x + y),
            (x, y) => x.or(y),
        };
        self.memory_peak = self.memory_peak.max(other.memory_peak);
    }

    /// `first` with every one of `more` added ([`JobUsage::add_step`]); `None` when there is
    /// nothing measured at all.
    pub fn sum<'a>(
        first: Option<JobUsage>,
        more: impl IntoIterator<Item = &'a JobUsage>,
    ) -> Option<JobUsage> {
        more.into_iter().fold(first, |acc, s| {
            let mut u = acc.unwrap_or_default();
            u.add_step(s);
            Some(u)
        })
    }

    /// Adds a point to the series, merging the oldest pairs when it is full.
    pub fn push_point(&mut self, p: UsagePoint) {
        if self.series.len() >= SERIES_POINTS {
            self.series = self
                .series
                .chunks(2)
                .map(|pair| merge_points(pair[0], pair.get(1).copied().unwrap_or(pair[0])))
                .collect();
        }
        self.series.push(p);
    }

    /// CPU efficiency: CPU time over what its CPUs could have given in `elapsed_ms`
    /// (0.0–1.0); `None` when unmeasured or no time passed.
    pub fn cpu_efficiency(&self, elapsed_ms: u64, cpus: u32) -> Option<f64> {
        let budget = elapsed_ms as f64 * f64::from(cpus);
        (budget > 0.0).then_some(self.cpu_time_ms? as f64 / budget)
    }

    /// Memory efficiency: the peak over what was asked for (0.0–1.0, more when the limit
    /// counts page cache the job touched); `None` when unmeasured.
    pub fn memory_efficiency(&self, requested: u64) -> Option<f64> {
        (requested > 0).then_some(self.memory_peak? as f64 / requested as f64)
    }

    /// Mean utilization over all its GPUs, percent; `None` without GPU samples.
    pub fn gpu_util(&self) -> Option<f64> {
        (!self.gpus.is_empty()).then(|| {
            self.gpus.iter().map(|g| f64::from(g.util_avg)).sum::<f64>() / self.gpus.len() as f64
        })
    }
}

fn merge_points(a: UsagePoint, b: UsagePoint) -> UsagePoint {
    let mean = |x: Option<u32>, y: Option<u32>| match (x, y) {
        (Some(x), Some(y)) => Some((x + y).div_ceil(2)),
        (x, y) => x.or(y),
    };
    UsagePoint {
        at_ms: b.at_ms,
        cpu_pct: mean(a.cpu_pct, b.cpu_pct),
        memory: a.memory.max(b.memory),
        gpu_util: mean(a.gpu_util, b.gpu_util),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_series_stays_bounded_and_keeps_its_span() {
        let mut u = JobUsage::default();
        for i in 0..1000u64 {
            u.push_point(UsagePoint {
                at_ms: i * 1000,
                cpu_pct: Some(100),
                memory: Some(i),
                gpu_util: None,
            });
        }
        assert!(u.series.len() <= SERIES_POINTS, "{}", u.series.len());
        assert_eq!(u.series.last().unwrap().at_ms, 999_000);
        assert!(u.series.iter().all(|p| p.cpu_pct == Some(100)));
        // Merged points keep the peak.
        assert!(u.series.windows(2).all(|w| w[0].memory <= w[1].memory));
    }

    #[test]
    fn efficiencies_are_ratios_of_what_was_measured() {
        let u = JobUsage {
            cpu_time_ms: Some(3_000),
            memory_peak: Some(1 << 30),
            ..JobUsage::default()
        };
        assert_eq!(u.cpu_efficiency(3_000, 2), Some(0.5));
        assert_eq!(u.cpu_efficiency(0, 2), None);
        assert_eq!(u.memory_efficiency(4 << 30), Some(0.25));
        assert_eq!(u.gpu_util(), None);
        assert_eq!(JobUsage::default().cpu_efficiency(1_000, 1), None);
    }
}
