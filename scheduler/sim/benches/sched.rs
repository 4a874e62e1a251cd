//! `cargo bench -p wharf-sim --bench sched`: the scheduler core at scale.
//!
//! 10,000 nodes × 8 GPUs and a backlog of 100,000 pending jobs (arrays of identical tasks, 50
//! accounts), all submitted before the first pass, scheduled by Wharf's configured policy
//! (backfill on) through the simulator's driver and plan-applying step, as in a replay:
//! - **full pass**: the first pass over the whole backlog on an empty cluster;
//! - **sustained starts/s**: then jobs end on the simulated clock and passes run at most once a
//!   simulated second (many events wake one pass, as in the controller); starts per second of
//!   pass time (build view + core + apply) over those passes;
//! - **decision p50/p99**: the wall time of those passes, i.e. how long an event waits for the
//!   decisions it triggers.
//!
//! Printed next to Slurm's documented sustained rate of 500 jobs/s. Environment:
//! `WHARF_SCHED_SCALE` (default 1.0) scales nodes and jobs; `WHARF_SCHED_SECONDS` (default 60)
//! bounds the sustained phase's wall time; `WHARF_SCHED_PASSES` (default 2,000) its passes;
//! `WHARF_SCHED_INTERVAL_MS` (default 1,000) the least simulated time between passes.

use std::time::{Duration, Instant};

use wharf_sim::driver::{Driver, Policy};
use wharf_sim::engine::Sim;
use wharf_sim::workload::{array_backlog, BacklogOptions, MS};

const SLURM_STARTS_PER_S: f64 = 500.0;

fn env<T: std::str::FromStr>(name: &str, default: T) -> T {
    match std::env::var(name) {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v:?} is not a valid number")),
        Err(_) => default,
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

fn main() {
    let scale: f64 = env("WHARF_SCHED_SCALE", 1.0);
    let budget = Duration::from_secs_f64(env("WHARF_SCHED_SECONDS", 60.0));
    let max_passes: usize = env("WHARF_SCHED_PASSES", 2_000);
    // Passes run at most once per this much simulated time.
    let interval: u64 = env("WHARF_SCHED_INTERVAL_MS", MS);
    let nodes = ((10_000.0 * scale) as u32).max(1);
    let jobs = ((100_000.0 * scale) as usize).max(1);
    let t = Instant::now();
    let w = array_backlog(&BacklogOptions {
        seed: 1,
        nodes,
        jobs,
        accounts: 50,
    });
    println!("workload: {} (built in {:.2?})", w.name, t.elapsed());
    let (policy, mut driver) = [Policy::Wharf, Policy::Easy, Policy::Fcfs]
        .into_iter()
        .find_map(|p| Driver::new(p, &w).ok().map(|d| (p, d)))
        .expect("the core offers no policy at all");
    println!("policy: {policy}");

    let mut sim = Sim::new(&w);
    let last_submit = w.jobs.iter().map(|j| j.submit).max().unwrap_or(0);
    while let Some(now) = sim.next_instant().filter(|t| *t <= last_submit) {
        sim.handle_events(now, &mut driver);
    }
    let now = last_submit;
    let t = Instant::now();
    let starts = driver.pass(now).expect("first pass");
    sim.apply_plan(&starts, now, &mut driver)
        .expect("first plan");
    let full_pass = t.elapsed();
    println!(
        "full pass: {:.1} ms over {} pending jobs, {} starts",
        full_pass.as_secs_f64() * 1e3,
        jobs,
        starts.len()
    );

    let core_before = driver.core_time();
    let mut pass_times = Vec::new();
    let mut started = 0usize;
    let mut next_pass = now + interval;
    let phase = Instant::now();
    // A pass is owed once events arrived since the last one; it runs at the first event at or
    // after `next_pass`, or at `next_pass` itself when the clock would otherwise skip past it.
    let mut owed = false;
    loop {
        if phase.elapsed() > budget || pass_times.len() >= max_passes {
            break;
        }
        let t_ev = sim.next_instant();
        let at = match t_ev {
            _ if owed && t_ev.is_none_or(|t| t > next_pass) => next_pass,
            Some(t) => {
                sim.handle_events(t, &mut driver);
                owed = true;
                if t < next_pass {
                    continue;
                }
                t
            }
            None => break,
        };
        owed = false;
        next_pass = at + interval;
        if sim.pending() == 0 {
            continue;
        }
        let t = Instant::now();
        let starts = driver.pass(at).expect("pass");
        sim.apply_plan(&starts, at, &mut driver).expect("plan");
        pass_times.push(t.elapsed());
        started += starts.len();
    }
    let busy: Duration = pass_times.iter().sum();
    let rate = if busy.is_zero() {
        0.0
    } else {
        started as f64 / busy.as_secs_f64()
    };
    pass_times.sort();
    println!(
        "sustained: {} passes, {} starts in {:.2} s of pass time, {} pending, {} running",
        pass_times.len(),
        started,
        busy.as_secs_f64(),
        sim.pending(),
        sim.running()
    );
    println!(
        "decision latency (pass wall time): p50 {:.2} ms, p99 {:.2} ms",
        percentile(&pass_times, 0.5).as_secs_f64() * 1e3,
        percentile(&pass_times, 0.99).as_secs_f64() * 1e3
    );
    println!(
        "of which in the core's pass (wharf_core::Live::pass): {:.2} s ({:.0} %); the rest is \
         the simulator's state upkeep and plan applying",
        (driver.core_time() - core_before).as_secs_f64(),
        100.0 * (driver.core_time() - core_before).as_secs_f64() / busy.as_secs_f64().max(1e-9)
    );
    println!(
        "starts/s: wharf {rate:.0}, Slurm (documented) {SLURM_STARTS_PER_S:.0}; full pass {:.1} ms",
        full_pass.as_secs_f64() * 1e3
    );
    println!(
        "RESULT sched starts_per_s={rate:.0} slurm_starts_per_s={SLURM_STARTS_PER_S:.0} ratio={:.2}",
        rate / SLURM_STARTS_PER_S
    );
}
