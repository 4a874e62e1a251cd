//! The same workload and seed, replayed twice, give identical decisions (times, jobs, nodes and
//! device ids), for every policy the core offers; a different seed gives a different workload.

use wharf_sim::driver::Policy;
use wharf_sim::engine::replay;
use wharf_sim::swf;
use wharf_sim::workload::{from_swf, gpu_synthetic, GpuOptions, SwfOptions};

const TRACE: &str = include_str!("data/lublin_256_head.swf");

fn policies() -> Vec<Policy> {
    vec![Policy::Fcfs, Policy::Easy, Policy::Wharf]
}

#[test]
fn swf_replay_is_deterministic() {
    let trace = swf::parse(TRACE).unwrap();
    for policy in policies() {
        let opt = SwfOptions {
            seed: 7,
            ..SwfOptions::default()
        };
        let a = replay(&from_swf("t", &trace, &opt), policy).unwrap();
        let b = replay(&from_swf("t", &trace, &opt), policy).unwrap();
        assert!(!a.decisions.is_empty());
        assert_eq!(a.decisions, b.decisions, "{policy}");
        assert_eq!(a.outcomes, b.outcomes, "{policy}");
    }
}

#[test]
fn gpu_replay_is_deterministic() {
    let opt = GpuOptions {
        seed: 11,
        jobs: 600,
        ..GpuOptions::default()
    };
    for policy in policies() {
        let a = replay(&gpu_synthetic(&opt), policy).unwrap();
        let b = replay(&gpu_synthetic(&opt), policy).unwrap();
        assert_eq!(a.decisions.len(), 600);
        assert_eq!(a.decisions, b.decisions, "{policy}");
    }
    let other = gpu_synthetic(&GpuOptions {
        seed: 12,
        ..opt.clone()
    });
    assert_ne!(gpu_synthetic(&opt).jobs, other.jobs);
}
