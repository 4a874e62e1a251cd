//! Replays through the real core: the policies differ where they must, every plan the core
//! gives is applicable (never over-allocated), and the applying step refuses one that is not.

use wharf_sim::driver::{Driver, Policy};
use wharf_sim::engine::{replay, Placement, Sim, SimError, Start};
use wharf_sim::metrics::compute;
use wharf_sim::swf;
use wharf_sim::workload::{from_swf, gpu_synthetic, GpuOptions, SwfOptions, MS};

/// A 4-processor machine: job 1 holds half of it for 100 s, job 2 needs all of it, job 3 needs
/// half for 10 s and fits before job 1 ends, so backfilling it delays no one.
const BACKFILL: &str = "; MaxProcs: 4
1 0 -1 100 2 -1 -1 2 100 -1 1 1 -1 -1 0 -1 -1 -1
2 1 -1 100 4 -1 -1 4 100 -1 1 2 -1 -1 0 -1 -1 -1
3 2 -1 10 2 -1 -1 2 10 -1 1 3 -1 -1 0 -1 -1 -1
";

fn start_of(policy: Policy, job: u64) -> u64 {
    let w = from_swf("t", &swf::parse(BACKFILL).unwrap(), &SwfOptions::default());
    let r = replay(&w, policy).unwrap();
    r.outcomes.iter().find(|o| o.id == job).unwrap().start / MS
}

#[test]
fn easy_backfills_where_fcfs_blocks() {
    assert_eq!(
        start_of(Policy::Fcfs, 3),
        200,
        "FCFS: job 3 waits behind job 2"
    );
    assert_eq!(start_of(Policy::Easy, 3), 2, "EASY: job 3 backfills");
    assert_eq!(start_of(Policy::Wharf, 3), 2, "Wharf: job 3 backfills");
    for p in [Policy::Fcfs, Policy::Easy, Policy::Wharf] {
        assert_eq!(start_of(p, 2), 100, "{p}: the reserved job is not delayed");
    }
}

#[test]
fn every_policy_finishes_a_gpu_workload_with_multi_node_jobs() {
    let w = gpu_synthetic(&GpuOptions {
        jobs: 400,
        multi_node: 0.2,
        ..GpuOptions::default()
    });
    assert!(w.jobs.iter().any(|j| j.nodes > 1));
    for p in [Policy::Fcfs, Policy::Easy, Policy::Wharf] {
        // `replay` applies every plan through the checks of `Sim::apply_plan`: an
        // over-allocation or a job on too few nodes would stop it with an error.
        let r = replay(&w, p).unwrap();
        assert!(r.never_started.is_empty(), "{p}");
        let m = compute(&w, &r.outcomes);
        assert_eq!(m.jobs, 400);
        assert!(
            m.utilization > 0.0 && m.utilization <= 1.0,
            "{p}: {}",
            m.utilization
        );
        assert!((0.0..=1.0).contains(&m.jain_fairness));
    }
}

#[test]
fn applying_refuses_a_plan_that_over_allocates() {
    let w = gpu_synthetic(&GpuOptions {
        jobs: 2,
        nodes: 1,
        ..GpuOptions::default()
    });
    let mut driver = Driver::new(Policy::Easy, &w).unwrap();
    let mut sim = Sim::new(&w);
    while let Some(t) = sim.next_instant() {
        sim.handle_events(t, &mut driver);
        if sim.pending() == 2 {
            break;
        }
    }
    let now = w.jobs[1].submit;
    let on = |job: &wharf_sim::workload::SimJob, first_gpu: u32| Start {
        job: job.id,
        placements: vec![Placement {
            node: 0,
            cpu_ids: (0..job.per_node.cpus).collect(),
            gpu_ids: (first_gpu..first_gpu + job.per_node.gpus).collect(),
        }],
        time_limit: job.limit,
    };
    // Job 1 takes GPUs from 0; job 2 is told to take the same ones.
    let (a, b) = (&w.jobs[0], &w.jobs[1]);
    sim.apply_plan(&[on(a, 0)], now, &mut driver).unwrap();
    let err = sim.apply_plan(&[on(b, 0)], now, &mut driver).unwrap_err();
    assert!(matches!(err, SimError::BadPlan { .. }), "{err}");
    assert_eq!(sim.pending(), 1, "a refused start changes nothing");
    // A job that is not pending (already started) is refused too.
    let err = sim.apply_plan(&[on(a, 0)], now, &mut driver).unwrap_err();
    assert!(err.to_string().contains("not pending"), "{err}");
    assert_eq!(sim.running(), 1);
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(24))]

    /// Whatever the workload, every plan the core gives under every policy passes the applying
    /// step's checks (no over-allocation, right node count, ids free), every job ends, and no
    /// job starts before it was submitted.
    #[test]
    fn any_gpu_workload_replays_cleanly(
        seed in 0u64..u64::MAX,
        nodes in 1u32..5,
        jobs in 10usize..80,
        multi_node in 0.0f64..0.5,
        load in 0.3f64..1.5,
    ) {
        let w = gpu_synthetic(&GpuOptions {
            seed,
            nodes,
            jobs,
            accounts: 3,
            load,
            multi_node,
        });
        // Jobs wider than the cluster could never start; admission would refuse them.
        let fits = w.jobs.iter().filter(|j| j.nodes <= nodes).count();
        for p in [Policy::Fcfs, Policy::Easy, Policy::Wharf] {
            let r = replay(&w, p).unwrap();
            proptest::prop_assert_eq!(r.outcomes.len(), fits, "{}", p);
            for o in &r.outcomes {
                proptest::prop_assert!(o.submit <= o.start && o.start <= o.end);
            }
            let m = compute(&w, &r.outcomes);
            proptest::prop_assert!(m.utilization <= 1.0 + 1e-9, "{}: {}", p, m.utilization);
        }
    }
}

/// Wharf's policy with age as its only factor and one reservation (none past it) orders jobs
/// by submit time, as EASY does, so the two must make the same decisions: a check that the
/// simulator drives both configurations through the same machinery.
#[test]
fn multifactor_with_age_only_and_one_reservation_is_easy() {
    let trace = swf::parse(include_str!("data/lublin_256_head.swf")).unwrap();
    let w = from_swf("t", &trace, &SwfOptions::default());
    let mut config = wharf_core::Config {
        reservations: 1,
        assoc_reservations: 0,
        ..wharf_core::Config::default()
    };
    config.weights.fairshare = 0;
    config.weights.job_size = 0;
    config.weights.width = 0;
    let knobs = wharf_sim::driver::Knobs {
        config,
        billing: None,
    };
    let easy = replay(&w, Policy::Easy).unwrap();
    let wharf = wharf_sim::engine::replay_with(&w, Policy::Wharf, &knobs).unwrap();
    assert!(easy.decisions.len() > 400);
    assert_eq!(easy.decisions, wharf.decisions);
    // With its default weights, fair share reorders the queue.
    let default = replay(&w, Policy::Wharf).unwrap();
    assert_ne!(easy.decisions, default.decisions);
}

#[test]
fn a_job_that_could_never_run_is_refused_at_submit_as_the_controller_refuses_it() {
    let mut w = from_swf("t", &swf::parse(BACKFILL).unwrap(), &SwfOptions::default());
    let nodes = w.nodes.len();
    w.jobs[1].nodes = nodes as u32 + 1;
    let r = replay(&w, Policy::Wharf).unwrap();
    assert_eq!(r.refused.len(), 1, "{:?}", r.refused);
    let (job, reason) = &r.refused[0];
    assert_eq!(*job, w.jobs[1].id);
    // The controller's words (wharf_core::cycle::admit).
    assert!(
        reason.contains(&format!("ask for at most {nodes}")),
        "{reason}"
    );
    assert!(r.never_started.is_empty());
    assert_eq!(r.outcomes.len(), 2, "the others run");
}
