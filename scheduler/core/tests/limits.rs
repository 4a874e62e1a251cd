//! QoS and association limits: a job over a limit waits with Slurm's reason and the numbers,
//! other users' jobs start, nothing behind it is held back, and it gets no reservation.

mod common;

use common::*;
use wharf_core::*;

fn gpus(n: u64) -> TresLimit {
    TresLimit {
        gpu: Some(n),
        ..TresLimit::default()
    }
}

fn cpus(n: u64) -> TresLimit {
    TresLimit {
        cpu: Some(n),
        ..TresLimit::default()
    }
}

fn in_qos(mut j: PendingJob, qos: &str) -> PendingJob {
    j.qos = Some(qos.into());
    j
}

fn in_account(mut j: PendingJob, account: &str) -> PendingJob {
    j.assoc.account = account.into();
    j
}

fn with_qos(policy: Policy, name: &str, limits: QosLimits) -> Config {
    let mut c = Config::with_policy(policy);
    c.qos.push(Qos {
        name: name.into(),
        priority: 0,
    });
    c.limits.qos.insert(name.into(), limits);
    c
}

/// Runs one pass; asserts that `held` waits with `code` (no reservation, no estimated start)
/// and that every job in `starts` starts.
fn check(state: &State, config: &Config, held: u64, code: &str, starts: &[u64]) -> String {
    let plan = schedule(MIN, state, config);
    let w = waiting(&plan, held);
    assert_eq!(w.reason.code(), code, "{}", w.reason);
    assert_eq!(w.estimated_start, None);
    assert!(plan.reservations.iter().all(|r| r.job != held));
    let got = started(&plan);
    for s in starts {
        assert!(got.contains(s), "job {s} should start: {plan:?}");
    }
    w.reason.to_string()
}

const POLICIES: [Policy; 3] = [Policy::Fcfs, Policy::Easy, Policy::Multifactor];

#[test]
fn qos_max_gpus_per_user_holds_the_second_job_and_not_the_next_user() {
    for policy in POLICIES {
        let config = with_qos(
            policy,
            "normal",
            QosLimits {
                max_tres_per_user: gpus(4),
                ..QosLimits::default()
            },
        );
        let state = State {
            nodes: vec![node("n1", 32, 256, 8)],
            pending: vec![
                in_qos(job(1, "ann", 1, 3, 60, 0), "normal"),
                in_qos(job(2, "ann", 1, 2, 60, 1), "normal"),
                in_qos(job(3, "bob", 1, 4, 60, 2), "normal"),
                in_qos(job(4, "ann", 1, 1, 60, 3), "normal"),
            ],
            ..State::default()
        };
        let text = check(&state, &config, 2, "QOSMaxGRESPerUser", &[1, 3, 4]);
        assert_eq!(
            text,
            "QOSMaxGRESPerUser: QoS normal allows each user 4 GPUs at once (max_tres_per_user \
             gpu); 3 GPUs are in use and it asks for 2 GPUs; it starts when enough of them end"
        );
        // Once ann's jobs end, job 2 starts.
        let mut later = state.clone();
        later.pending.retain(|j| j.id == 2);
        assert_eq!(started(&schedule(MIN, &later, &config)), vec![2]);
    }
}

#[test]
fn running_jobs_count_toward_the_qos_per_user_cpu_limit() {
    let config = with_qos(
        Policy::Multifactor,
        "normal",
        QosLimits {
            max_tres_per_user: cpus(4),
            ..QosLimits::default()
        },
    );
    let mut r = running(9, "n1", vec![0, 1, 2], vec![], 0, 60);
    r.assoc = Assoc::new("ann", "ann");
    r.qos = Some("normal".into());
    let state = State {
        nodes: vec![node("n1", 32, 256, 0)],
        running: vec![r],
        pending: vec![
            in_qos(job(1, "ann", 2, 0, 60, 0), "normal"),
            in_qos(job(2, "bob", 4, 0, 60, 1), "normal"),
            job(3, "ann", 8, 0, 60, 2), // no QoS: not limited by it
        ],
        ..State::default()
    };
    let text = check(&state, &config, 1, "QOSMaxCpuPerUserLimit", &[2, 3]);
    assert!(text.contains("3 CPUs are in use and it asks for 2 CPUs"), "{text}");
}

#[test]
fn qos_max_jobs_per_user_and_group_limits() {
    let per_user = with_qos(
        Policy::Easy,
        "q",
        QosLimits {
            max_jobs_per_user: Some(1),
            ..QosLimits::default()
        },
    );
    let jobs = || {
        vec![
            in_qos(job(1, "ann", 1, 0, 60, 0), "q"),
            in_qos(job(2, "ann", 1, 0, 60, 1), "q"),
            in_qos(job(3, "bob", 1, 0, 60, 2), "q"),
            job(4, "ann", 1, 0, 60, 3),
        ]
    };
    let state = State {
        nodes: vec![node("n1", 8, 64, 2)],
        pending: jobs(),
        ..State::default()
    };
    check(&state, &per_user, 2, "QOSMaxJobsPerUserLimit", &[1, 3, 4]);

    let grp_jobs = with_qos(
        Policy::Easy,
        "q",
        QosLimits {
            grp_jobs: Some(2),
            ..QosLimits::default()
        },
    );
    let t = check(&state, &grp_jobs, 3, "QOSGrpJobsLimit", &[1, 2, 4]);
    assert!(t.contains("allows 2 running jobs in all"), "{t}");

    let grp_cpu = with_qos(
        Policy::Easy,
        "q",
        QosLimits {
            grp_tres: cpus(2),
            ..QosLimits::default()
        },
    );
    check(&state, &grp_cpu, 3, "QOSGrpCpuLimit", &[1, 2, 4]);

    let grp_gpu = with_qos(
        Policy::Easy,
        "q",
        QosLimits {
            grp_tres: gpus(1),
            ..QosLimits::default()
        },
    );
    let mut gpu_state = state.clone();
    for j in &mut gpu_state.pending {
        j.request.gpus = 1;
    }
    gpu_state.pending[3].request.gpus = 0;
    check(&gpu_state, &grp_gpu, 2, "QOSGrpGRES", &[1, 4]);
}

#[test]
fn qos_max_wall_keeps_a_long_job_pending_as_stuck() {
    let config = with_qos(
        Policy::Multifactor,
        "short",
        QosLimits {
            max_wall: Some(30 * MIN),
            ..QosLimits::default()
        },
    );
    let state = State {
        nodes: vec![node("n1", 8, 64, 0)],
        pending: vec![
            in_qos(job(1, "ann", 1, 0, 60, 0), "short"),
            in_qos(job(2, "ann", 1, 0, 30, 1), "short"),
        ],
        ..State::default()
    };
    let t = check(&state, &config, 1, "QOSMaxWallDurationPerJobLimit", &[2]);
    assert!(t.contains("01:00:00") && t.contains("00:30:00"), "{t}");
    let plan = schedule(MIN, &state, &config);
    assert!(waiting(&plan, 1).reason.is_stuck());
}

/// science > physics, and bio; EASY so that jobs go in submit order.
fn tree() -> Config {
    let mut c = Config::with_policy(Policy::Easy);
    for (name, parent) in [("science", None), ("physics", Some("science")), ("bio", None)] {
        c.accounts.push(Account {
            name: name.into(),
            parent: parent.map(String::from),
            shares: 1,
        });
    }
    c
}

#[test]
fn an_accounts_group_limits_count_every_job_below_it() {
    let mut config = tree();
    config.limits.accounts.insert(
        "science".into(),
        AssocLimits {
            grp_tres: cpus(6),
            ..AssocLimits::default()
        },
    );
    let mut r = running(9, "n1", vec![0, 1, 2, 3], vec![], 0, 60);
    r.assoc = Assoc::new("physics", "carl"); // below science
    let state = State {
        nodes: vec![node("n1", 32, 256, 4)],
        running: vec![r],
        pending: vec![
            in_account(job(1, "ann", 4, 0, 60, 0), "physics"),
            in_account(job(2, "bob", 2, 0, 60, 1), "science"),
            in_account(job(3, "dan", 8, 0, 60, 2), "bio"),
        ],
        ..State::default()
    };
    let t = check(&state, &config, 1, "AssocGrpCpuLimit", &[2, 3]);
    assert!(
        t.contains("account science allows 6 CPUs") && t.contains("4 CPUs are in use"),
        "{t}"
    );

    let mut gpu = tree();
    gpu.limits.accounts.insert(
        "science".into(),
        AssocLimits {
            grp_tres: gpus(2),
            grp_jobs: Some(2),
            ..AssocLimits::default()
        },
    );
    let state = State {
        nodes: vec![node("n1", 32, 256, 4)],
        pending: vec![
            in_account(job(1, "ann", 1, 2, 60, 0), "physics"),
            in_account(job(2, "bob", 1, 1, 60, 1), "science"),
            in_account(job(3, "dan", 1, 2, 60, 2), "bio"),
            in_account(job(4, "bob", 1, 0, 60, 3), "science"),
            in_account(job(5, "bob", 1, 0, 60, 4), "physics"),
        ],
        ..State::default()
    };
    check(&state, &gpu, 2, "AssocGrpGRES", &[1, 3, 4]);
    check(&state, &gpu, 5, "AssocGrpJobsLimit", &[1, 3, 4]);
}

#[test]
fn max_jobs_is_per_user_and_inherited_from_the_account() {
    let mut config = tree();
    config.limits.accounts.insert(
        "physics".into(),
        AssocLimits {
            max_jobs: Some(1),
            ..AssocLimits::default()
        },
    );
    // bob sets his own, higher MaxJobs.
    config.limits.users.insert(
        Assoc::new("physics", "bob"),
        AssocLimits {
            max_jobs: Some(2),
            ..AssocLimits::default()
        },
    );
    let state = State {
        nodes: vec![node("n1", 32, 256, 0)],
        pending: vec![
            in_account(job(1, "ann", 1, 0, 60, 0), "physics"),
            in_account(job(2, "ann", 1, 0, 60, 1), "physics"),
            in_account(job(3, "bob", 1, 0, 60, 2), "physics"),
            in_account(job(4, "bob", 1, 0, 60, 3), "physics"),
            in_account(job(5, "bob", 1, 0, 60, 4), "physics"),
        ],
        ..State::default()
    };
    let t = check(&state, &config, 2, "AssocMaxJobsLimit", &[1, 3, 4]);
    assert!(t.contains("account physics allows each user 1 running jobs"), "{t}");
    let t = check(&state, &config, 5, "AssocMaxJobsLimit", &[1, 3, 4]);
    assert!(t.contains("user bob in account physics"), "{t}");
}

#[test]
fn max_tres_per_job_and_a_user_group_limit() {
    let mut config = tree();
    config.limits.accounts.insert(
        "bio".into(),
        AssocLimits {
            max_tres_per_job: gpus(1),
            ..AssocLimits::default()
        },
    );
    config.limits.users.insert(
        Assoc::new("physics", "ann"),
        AssocLimits {
            grp_tres: cpus(3),
            ..AssocLimits::default()
        },
    );
    let state = State {
        nodes: vec![node("n1", 32, 256, 4)],
        pending: vec![
            in_account(job(1, "dan", 1, 2, 60, 0), "bio"),
            in_account(job(2, "dan", 1, 1, 60, 1), "bio"),
            in_account(job(3, "ann", 2, 0, 60, 2), "physics"),
            in_account(job(4, "ann", 2, 0, 60, 3), "physics"),
            in_account(job(5, "ann", 1, 0, 60, 4), "physics"),
        ],
        ..State::default()
    };
    let t = check(&state, &config, 1, "AssocMaxGRESPerJob", &[2, 3, 5]);
    assert!(t.contains("allows one job 1 GPUs") && t.contains("asks for 2 GPUs"), "{t}");
    let t = check(&state, &config, 4, "AssocGrpCpuLimit", &[2, 3, 5]);
    assert!(t.contains("user ann in account physics"), "{t}");
    // The per-job cap can never be met: admission refuses such a job.
    let never = limits::never_fits(&config, &state.pending[0], 60 * MIN).unwrap();
    assert_eq!(never.code(), "AssocMaxGRESPerJob");
    assert!(limits::never_fits(&config, &state.pending[3], 60 * MIN).is_none());
}

#[test]
fn a_limited_job_ahead_does_not_take_a_reservation_from_the_next() {
    // Job 1 is limit-bound and needs the whole node; job 2 also needs the whole node and is
    // blocked by a running job: job 2, not job 1, gets the EASY reservation.
    let config = with_qos(
        Policy::Easy,
        "q",
        QosLimits {
            max_jobs_per_user: Some(1),
            ..QosLimits::default()
        },
    );
    let mut r = running(9, "n1", vec![0], vec![], 0, 60);
    r.assoc = Assoc::new("ann", "ann");
    r.qos = Some("q".into());
    let state = State {
        nodes: vec![node("n1", 4, 64, 0)],
        running: vec![r],
        pending: vec![
            in_qos(job(1, "ann", 4, 0, 60, 0), "q"),
            job(2, "bob", 4, 0, 60, 1),
            job(3, "cat", 1, 0, 30, 2),
        ],
        ..State::default()
    };
    let plan = schedule(MIN, &state, &config);
    assert_eq!(waiting(&plan, 1).reason.code(), "QOSMaxJobsPerUserLimit");
    assert_eq!(plan.reservations.len(), 1);
    assert_eq!(plan.reservations[0].job, 2);
    assert_eq!(started(&plan), vec![3]);
}

#[test]
fn submit_limits_count_pending_and_running_jobs() {
    let mut config = with_qos(
        Policy::Multifactor,
        "q",
        QosLimits {
            max_submit_jobs_per_user: Some(2),
            ..QosLimits::default()
        },
    );
    config.limits.accounts.insert(
        "lab".into(),
        AssocLimits {
            max_submit_jobs: Some(3),
            ..AssocLimits::default()
        },
    );
    let ann = Assoc::new("lab", "ann");
    let bob = Assoc::new("lab", "bob");
    let two_in_q = [(&ann, Some("q")), (&ann, Some("q")), (&bob, Some("q"))];
    let err = limits::submit_fits(&config, &ann, Some("q"), two_in_q).unwrap_err();
    assert_eq!(err.code(), "QOSMaxSubmitJobPerUserLimit");
    assert!(limits::submit_fits(&config, &bob, Some("q"), two_in_q).is_ok());
    let three = [(&ann, None), (&ann, Some("q")), (&ann, None)];
    let err = limits::submit_fits(&config, &ann, None, three).unwrap_err();
    assert_eq!(err.code(), "AssocMaxSubmitJobLimit");
    assert!(err.to_string().contains("account lab allows each user 3"), "{err}");
}
