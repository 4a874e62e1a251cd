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

/// An exclusive job is charged its whole node, so it is held to the limits on that: one
/// GPU asked for on an 8-GPU node is 8 GPUs against a cap of 4 (before, it started on its
/// request and its user then held twice the cap). A job that shares its node starts.
#[test]
fn an_exclusive_job_is_held_to_the_limits_on_its_whole_nodes() {
    for policy in POLICIES {
        let config = with_qos(
            policy,
            "normal",
            QosLimits {
                max_tres_per_user: gpus(4),
                ..QosLimits::default()
            },
        );
        let mut whole = in_qos(job(1, "ann", 1, 1, 60, 0), "normal");
        whole.select.exclusive = true;
        let state = State {
            nodes: vec![node("n1", 32, 256, 8), node("n2", 32, 256, 8)],
            pending: vec![whole, in_qos(job(2, "ann", 1, 1, 60, 1), "normal")],
            ..State::default()
        };
        let text = check(&state, &config, 1, "QOSMaxGRESPerUser", &[2]);
        assert!(text.contains("it asks for 8 GPUs"), "{text}");
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
    assert!(
        text.contains("3 CPUs are in use and it asks for 2 CPUs"),
        "{text}"
    );
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
    assert!(
        t.contains("account physics allows each user 1 running job"),
        "{t}"
    );
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
    assert!(
        t.contains("allows one job 1 GPU") && t.contains("asks for 2 GPUs"),
        "{t}"
    );
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
    assert!(
        err.to_string().contains("account lab allows each user 3"),
        "{err}"
    );
}

mod property {
    //! No pass ever starts jobs that together take any limited scope over its limit.

    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::common::*;
    use wharf_core::*;

    const USERS: [&str; 3] = ["u0", "u1", "u2"];
    const ACCOUNTS: [&str; 3] = ["top", "mid", "leaf"]; // leaf < mid < top
    const QOS: [&str; 2] = ["q0", "q1"];

    fn cap() -> impl Strategy<Value = Option<u64>> {
        prop_oneof![2 => Just(None), 1 => (0u64..8).prop_map(Some)]
    }

    fn tres() -> impl Strategy<Value = TresLimit> {
        (
            cap(),
            cap(),
            prop_oneof![3 => Just(None), 1 => (1u64..8).prop_map(|g| Some(g * GIB))],
        )
            .prop_map(|(cpu, gpu, mem)| TresLimit { cpu, gpu, mem })
    }

    fn qos_limits() -> impl Strategy<Value = QosLimits> {
        (
            tres(),
            cap(),
            tres(),
            cap(),
            prop_oneof![Just(None), Just(Some(40 * MIN))],
        )
            .prop_map(|(per_user, jobs, grp, grp_jobs, wall)| QosLimits {
                max_tres_per_user: per_user,
                max_jobs_per_user: jobs,
                grp_tres: grp,
                grp_jobs,
                max_wall: wall,
                ..QosLimits::default()
            })
    }

    fn assoc_limits() -> impl Strategy<Value = AssocLimits> {
        (tres(), cap(), cap(), tres()).prop_map(|(grp, grp_jobs, max_jobs, per_job)| AssocLimits {
            grp_tres: grp,
            grp_jobs,
            max_jobs,
            max_tres_per_job: per_job,
            ..AssocLimits::default()
        })
    }

    fn arb_job(id: u64) -> impl Strategy<Value = PendingJob> {
        (
            0usize..3,
            0usize..3,
            0usize..3,
            1u32..6,
            0u32..3,
            1u64..4,
            1u64..90,
        )
            .prop_map(move |(u, a, q, cpus, gpus, gib, minutes)| {
                let mut j = job(id, USERS[u], cpus, gpus, minutes, id);
                j.assoc.account = ACCOUNTS[a].into();
                j.request.memory = gib * GIB;
                j.qos = QOS.get(q).map(|s| s.to_string());
                j
            })
    }

    fn arb_config() -> impl Strategy<Value = Config> {
        (
            prop_oneof![
                Just(Policy::Fcfs),
                Just(Policy::Easy),
                Just(Policy::Multifactor)
            ],
            proptest::collection::vec(proptest::option::of(qos_limits()), 2),
            proptest::collection::vec(proptest::option::of(assoc_limits()), 3),
            proptest::collection::vec(proptest::option::of(assoc_limits()), 3),
        )
            .prop_map(|(policy, qos, accounts, users)| {
                let mut c = Config::with_policy(policy);
                for (i, a) in ACCOUNTS.iter().enumerate() {
                    c.accounts.push(Account {
                        name: a.to_string(),
                        parent: (i > 0).then(|| ACCOUNTS[i - 1].to_string()),
                        shares: 1,
                    });
                }
                for (name, l) in QOS.iter().zip(qos) {
                    c.qos.push(Qos {
                        name: name.to_string(),
                        priority: 1,
                    });
                    if let Some(l) = l {
                        c.limits.qos.insert(name.to_string(), l);
                    }
                }
                for (name, l) in ACCOUNTS.iter().zip(accounts) {
                    if let Some(l) = l {
                        c.limits.accounts.insert(name.to_string(), l);
                    }
                }
                for (i, l) in users.into_iter().enumerate() {
                    if let Some(l) = l {
                        c.limits.users.insert(Assoc::new(ACCOUNTS[i], USERS[i]), l);
                    }
                }
                c
            })
    }

    /// (cpus, gpus, memory) of a running job.
    fn amount(j: &RunningJob) -> [u64; 3] {
        j.allocs.iter().fold([0; 3], |a, x| {
            [
                a[0] + x.cpu_ids.len() as u64,
                a[1] + x.gpu_ids.len() as u64,
                a[2] + x.memory,
            ]
        })
    }

    fn over(l: &TresLimit, a: [u64; 3]) -> bool {
        over_where(l, a, [1; 3])
    }

    /// Over the cap on a TRES that the new jobs add some of (a job asking none of a TRES is
    /// not held back by it, as in Slurm).
    fn over_where(l: &TresLimit, a: [u64; 3], added: [u64; 3]) -> bool {
        [l.cpu, l.gpu, l.mem]
            .iter()
            .zip(a)
            .zip(added)
            .any(|((cap, n), add)| add > 0 && cap.is_some_and(|c| n > c))
    }

    fn below(account: &str, ancestor: &str) -> bool {
        let pos = |n: &str| ACCOUNTS.iter().position(|a| *a == n).unwrap();
        pos(account) >= pos(ancestor)
    }

    /// Every limit holds for `jobs` wherever a job of `new` takes part.
    fn check_limits(config: &Config, jobs: &[RunningJob], new: &[u64]) -> Result<(), String> {
        // Scope -> (jobs, amount, what new jobs add).
        let mut scopes: BTreeMap<String, (u64, [u64; 3], [u64; 3], bool)> = BTreeMap::new();
        for j in jobs {
            let a = amount(j);
            let fresh = new.contains(&j.id);
            let mut keys = vec![format!("user:{}:{}", j.assoc.account, j.assoc.user)];
            if let Some(q) = &j.qos {
                keys.push(format!("qos:{q}"));
                keys.push(format!("qosuser:{q}:{}", j.assoc.user));
            }
            for acct in ACCOUNTS.iter().filter(|acct| below(&j.assoc.account, acct)) {
                keys.push(format!("account:{acct}"));
            }
            for k in keys {
                let e = scopes.entry(k).or_insert((0, [0; 3], [0; 3], false));
                e.0 += 1;
                for (i, n) in a.iter().enumerate() {
                    e.1[i] += n;
                    if fresh {
                        e.2[i] += n;
                    }
                }
                e.3 |= fresh;
            }
            if fresh {
                let max_jobs_src = config
                    .limits
                    .users
                    .get(&j.assoc)
                    .filter(|l| !l.max_tres_per_job.is_empty())
                    .or_else(|| {
                        ACCOUNTS
                            .iter()
                            .rev()
                            .filter(|acct| below(&j.assoc.account, acct))
                            .filter_map(|acct| config.limits.accounts.get(*acct))
                            .find(|l| !l.max_tres_per_job.is_empty())
                    });
                if let Some(l) = max_jobs_src {
                    if over(&l.max_tres_per_job, a) {
                        return Err(format!("job {} over MaxTRESPerJob", j.id));
                    }
                }
                if let Some(q) = j.qos.as_ref().and_then(|q| config.limits.qos.get(q)) {
                    if q.max_wall.is_some_and(|w| j.time_limit > w) {
                        return Err(format!("job {} over MaxWall", j.id));
                    }
                }
            }
        }
        for (key, (n, a, added, fresh)) in &scopes {
            if !fresh {
                continue;
            }
            let parts: Vec<&str> = key.split(':').collect();
            let (tres, jobs): (Vec<&TresLimit>, Vec<Option<u64>>) = match parts[0] {
                "qos" => config
                    .limits
                    .qos
                    .get(parts[1])
                    .map(|l| (vec![&l.grp_tres], vec![l.grp_jobs]))
                    .unwrap_or_default(),
                "qosuser" => config
                    .limits
                    .qos
                    .get(parts[1])
                    .map(|l| (vec![&l.max_tres_per_user], vec![l.max_jobs_per_user]))
                    .unwrap_or_default(),
                "account" => config
                    .limits
                    .accounts
                    .get(parts[1])
                    .map(|l| (vec![&l.grp_tres], vec![l.grp_jobs]))
                    .unwrap_or_default(),
                _ => {
                    let assoc = Assoc::new(parts[1], parts[2]);
                    let own = config.limits.users.get(&assoc);
                    // MaxJobs: the user's own, else the nearest account's up the tree.
                    let max_jobs = own.and_then(|l| l.max_jobs).or_else(|| {
                        ACCOUNTS
                            .iter()
                            .rev()
                            .filter(|acct| below(parts[1], acct))
                            .filter_map(|acct| config.limits.accounts.get(*acct))
                            .find_map(|l| l.max_jobs)
                    });
                    let mut jobs = vec![max_jobs];
                    let mut tres = vec![];
                    if let Some(l) = own {
                        jobs.push(l.grp_jobs);
                        tres.push(&l.grp_tres);
                    }
                    (tres, jobs)
                }
            };
            for t in tres {
                if over_where(t, *a, *added) {
                    return Err(format!("{key} holds {a:?}, over {t:?}"));
                }
            }
            for cap in jobs.into_iter().flatten() {
                if *n > cap {
                    return Err(format!("{key} runs {n} jobs, over {cap}"));
                }
            }
        }
        Ok(())
    }

    fn run(now: Time, state: &mut State, config: &Config) -> Vec<u64> {
        let plan = schedule(now, state, config);
        apply(state, &plan, now);
        started(&plan)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]

        #[test]
        fn no_pass_starts_jobs_that_together_exceed_a_limit(
            config in arb_config(),
            first in proptest::collection::vec(0u64..1, 0..8)
                .prop_flat_map(|v| (0..v.len() as u64).map(arb_job).collect::<Vec<_>>()),
            second in proptest::collection::vec(0u64..1, 0..14)
                .prop_flat_map(|v| (100..100 + v.len() as u64).map(arb_job).collect::<Vec<_>>()),
        ) {
            let mut state = State {
                nodes: vec![node("n1", 12, 32, 4), node("n2", 8, 16, 2)],
                pending: first,
                ..State::default()
            };
            // First, jobs start with no limits at all (they may be over them), then with.
            run(MIN, &mut state, &Config::with_policy(config.policy));
            let before = state.running.len();
            state.pending.extend(second);
            let new = run(2 * MIN, &mut state, &config);
            prop_assert_eq!(state.running.len(), before + new.len());
            if let Err(e) = check_limits(&config, &state.running, &new) {
                return Err(TestCaseError::fail(e));
            }
            // A second pass with the limits starts nothing that breaks them either.
            let more = run(3 * MIN, &mut state, &config);
            if let Err(e) = check_limits(&config, &state.running, &more) {
                return Err(TestCaseError::fail(e));
            }
        }
    }
}

#[test]
fn an_exclusive_job_is_refused_at_submit_only_when_no_whole_nodes_fit_its_limits() {
    let config = with_qos(
        Policy::Multifactor,
        "normal",
        QosLimits {
            max_tres_per_user: cpus(16),
            ..QosLimits::default()
        },
    );
    // Sorted by GPUs first, the GPU-less node is the "smallest", yet over the CPU cap; the
    // GPU node is within it.
    let nodes = vec![node("wide", 64, 256, 0), node("gpu", 8, 256, 8)];
    let mut one = in_qos(job(1, "ann", 1, 0, 60, 0), "normal");
    one.select.exclusive = true;
    assert_eq!(
        select::exclusive_never_fits(&config, &nodes, &one, 60_000),
        None
    );
    // Two nodes: 72 CPUs whichever two, over 16.
    let mut two = one.clone();
    two.request.nodes = 2;
    let reason = select::exclusive_never_fits(&config, &nodes, &two, 60_000).unwrap();
    assert!(reason.to_string().contains("asks for 72 CPUs"), "{reason}");
    // Kept off the GPU node, it is over the cap on the only node it may use.
    let mut wide = one.clone();
    wide.select = Selection {
        exclude: ["gpu".to_string()].into(),
        ..one.select.clone()
    };
    assert!(select::exclusive_never_fits(&config, &nodes, &wide, 60_000).is_some());
    // Not exclusive, it is charged what it asks for.
    let mut shared = two.clone();
    shared.select.exclusive = false;
    assert_eq!(
        select::exclusive_never_fits(&config, &nodes, &shared, 60_000),
        None
    );
}
