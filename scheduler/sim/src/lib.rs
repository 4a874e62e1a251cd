//! Wharf's scheduling simulator: replays Standard Workload Format traces and synthetic GPU
//! workloads through the real scheduler core on a simulated clock, and measures the outcome.
//!
//! ```
//! use wharf_sim::{driver::Policy, engine, metrics, workload};
//!
//! let w = workload::gpu_synthetic(&workload::GpuOptions { jobs: 50, ..Default::default() });
//! let replay = engine::replay(&w, Policy::Fcfs).unwrap();
//! let m = metrics::compute(&w, &replay.outcomes);
//! assert_eq!(m.jobs, 50);
//! assert!(m.utilization > 0.0 && m.utilization <= 1.0);
//! ```

pub mod config;
pub mod driver;
pub mod engine;
pub mod metrics;
pub mod report;
pub mod rng;
pub mod swf;
pub mod workload;
