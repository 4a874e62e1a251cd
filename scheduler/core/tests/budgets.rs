//! Account budgets (GrpTRESMins): ended runs' usage in the period, running jobs' whole time
//! limits and the job to start must fit; a job over waits with Slurm's reason and the numbers.

mod common;

use common::*;
use wharf_core::*;

/// science > physics, and bio; EASY so that jobs go in submit order.
fn tree() -> Config {
    let mut c = Config::with_policy(Policy::Easy);
    for (name, parent) in [
        ("science", None),
        ("physics", Some("science")),
        ("bio", None),
    ] {
        c.accounts.push(Account {
            name: name.into(),
            parent: parent.map(String::from),
            shares: 1,
        });
    }
    c
}

fn budget(config: &mut Config, account: &str, mins: TresMins) {
    config.limits.accounts.insert(
        account.into(),
        AssocLimits {
            grp_tres_mins: mins,
            ..AssocLimits::default()
        },
    );
}

fn gpu_mins(n: u64) -> TresMins {
    TresMins {
        gpu: Some(n),
        ..TresMins::default()
    }
}

fn in_account(mut j: PendingJob, account: &str) -> PendingJob {
    j.assoc.account = account.into();
    j
}

fn used(account: &str, user: &str, m: TresMinutes) -> BudgetUsage {
    BudgetUsage {
        since: 0,
        // 2026-12-01 00:00 UTC
        resets: Some(1_796_083_200_000),
        used: [(Assoc::new(account, user), m)].into_iter().collect(),
    }
}

fn gpus_used(n: f64) -> TresMinutes {
    TresMinutes {
        gpu: n,
        ..TresMinutes::default()
    }
}

#[test]
fn a_budget_counts_ended_runs_running_limits_and_sub_accounts_and_holds_the_job_over_it() {
    let mut config = tree();
    budget(&mut config, "science", gpu_mins(600));
    // carl's ended runs in physics (below science) used 300 GPU-minutes this period; dan's
    // running job may use 1 GPU for 120 minutes: 420 of 600 are spoken for.
    let mut r = running(9, "n1", vec![0], vec![0], 0, 120);
    r.assoc = Assoc::new("physics", "dan");
    let state = State {
        nodes: vec![node("n1", 32, 256, 16)],
        running: vec![r],
        pending: vec![
            in_account(job(1, "ann", 1, 2, 60, 0), "science"), // 120: 540
            in_account(job(2, "bob", 1, 1, 60, 1), "physics"), // 60: exactly 600
            in_account(job(3, "eve", 1, 1, 1, 2), "physics"),  // 1 more: over
            in_account(job(4, "dan", 1, 4, 600, 3), "bio"),    // not budgeted
        ],
        budget: used("physics", "carl", gpus_used(300.0)),
        ..State::default()
    };
    let plan = schedule(MIN, &state, &config);
    let got = started(&plan);
    for s in [1, 2, 4] {
        assert!(got.contains(&s), "job {s} should start: {plan:?}");
    }
    let w = waiting(&plan, 3);
    assert_eq!(w.reason.code(), "AssocGrpGRESMinutes");
    assert!(!w.reason.is_stuck());
    assert_eq!(w.estimated_start, None);
    assert!(plan.reservations.iter().all(|r| r.job != 3));
    let t = w.reason.to_string();
    for want in [
        "account science has a budget of 600 GPU-minutes (grp_tres_mins gpu)",
        "until it resets at 2026-12-01 00:00 UTC",
        "600 are used or held",
        "would use 1;",
    ] {
        assert!(t.contains(want), "{want:?} in {t}");
    }

    // Without carl's usage (a new period), all of them start.
    let mut fresh = state.clone();
    fresh.budget.used.clear();
    let plan = schedule(MIN, &fresh, &config);
    assert_eq!(started(&plan), vec![1, 2, 3, 4]);

    // Without the budget, nothing is held.
    let plan = schedule(MIN, &state, &tree());
    assert_eq!(started(&plan), vec![1, 2, 3, 4]);
}

#[test]
fn a_running_job_counts_its_whole_time_limit_from_the_period_start() {
    let mut config = tree();
    budget(&mut config, "bio", gpu_mins(600));
    // 4 GPUs for 150 minutes: 600 GPU-minutes, the whole budget, although it has used 40 so
    // far.
    let mut r = running(9, "n1", vec![0], vec![0, 1, 2, 3], 0, 150);
    r.assoc = Assoc::new("bio", "ann");
    let mut state = State {
        nodes: vec![node("n1", 32, 256, 8)],
        running: vec![r],
        pending: vec![in_account(job(1, "bob", 1, 1, 1, 0), "bio")],
        ..State::default()
    };
    let now = 10 * MIN;
    let plan = schedule(now, &state, &config);
    assert_eq!(waiting(&plan, 1).reason.code(), "AssocGrpGRESMinutes");

    // The period started 60 minutes into the job: only its last 90 minutes (360 GPU-minutes)
    // fall in it, so a 1-GPU job of up to 240 minutes fits and one of 241 does not.
    state.budget.since = 60 * MIN;
    let now = 70 * MIN;
    state.pending[0].time_limit = Some(240 * MIN);
    assert_eq!(started(&schedule(now, &state, &config)), vec![1]);
    state.pending[0].time_limit = Some(241 * MIN);
    let plan = schedule(now, &state, &config);
    let t = waiting(&plan, 1).reason.to_string();
    assert!(
        t.contains("360 are used or held") && t.contains("would use 241"),
        "{t}"
    );
    // The running job may end early and give some back.
    assert!(t.contains("or sooner if running jobs end early"), "{t}");
    assert!(t.contains("and it never resets"), "{t}");
}

#[test]
fn a_job_over_the_whole_budget_on_its_own_could_never_run() {
    let mut config = tree();
    budget(&mut config, "science", gpu_mins(600));
    // 1 GPU for 11 hours, charged to physics (below science).
    let j = in_account(job(1, "ann", 1, 1, 660, 0), "physics");
    let reason = limits::never_fits(&config, &j, 660 * MIN).expect("over the whole budget");
    assert_eq!(reason.code(), "AssocGrpGRESMinutes");
    assert!(reason.is_stuck());
    let t = reason.to_string();
    assert!(
        t.contains("would use 660 on its own, more than the whole budget"),
        "{t}"
    );
    // 10 hours fits an empty budget.
    assert_eq!(limits::never_fits(&config, &j, 600 * MIN), None);
}

#[test]
fn user_budgets_and_cpu_and_billing_budgets_have_their_own_reasons() {
    let mut config = tree();
    let mut p = Partition::new("gpu", &[]);
    p.billing = Billing {
        cpu: 1.0,
        memory_gib: 0.0,
        gpu: 10.0,
    };
    config.partitions.push(p);
    config.limits.users.insert(
        Assoc::new("physics", "ann"),
        AssocLimits {
            grp_tres_mins: TresMins {
                cpu: Some(100),
                billing: Some(1000),
                ..TresMins::default()
            },
            ..AssocLimits::default()
        },
    );
    let state = |cpus: u32, gpus: u32, used_billing: f64| State {
        nodes: vec![node("n1", 32, 256, 8)],
        pending: vec![
            in_account(job(1, "ann", cpus, gpus, 60, 0), "physics"),
            // bob in the same account has no budget of his own.
            in_account(job(2, "bob", cpus, gpus, 60, 1), "physics"),
        ],
        budget: used(
            "physics",
            "ann",
            TresMinutes {
                billing: used_billing,
                ..TresMinutes::default()
            },
        ),
        ..State::default()
    };
    // 2 CPUs for 60 minutes: 120 CPU-minutes of 100.
    let plan = schedule(MIN, &state(2, 0, 0.0), &config);
    let w = waiting(&plan, 1);
    assert_eq!(w.reason.code(), "AssocGrpCPUMinutes");
    assert!(w.reason.is_stuck());
    assert!(
        w.reason
            .to_string()
            .contains("user ann in account physics has a budget of 100 CPU-minutes"),
        "{}",
        w.reason
    );
    assert_eq!(started(&plan), vec![2]);
    // 1 CPU and 1 GPU for 60 minutes bill 660; with 400 used that is over 1000.
    let plan = schedule(MIN, &state(1, 1, 400.0), &config);
    let w = waiting(&plan, 1);
    assert_eq!(w.reason.code(), "AssocGrpBillingMinutes");
    assert!(!w.reason.is_stuck());
    assert!(
        w.reason.to_string().contains("billing-minutes"),
        "{}",
        w.reason
    );
    assert_eq!(started(&plan), vec![2]);
    assert_eq!(
        started(&schedule(MIN, &state(1, 1, 340.0), &config)),
        vec![1, 2]
    );
}
