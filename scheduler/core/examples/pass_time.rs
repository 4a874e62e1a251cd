//! Times full scheduling passes at the scale: 10,000 nodes x 8 GPUs, 100,000 pending
//! jobs from 50 accounts in 5 overlapping partitions, multifactor policy with backfill.
//! Run with `cargo run --release -p wharf-core --example pass_time`.
//!
//! Pass 1 starts on an empty cluster (placement throughput); pass 2 runs on the cluster that
//! pass 1 filled, with the remaining queue (the backfill case: reservations, and every other
//! job tried around them); pass 3 follows the end of a tenth of the running jobs.

// The example measures the pass, so it reads the clock; the core never does.
#![allow(clippy::disallowed_methods)]

use std::time::Instant;

use wharf_core::*;

const GIB: u64 = 1 << 30;
const MIN: Time = 60_000;

/// A small deterministic generator (no dependency, same numbers every run).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }
}

fn main() {
    let nodes_n = 10_000;
    let jobs_n = 100_000;
    let mut rng = Lcg(42);
    let nodes: Vec<Node> = (0..nodes_n)
        .map(|i| {
            Node::new(
                &format!("n{i:05}"),
                64,
                512 * GIB,
                Node::numbered_gpus(8, "h100"),
            )
        })
        .collect();
    let partitions = (0..5)
        .map(|p| {
            // Each partition covers 40% of the nodes, overlapping its neighbours.
            let names: Vec<String> = (0..nodes_n)
                .filter(|i| (i / 1000 + 10 - p * 2) % 10 < 4)
                .map(|i| format!("n{i:05}"))
                .collect();
            let refs: Vec<&str> = names.iter().map(String::as_str).collect();
            let mut part = Partition::new(&format!("p{p}"), &refs);
            part.priority_tier = if p == 0 { 2 } else { 1 };
            part.billing.gpu = 10.0;
            part
        })
        .collect();
    let config = Config {
        partitions,
        ..Config::default()
    };
    let pending: Vec<PendingJob> = (0..jobs_n as u64)
        .map(|id| {
            let account = rng.next(50);
            let user = rng.next(4);
            let (nodes, gpus) = match rng.next(10) {
                0..=3 => (1, 1),
                4..=5 => (1, 2),
                6 => (1, 4),
                7 => (1, 8),
                8 => (1 + rng.next(4) as u32, 8),
                _ => (1, 0),
            };
            let req = Request {
                nodes,
                cpus: 1 + rng.next(16) as u32,
                memory: (1 + rng.next(64)) * GIB,
                gpus,
                gpu_kind: None,
                whole_memory: false,
            };
            let mut j = PendingJob::new(
                id + 1,
                Assoc::new(&format!("a{account}"), &format!("a{account}u{user}")),
                req,
                rng.next(3600) * 1000,
            );
            j.partition = Some(format!("p{}", rng.next(5)));
            j.time_limit = Some((5 + rng.next(600)) * MIN);
            j
        })
        .collect();
    let mut usage = UsageLedger::new(config.half_life);
    for a in 0..50u64 {
        usage.record(
            &Assoc::new(&format!("a{a}"), &format!("a{a}u0")),
            (a * 1000) as f64,
            0,
        );
    }
    let now = 3600 * 1000;
    let mut state = State {
        nodes,
        running: Vec::new(),
        pending,
        usage: usage.snapshot(now),
        ..State::default()
    };

    let t = Instant::now();
    let plan = schedule(now, &state, &config);
    let first = t.elapsed();
    let starts = plan.starts.len();
    println!(
        "pass 1 (empty cluster): {:.3} s, {} starts ({:.0} starts/s), {} reservations",
        first.as_secs_f64(),
        starts,
        starts as f64 / first.as_secs_f64(),
        plan.reservations.len()
    );
    for s in plan.starts {
        let pos = state.pending.iter().position(|j| j.id == s.job).unwrap();
        let j = state.pending.swap_remove(pos);
        state.running.push(RunningJob {
            id: j.id,
            assoc: j.assoc,
            partition: j.partition,
            qos: j.qos,
            start: now,
            time_limit: s.time_limit,
            allocs: s.allocs,
            port: None,
        });
    }
    let later = now + 10 * MIN;
    let t = Instant::now();
    let plan = schedule(later, &state, &config);
    let second = t.elapsed();
    println!(
        "pass 2 (full cluster, {} running, {} pending): {:.3} s, {} starts, {} reservations",
        state.running.len(),
        state.pending.len(),
        second.as_secs_f64(),
        plan.starts.len(),
        plan.reservations.len()
    );
    // Steady state: a tenth of the running jobs end; the next pass refills what they freed.
    let ended = state.running.len() / 10;
    state.running.drain(..ended);
    let t = Instant::now();
    let plan = schedule(later, &state, &config);
    let third = t.elapsed();
    println!(
        "pass 3 ({} jobs ended): {:.3} s, {} starts ({:.0} starts/s), {} reservations",
        ended,
        third.as_secs_f64(),
        plan.starts.len(),
        plan.starts.len() as f64 / third.as_secs_f64(),
        plan.reservations.len()
    );
    println!(
        "RESULT pass1_s={:.3} pass1_starts_per_s={:.0} pass2_s={:.3} pass3_s={:.3} pass3_starts={}",
        first.as_secs_f64(),
        starts as f64 / first.as_secs_f64(),
        second.as_secs_f64(),
        third.as_secs_f64(),
        plan.starts.len()
    );
}
