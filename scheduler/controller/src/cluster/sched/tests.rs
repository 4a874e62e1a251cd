use std::collections::BTreeSet;

use wharf_api::node::GpuInfo;
use wharf_api::pending::{LimitReason, PendingReason, TresKind};
use wharf_api::wire::{ErrorKind, SubmitRequest};
use wharf_api::{JobDefaults, JobId, JobRecord, JobRequest, JobState, NodeInfo, Owner};

use crate::cluster::{Caller, Cluster};
use crate::store::Store;
use wharf_core::Assoc;

pub(crate) fn caller(uid: u32, user: &str) -> Caller {
    Caller {
        owner: Owner {
            uid,
            gid: uid,
            user: user.into(),
        },
        admin: false,
    }
}

/// A cluster with one node whose agent reported GPUs 0, 1 and 3.
pub(crate) fn cluster(dir: &tempfile::TempDir) -> Cluster {
    cluster_with(dir, wharf_core::Config::default())
}

/// [`cluster`], scheduling with `config`, loaded as the controller loads it.
pub(crate) fn cluster_with(dir: &tempfile::TempDir, config: wharf_core::Config) -> Cluster {
    let store = Store::open(&dir.path().join("wharf.db")).unwrap();
    let mut c =
        Cluster::load_with_scheduler(store, JobDefaults::default(), 60_000, 0, config).unwrap();
    let gpus = [0, 1, 3]
        .into_iter()
        .map(|index| GpuInfo {
            model: Some("NVIDIA H100 80GB HBM3".into()),
            ..GpuInfo::minor(index)
        })
        .collect();
    c.register(NodeInfo::new("n1", "127.0.0.1", 8, 16 << 30, gpus), 0)
        .unwrap();
    c
}

fn submit(c: &mut Cluster, who: &Caller, gpus: u32, now: u64) -> JobId {
    let job = JobRequest {
        gpus: Some(gpus),
        ..Default::default()
    };
    submit_job(c, who, job, now).unwrap()
}

pub(crate) fn submit_job(
    c: &mut Cluster,
    who: &Caller,
    mut job: JobRequest,
    now: u64,
) -> Result<JobId, crate::cluster::Failure> {
    job.command = Some(vec!["/bin/true".into()]);
    job.image = Some("host".into());
    let req = SubmitRequest {
        job,
        cwd: "/tmp".into(),
        client_token: None,
        registry_auth: None,
    };
    c.submit(who, &req, now)
}

pub(crate) fn record(c: &Cluster, id: JobId) -> JobRecord {
    c.jobs[&id].clone()
}

/// A configuration whose one QoS, `normal`, is the default, with `limits`.
fn normal_qos(limits: wharf_core::QosLimits) -> wharf_core::Config {
    let mut config = wharf_core::Config::default();
    config.qos.push(wharf_core::Qos {
        name: "normal".into(),
        priority: 0,
    });
    config.limits.qos.insert("normal".into(), limits);
    config.limits.default_qos = Some("normal".into());
    config
}

/// Account `lab` (1 share) with `users` in it (1 share each).
fn in_lab(config: &mut wharf_core::Config, users: &[&str]) {
    config.accounts.push(wharf_core::Account {
        name: "lab".into(),
        parent: None,
        shares: 1,
    });
    for user in users {
        config.users.push(wharf_core::UserShares {
            user: user.to_string(),
            account: "lab".into(),
            shares: 1,
        });
    }
}

/// Account `lab` grants exactly the QoS `list`.
fn grant(c: &mut Cluster, list: &[&str]) {
    c.sched.limits.accounts.insert(
        "lab".into(),
        wharf_core::limits::AssocLimits {
            qos: Some(list.iter().map(|q| q.to_string()).collect()),
            ..Default::default()
        },
    );
}

#[test]
fn gpus_are_the_ids_the_agent_reported_and_waiting_jobs_carry_the_sentence() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = cluster(&dir);
    let ann = caller(1000, "ann");
    let first = submit(&mut c, &ann, 2, 10);
    let second = submit(&mut c, &ann, 1, 20);
    let third = submit(&mut c, &ann, 2, 30);
    let woken = c.schedule(1_000).unwrap();
    assert_eq!(woken, BTreeSet::from(["n1".to_string()]));
    assert_eq!(record(&c, first).allocs[0].gpu_ids, vec![0, 1]);
    assert_eq!(record(&c, second).allocs[0].gpu_ids, vec![3], "never GPU 2");
    let waiting = record(&c, third);
    assert_eq!(waiting.state, JobState::Pending);
    let reason = waiting.reason.unwrap();
    assert!(
        reason.starts_with("Resources: ") && reason.contains("expected to start in about"),
        "{reason}"
    );
    // The same reason as a value, for clients that match on it.
    assert_eq!(waiting.pending_reason, Some(PendingReason::Resources));
    // Started at 1 s with the default 1 h limit: the node is expected free at 3,601 s.
    assert_eq!(waiting.expected_start, Some(3_601_000));
    let p = waiting.priority.unwrap();
    assert_eq!(p.fairshare, 10_000, "no usage yet: fair share factor 1");
    // The total is the rounded sum; each factor shown is rounded on its own.
    let shown = p.age + p.fairshare + p.job_size + p.width + p.partition + p.qos;
    assert!(p.total.abs_diff(shown) <= 1, "{p:?}");
    assert_eq!(record(&c, first).priority, None, "started jobs carry none");
    assert_eq!(
        record(&c, first).pending_reason,
        None,
        "nor a pending reason"
    );
    // Cancelled while pending, it keeps no plan: no priority, no expected start (before,
    // `wharf show` of the ended job printed the last pass's).
    c.cancel(&ann, third, 2_000).unwrap();
    let ended = c.store.job(third).unwrap().unwrap();
    assert_eq!(ended.state, JobState::Cancelled);
    assert_eq!((ended.priority, ended.expected_start), (None, None));
}

/// `who` starts a job on the node's three GPUs, and is charged as if an earlier job of
/// theirs had used the whole node for an hour.
fn holds_the_node_after_an_hour_on_it(c: &mut Cluster, who: &Caller) {
    let hog = submit(c, who, 3, 10);
    c.schedule(1_000).unwrap();
    let mut ended = record(c, hog);
    ended.start_time = Some(0);
    ended.end_time = Some(3_600_000);
    c.charge(&ended);
}

#[test]
fn the_fair_share_tree_shows_a_user_its_own_lines_and_an_admin_everyone() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = cluster(&dir);
    let (ann, bob) = (caller(1000, "ann"), caller(1001, "bob"));
    holds_the_node_after_an_hour_on_it(&mut c, &ann);
    submit(&mut c, &ann, 3, 2_000);
    submit(&mut c, &bob, 3, 3_000);
    let lines = |tree: wharf_api::share::ShareTree| -> Vec<(u32, String, Option<String>)> {
        tree.rows
            .into_iter()
            .map(|r| (r.depth, r.account, r.user))
            .collect()
    };
    let line = |depth, account: &str, user: Option<&str>| {
        (depth, account.to_string(), user.map(str::to_string))
    };
    // Each user is its own account until accounts are configured.
    assert_eq!(
        lines(c.fair_share(&ann, false, 4_000).unwrap()),
        vec![line(0, "ann", None), line(1, "ann", Some("ann"))]
    );
    let err = c.fair_share(&bob, true, 4_000).unwrap_err();
    assert_eq!(err.kind, ErrorKind::PermissionDenied);
    assert!(err.message.contains("only admins"), "{}", err.message);
    let root = Caller {
        admin: true,
        ..caller(0, "root")
    };
    assert_eq!(
        lines(c.fair_share(&root, false, 4_000).unwrap()),
        vec![line(0, "ann", None), line(0, "bob", None)]
    );
    let all = c.fair_share(&root, true, 4_000).unwrap();
    assert_eq!(all.half_life_ms, wharf_core::Config::default().half_life);
    let ann_line = all.rows.iter().find(|r| r.user.as_deref() == Some("ann"));
    let bob_line = all.rows.iter().find(|r| r.user.as_deref() == Some("bob"));
    let (ann_line, bob_line) = (ann_line.unwrap(), bob_line.unwrap());
    // ann's hour on the node counts against her: bob, who used nothing, ranks first.
    assert!(ann_line.usage > 0.0 && bob_line.usage == 0.0, "{all:?}");
    assert!(
        bob_line.factor.unwrap() > ann_line.factor.unwrap(),
        "{all:?}"
    );
}

#[test]
fn partitions_count_their_nodes_and_jobs() {
    let dir = tempfile::tempdir().unwrap();
    // n9 never registered: it takes no work.
    let mut quick = wharf_core::Partition::new("quick", &["n1", "n9"]);
    quick.max_time = Some(600_000);
    quick.state = wharf_core::PartitionState::Drain;
    quick.priority_tier = 2;
    let config = wharf_core::Config {
        partitions: vec![wharf_core::Partition::new("batch", &[]), quick],
        ..Default::default()
    };
    let mut c = cluster_with(&dir, config);
    let ann = caller(1000, "ann");
    let first = submit(&mut c, &ann, 3, 1_000);
    submit(&mut c, &ann, 3, 2_000);
    c.schedule(3_000).unwrap();
    assert!(record(&c, first).state.holds_resources());
    let list = c.partitions().partitions;
    let shown: Vec<_> = list
        .iter()
        .map(|p| {
            (
                p.name.as_str(),
                p.state.as_str(),
                p.default,
                p.tier,
                p.max_time_s,
                (
                    p.nodes.allocated,
                    p.nodes.mixed,
                    p.nodes.idle,
                    p.nodes.other,
                ),
                p.cpus,
                p.gpus,
                (p.running, p.pending),
            )
        })
        .collect();
    // The first partition is the default: both jobs are batch's, one on n1 (1 of 8 CPUs,
    // every GPU), one waiting for its GPUs.
    assert_eq!(
        shown,
        vec![
            (
                "batch",
                "UP",
                true,
                0,
                None,
                (0, 1, 0, 0),
                (1, 8),
                (3, 3),
                (1, 1)
            ),
            (
                "quick",
                "DRAIN",
                false,
                2,
                Some(600),
                (0, 1, 0, 1),
                (1, 8),
                (3, 3),
                (0, 0)
            ),
        ]
    );
    // Drained while its job runs, n1 still counts as in use, its CPUs and GPUs with it (as
    // sinfo counts a draining node); a drained node running nothing is other, its CPUs still
    // in the total. Before, a drained node counted as other with no CPUs at all.
    c.drain("n1", "maintenance", 4_000).unwrap();
    c.register(NodeInfo::new("n2", "127.0.0.2", 4, 8 << 30, vec![]), 4_000)
        .unwrap();
    c.drain("n2", "bad disk", 4_000).unwrap();
    let counts: Vec<_> = (c.partitions().partitions.iter())
        .map(|p| {
            let n = p.nodes;
            ((n.allocated, n.mixed, n.idle, n.other), p.cpus, p.gpus)
        })
        .collect();
    assert_eq!(
        counts,
        [
            ((0, 1, 0, 1), (1, 12), (3, 3)),
            ((0, 1, 0, 1), (1, 8), (3, 3))
        ]
    );
}

#[test]
fn ended_jobs_count_against_their_user_for_fair_share() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = cluster(&dir);
    let (ann, bob) = (caller(1000, "ann"), caller(1001, "bob"));
    holds_the_node_after_an_hour_on_it(&mut c, &ann);
    let ann_next = submit(&mut c, &ann, 3, 2_000);
    let bob_next = submit(&mut c, &bob, 3, 3_000);
    c.schedule(4_000).unwrap();
    let ann_reason = record(&c, ann_next).reason.unwrap();
    let bob_reason = record(&c, bob_next).reason.unwrap();
    // Both wait for the node; bob, who used nothing, is planned first.
    assert!(bob_reason.ends_with("about 01:00:00"), "{bob_reason}");
    assert!(ann_reason.ends_with("about 02:00:00"), "{ann_reason}");
}

#[test]
fn fair_share_usage_survives_a_controller_restart() {
    let dir = tempfile::tempdir().unwrap();
    let (ann, bob) = (caller(1000, "ann"), caller(1001, "bob"));
    {
        let mut c = cluster(&dir);
        let hog = submit(&mut c, &ann, 3, 10);
        c.schedule(1_000).unwrap();
        let mut ended = record(&c, hog);
        ended.state = JobState::Completed;
        ended.start_time = Some(1_000);
        ended.end_time = Some(3_601_000);
        c.commit(vec![ended]).unwrap();
    }
    // A new controller on the same store: ann's hour on the whole node still counts.
    let store = Store::open(&dir.path().join("wharf.db")).unwrap();
    let mut c = Cluster::load(store, JobDefaults::default(), 60_000, 3_700_000).unwrap();
    let ann_next = submit(&mut c, &ann, 3, 3_700_000);
    let bob_next = submit(&mut c, &bob, 3, 3_700_001);
    c.schedule(3_700_002).unwrap();
    assert_eq!(record(&c, bob_next).state, JobState::Starting);
    assert_eq!(record(&c, ann_next).state, JobState::Pending);
}

#[test]
fn jobs_run_in_their_partition_and_impossible_ones_are_refused_at_submit() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = wharf_core::Config::default();
    let mut short = wharf_core::Partition::new("short", &["n1"]);
    short.max_time = Some(3_600_000);
    config.partitions = vec![short, wharf_core::Partition::new("big", &["n2"])];
    config.default_partition = Some("big".into());
    let mut c = cluster_with(&dir, config);
    let mut n2 = c.nodes["n1"].info.clone();
    n2.name = "n2".into();
    c.register(n2, 0).unwrap();
    let ann = caller(1000, "ann");
    let named = |p: &str, time: Option<u64>| JobRequest {
        partition: Some(p.into()),
        time,
        ..Default::default()
    };

    let err = submit_job(&mut c, &ann, named("nope", None), 1).unwrap_err();
    assert_eq!(err.kind, ErrorKind::InvalidInput);
    assert!(
        err.message
            .contains("unknown partition \"nope\"; this cluster has: short, big"),
        "{}",
        err.message
    );
    let err = submit_job(&mut c, &ann, named("short", Some(7200)), 2).unwrap_err();
    assert!(
        err.message.contains("over partition short's maximum"),
        "{}",
        err.message
    );
    let in_short = submit_job(&mut c, &ann, named("short", Some(600)), 3).unwrap();
    let in_default = submit_job(&mut c, &ann, JobRequest::default(), 4).unwrap();
    // The default is fixed at submit: a job queued before the default moved stays where it
    // was checked.
    c.sched.default_partition = Some("short".into());
    c.schedule(1_000).unwrap();
    assert_eq!(record(&c, in_short).first_node(), Some("n1"));
    let rec = record(&c, in_default);
    assert_eq!(rec.first_node(), Some("n2"));
    assert_eq!(rec.spec.unwrap().partition.as_deref(), Some("big"));
}

#[test]
fn jobs_are_charged_to_the_account_they_name_or_their_default_one() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = wharf_core::Config::default();
    for name in ["physics", "bio"] {
        config.accounts.push(wharf_core::Account {
            name: name.into(),
            parent: None,
            shares: 1,
        });
    }
    for account in ["bio", "physics"] {
        config.users.push(wharf_core::UserShares {
            user: "ann".into(),
            account: account.into(),
            shares: 1,
        });
    }
    let mut c = cluster_with(&dir, config);
    let (ann, bob) = (caller(1000, "ann"), caller(1001, "bob"));
    let account = |a: &str| JobRequest {
        account: Some(a.into()),
        ..Default::default()
    };
    let plain = submit_job(&mut c, &ann, JobRequest::default(), 1).unwrap();
    let named = submit_job(&mut c, &ann, account("physics"), 2).unwrap();
    assert_eq!(c.assoc(&record(&c, plain)), Assoc::new("bio", "ann"));
    assert_eq!(c.assoc(&record(&c, named)), Assoc::new("physics", "ann"));
    // The default account is named in the job at submit: ann's new default does not move
    // a job queued before it to an account it was never checked against.
    c.sched.users.reverse();
    assert_eq!(c.assoc(&record(&c, plain)), Assoc::new("bio", "ann"));
    let spec = record(&c, plain).spec.unwrap();
    assert_eq!(spec.account.as_deref(), Some("bio"));
    c.sched.users.reverse();
    // With accounts configured, a user in none may not submit, naming an account or not.
    for job in [JobRequest::default(), account("physics")] {
        let err = submit_job(&mut c, &bob, job, 3).unwrap_err();
        assert!(
            err.message
                .contains("user bob is in no account of this cluster"),
            "{}",
            err.message
        );
    }
    let err = submit_job(&mut c, &ann, account("chem"), 5).unwrap_err();
    assert!(
        err.message.contains("yours: bio, physics"),
        "{}",
        err.message
    );
}

#[test]
fn qos_and_nice_shape_the_priority_and_are_checked_at_submit() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = wharf_core::Config::default();
    config.qos.push(wharf_core::Qos {
        name: "high".into(),
        priority: 10,
    });
    let mut c = cluster_with(&dir, config);
    let ann = caller(1000, "ann");
    let with = |qos: Option<&str>, nice: Option<i32>| JobRequest {
        qos: qos.map(str::to_string),
        nice,
        gpus: Some(3),
        ..Default::default()
    };
    let err = submit_job(&mut c, &ann, with(Some("gold"), None), 1).unwrap_err();
    assert!(
        err.message
            .contains("unknown QoS \"gold\"; this cluster has: high"),
        "{}",
        err.message
    );
    let err = submit_job(&mut c, &ann, with(None, Some(-5)), 1).unwrap_err();
    assert_eq!(err.kind, ErrorKind::PermissionDenied);
    // Once there are associations, a QoS hers does not allow is refused, and changes nothing.
    c.sched.accounts.push(wharf_core::Account {
        name: "ann".into(),
        parent: None,
        shares: 1,
    });
    for user in ["ann", "root"] {
        c.sched.users.push(wharf_core::UserShares {
            user: user.into(),
            account: "ann".into(),
            shares: 1,
        });
    }
    let err = submit_job(&mut c, &ann, with(Some("high"), None), 1).unwrap_err();
    assert_eq!(err.kind, ErrorKind::PermissionDenied);
    assert!(
        err.message.contains("QoS high is not allowed for user ann"),
        "{}",
        err.message
    );
    assert!(c.jobs.is_empty());
    c.sched.limits.accounts.insert(
        "ann".into(),
        wharf_core::limits::AssocLimits {
            qos: Some(vec!["high".into()]),
            ..Default::default()
        },
    );
    let mut root = caller(0, "root");
    root.admin = true;
    submit_job(&mut c, &root, with(None, Some(-5)), 1).unwrap();
    // The node is taken; three more wait. The QoS job outranks the older plain and nice ones.
    submit_job(&mut c, &ann, with(None, None), 2).unwrap();
    c.schedule(3).unwrap();
    let plain = submit_job(&mut c, &ann, with(None, None), 4).unwrap();
    let nice = submit_job(&mut c, &ann, with(None, Some(100)), 5).unwrap();
    let high = submit_job(&mut c, &ann, with(Some("high"), None), 6).unwrap();
    c.schedule(7).unwrap();
    let prio = |id| record(&c, id).priority.unwrap();
    assert_eq!(prio(high).qos, 2_000);
    assert!(prio(high).total > prio(plain).total);
    assert_eq!(prio(plain).total - prio(nice).total, 100);
}

#[test]
fn a_gpu_type_is_placed_on_that_type_and_an_absent_one_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = cluster(&dir);
    let mut a100 = c.nodes["n1"].info.clone();
    a100.name = "n2".into();
    for g in &mut a100.gpus {
        g.model = Some("NVIDIA A100-SXM4-80GB".into());
    }
    c.register(a100, 0).unwrap();
    let ann = caller(1000, "ann");
    let typed = |t: &str, n: u32| {
        let mut r = JobRequest::default();
        wharf_api::jobfile::set_option(&mut r, "gpus", &format!("{t}:{n}")).unwrap();
        r
    };
    let err = submit_job(&mut c, &ann, typed("l40", 1), 1).unwrap_err();
    assert!(
        err.message.contains("no node has 1 l40 GPUs") && err.message.contains("a100:3, h100:3"),
        "{}",
        err.message
    );
    let a = submit_job(&mut c, &ann, typed("a100", 2), 2).unwrap();
    let h = submit_job(&mut c, &ann, typed("H100", 2), 3).unwrap();
    c.schedule(1_000).unwrap();
    assert_eq!(record(&c, a).first_node(), Some("n2"));
    assert_eq!(record(&c, h).first_node(), Some("n1"));
}

#[test]
fn gpus_and_cpus_are_taken_close_together_where_the_agent_says_where_they_sit() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("wharf.db")).unwrap();
    let mut c = Cluster::load(store, JobDefaults::default(), 60_000, 0).unwrap();
    // GPUs 0,1 behind one switch on NUMA 0; 2,3 behind another on NUMA 1; CPUs 0-3 on
    // NUMA 0 and 4-7 on NUMA 1.
    let gpus = (0..4)
        .map(|index| GpuInfo {
            model: Some("NVIDIA H100 80GB HBM3".into()),
            numa_node: Some(index / 2),
            pcie_switch: Some(format!("0000:{:02x}:00.0", 0x10 + index / 2)),
            ..GpuInfo::minor(index)
        })
        .collect();
    c.register(
        NodeInfo {
            cpu_numa: vec![0, 0, 0, 0, 1, 1, 1, 1],
            ..NodeInfo::new("n1", "127.0.0.1", 8, 16 << 30, gpus)
        },
        0,
    )
    .unwrap();
    let ann = caller(1000, "ann");
    let one = submit_job(
        &mut c,
        &ann,
        JobRequest {
            gpus: Some(1),
            cpus: Some(1),
            ..JobRequest::default()
        },
        1,
    )
    .unwrap();
    c.schedule(1_000).unwrap();
    assert_eq!(record(&c, one).allocs[0].gpu_ids, [0]);
    assert_eq!(record(&c, one).allocs[0].cpu_ids, [0]);
    // Two GPUs: not 1 and 2 (lowest free ids, across NUMA nodes) but the pair 2,3, with
    // CPUs on their NUMA node.
    let two = submit_job(
        &mut c,
        &ann,
        JobRequest {
            gpus: Some(2),
            cpus: Some(2),
            ..JobRequest::default()
        },
        2,
    )
    .unwrap();
    c.schedule(2_000).unwrap();
    assert_eq!(record(&c, two).allocs[0].gpu_ids, [2, 3]);
    assert_eq!(record(&c, two).allocs[0].cpu_ids, [4, 5]);
}

#[test]
fn qos_limits_hold_a_users_second_job_and_refuse_what_could_never_run() {
    use wharf_core::{QosLimits, TresLimit};
    let dir = tempfile::tempdir().unwrap();
    let config = normal_qos(QosLimits {
        max_tres_per_user: TresLimit {
            gpu: Some(2),
            ..TresLimit::default()
        },
        max_submit_jobs_per_user: Some(3),
        max_wall: Some(3600 * 1000),
        ..QosLimits::default()
    });
    let mut c = cluster_with(&dir, config);
    let (ann, bob) = (caller(1000, "ann"), caller(1001, "bob"));
    let job = |gpus: u32, time: Option<u64>| JobRequest {
        qos: Some("normal".into()),
        gpus: Some(gpus),
        cpus: Some(1),
        time,
        ..Default::default()
    };
    let first = submit_job(&mut c, &ann, job(2, None), 1).unwrap();
    let second = submit_job(&mut c, &ann, job(1, None), 2).unwrap();
    let other = submit_job(&mut c, &bob, job(1, None), 3).unwrap();
    c.schedule(4).unwrap();
    assert_eq!(record(&c, first).state, JobState::Starting);
    assert_eq!(record(&c, other).state, JobState::Starting);
    let held = record(&c, second);
    assert_eq!(held.state, JobState::Pending);
    assert_eq!(
        held.reason.as_deref(),
        Some(
            "QOSMaxGRESPerUser: QoS normal allows each user 2 GPUs at once (max_tres_per_user \
             gpu); 2 GPUs are in use and it asks for 1 GPU; it starts when enough of them end"
        )
    );
    assert_eq!(
        held.pending_reason,
        Some(PendingReason::Limit(LimitReason::QosMaxTresPerUser {
            qos: "normal".into(),
            tres: TresKind::Gpu,
            limit: 2,
            in_use: 2,
            asks: 1,
        }))
    );

    // The next pass counts the running jobs (by their QoS): still held.
    c.schedule(5).unwrap();
    assert_eq!(record(&c, second).state, JobState::Pending);
    assert!(record(&c, second)
        .reason
        .unwrap()
        .starts_with("QOSMaxGRESPerUser"));

    let err = submit_job(&mut c, &bob, job(3, None), 5).unwrap_err();
    assert_eq!(err.kind, ErrorKind::InvalidInput);
    assert!(
        err.message
            .starts_with("this job could never start: QOSMaxGRESPerUser")
            && err.message.contains("it asks for 3 GPUs on its own"),
        "{}",
        err.message
    );
    let err = submit_job(&mut c, &bob, job(0, Some(7200)), 5).unwrap_err();
    assert!(
        err.message.contains("QOSMaxWallDurationPerJobLimit"),
        "{}",
        err.message
    );
    // ann has two jobs (one running, one pending): an array of two tasks would make four,
    // so it is refused whole; a third job is taken, a fourth is not.
    let pair = JobRequest {
        array: Some(wharf_api::array::parse_array("0-1").unwrap()),
        ..job(0, None)
    };
    let err = submit_job(&mut c, &ann, pair, 6).unwrap_err();
    assert!(
        err.message.contains("QOSMaxSubmitJobPerUserLimit"),
        "{}",
        err.message
    );
    let third = submit_job(&mut c, &ann, job(0, None), 6).unwrap();
    // At the cap, ann may still change a pending job of hers: it is not counted twice.
    let shorter = wharf_api::wire::UpdateRequest {
        time: Some(600),
        ..Default::default()
    };
    assert_eq!(c.update(&ann, third, &shorter, 6).unwrap().time_limit, 600);
    let err = submit_job(&mut c, &ann, job(0, None), 7).unwrap_err();
    assert_eq!(err.kind, ErrorKind::Unavailable);
    assert!(
        err.message.contains("QOSMaxSubmitJobPerUserLimit")
            && err
                .message
                .contains("allows each user 3 pending and running jobs"),
        "{}",
        err.message
    );
    // Leaving --qos out puts the job in the default QoS: no way around its limits.
    let plain = JobRequest {
        cpus: Some(1),
        ..Default::default()
    };
    let err = submit_job(&mut c, &ann, plain, 7).unwrap_err();
    assert!(
        err.message.contains("QOSMaxSubmitJobPerUserLimit"),
        "{}",
        err.message
    );
    submit_job(&mut c, &bob, job(0, None), 8).unwrap();
}

#[test]
fn an_accounts_cpu_limit_counts_jobs_of_every_user_below_it() {
    use wharf_core::{Account, AssocLimits, TresLimit, UserShares};
    let dir = tempfile::tempdir().unwrap();
    let mut config = wharf_core::Config::default();
    for (name, parent) in [("science", None), ("physics", Some("science"))] {
        config.accounts.push(Account {
            name: name.into(),
            parent: parent.map(str::to_string),
            shares: 1,
        });
    }
    config.accounts.push(Account {
        name: "other".into(),
        parent: None,
        shares: 1,
    });
    for (user, account) in [("ann", "physics"), ("bob", "science"), ("cat", "other")] {
        config.users.push(UserShares {
            user: user.into(),
            account: account.into(),
            shares: 1,
        });
    }
    config.limits.accounts.insert(
        "science".into(),
        AssocLimits {
            grp_tres: TresLimit {
                cpu: Some(4),
                ..TresLimit::default()
            },
            max_tres_per_job: TresLimit {
                cpu: Some(3),
                ..TresLimit::default()
            },
            ..AssocLimits::default()
        },
    );
    let mut c = cluster_with(&dir, config);
    let (ann, bob, cat) = (
        caller(1000, "ann"),
        caller(1001, "bob"),
        caller(1002, "cat"),
    );
    let cpus = |n: u32| JobRequest {
        cpus: Some(n),
        ..Default::default()
    };
    let a = submit_job(&mut c, &ann, cpus(3), 1).unwrap();
    let b = submit_job(&mut c, &bob, cpus(2), 2).unwrap();
    let other = submit_job(&mut c, &cat, cpus(2), 3).unwrap(); // b would fit beside it
    c.schedule(4).unwrap();
    assert_eq!(record(&c, a).state, JobState::Starting);
    assert_eq!(record(&c, other).state, JobState::Starting);
    let held = record(&c, b);
    assert_eq!(held.state, JobState::Pending);
    let reason = held.reason.unwrap();
    assert!(
        reason.starts_with("AssocGrpCpuLimit: account science allows 4 CPUs")
            && reason.contains("3 CPUs are in use and it asks for 2 CPUs"),
        "{reason}"
    );
    let err = submit_job(&mut c, &ann, cpus(4), 5).unwrap_err();
    assert!(
        err.message
            .contains("AssocMaxCpuPerJobLimit: account science allows one job 3 CPUs"),
        "{}",
        err.message
    );
}

/// n1's agent reports these jobs: `(id, ended by a stop)`; the rest are gone from it.
fn report(c: &mut Cluster, jobs: &[(JobId, bool)], now: u64) -> Vec<JobId> {
    use wharf_api::wire::{AgentJob, PollRequest};
    let jobs = jobs
        .iter()
        .map(|&(id, stopped)| AgentJob {
            id,
            start_time: Some(1),
            exit: stopped.then(|| wharf_api::ExitInfo {
                signal: Some(15),
                cancelled: true,
                ..Default::default()
            }),
            end_time: stopped.then_some(now),
            stopping: false,
            ready: false,
            time_limit: None,
        })
        .collect();
    let poll = PollRequest {
        seq: None,
        node: "n1".into(),
        jobs,
        ..Default::default()
    };
    c.ingest(&poll, now).unwrap().forget
}

/// Partitions `scav` (tier 0, its jobs requeued when preempted) and `high` (tier 1), both
/// over every node.
pub(crate) fn tiers() -> wharf_core::Config {
    let mut config = wharf_core::Config::default();
    let mut scav = wharf_core::Partition::new("scav", &[]);
    scav.preempt_mode = wharf_core::PreemptMode::Requeue;
    let mut high = wharf_core::Partition::new("high", &[]);
    high.priority_tier = 1;
    config.partitions = vec![scav, high];
    config
}

#[test]
fn a_preempted_job_is_stopped_requeued_and_started_again_only_once_its_node_let_go() {
    let dir = tempfile::tempdir().unwrap();
    let config = tiers();
    let mut c = cluster_with(&dir, config);
    let ann = caller(1000, "ann");
    let whole = |p: &str| JobRequest {
        partition: Some(p.into()),
        cpus: Some(8),
        ..Default::default()
    };
    let low = submit_job(&mut c, &ann, whole("scav"), 10).unwrap();
    c.schedule(1_000).unwrap();
    report(&mut c, &[(low, false)], 1_500);
    assert_eq!(record(&c, low).state, JobState::Running);

    let high = submit_job(&mut c, &ann, whole("high"), 2_000).unwrap();
    c.schedule(3_000).unwrap();
    let stop = wharf_api::Stop::Preempt {
        by: high,
        requeue: true,
    };
    assert_eq!(record(&c, low).stop, Some(stop));
    // Stored in the same commit as the pass's other decisions.
    assert_eq!(
        c.store.job(low).unwrap().unwrap().stop,
        record(&c, low).stop
    );
    let waits = record(&c, high).reason.unwrap();
    assert!(waits.contains(&format!("waiting for job {low}")), "{waits}");
    let (launch, kill) = c.orders(
        "n1",
        &BTreeSet::from([low]),
        &BTreeSet::new(),
        &BTreeSet::new(),
    );
    assert!(launch.is_empty());
    assert_eq!(kill[0].reason, format!("preempted by job {high}"));
    // A second pass chooses it no second time.
    c.schedule(3_500).unwrap();
    assert_eq!(record(&c, low).state, JobState::Running);

    let forget = report(&mut c, &[(low, true)], 4_000);
    assert_eq!(forget, vec![low]);
    let requeued = record(&c, low);
    assert_eq!(
        (requeued.state, requeued.restarts, requeued.submit_time),
        (JobState::Pending, 1, 10)
    );
    assert_eq!(requeued.requeued_from, ["n1"]);
    let waiting: Vec<JobId> = c.requeued_from("n1").map(|j| j.id).collect();
    assert_eq!(waiting, [low], "the index of jobs waiting for n1");
    assert_eq!((requeued.first_node(), requeued.start_time), (None, None));
    // The high job starts; the low one waits for n1 to let go of its last run, even when the
    // agent repeats the old report.
    c.schedule(5_000).unwrap();
    assert_eq!(record(&c, high).state, JobState::Starting);
    report(&mut c, &[(low, true), (high, false)], 5_500);
    assert_eq!(record(&c, low).state, JobState::Pending);
    assert_eq!(record(&c, low).restarts, 1);
    report(&mut c, &[(high, false)], 6_000);
    assert!(record(&c, low).requeued_from.is_empty());
    assert_eq!(c.requeued_from("n1").count(), 0);
    // Once the high job is gone the low one starts again, told it is a restart.
    c.cancel(&ann, high, 6_500).unwrap();
    report(&mut c, &[(high, true)], 7_000);
    c.schedule(8_000).unwrap();
    assert_eq!(record(&c, low).state, JobState::Starting);
    let (launch, _) = c.orders("n1", &BTreeSet::new(), &BTreeSet::new(), &BTreeSet::new());
    assert_eq!((launch[0].id, launch[0].restarts), (low, 1));
}

#[test]
fn mig_instances_are_scheduled_by_their_profile_and_launched_by_their_unit_id() {
    use wharf_api::node::{mig_unit_id, MigInfo};
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("wharf.db")).unwrap();
    let mut c = Cluster::load(store, JobDefaults::default(), 60_000, 0).unwrap();
    let mig = |uuid: &str| MigInfo {
        uuid: uuid.into(),
        profile: "1g.10gb".into(),
        memory: Some(10 << 30),
        caps: vec![21, 22],
    };
    let gpu = GpuInfo {
        model: Some("NVIDIA H100 80GB HBM3".into()),
        mig: vec![mig("MIG-a"), mig("MIG-b")],
        ..GpuInfo::minor(0)
    };
    c.register(NodeInfo::new("n1", "127.0.0.1", 8, 16 << 30, vec![gpu]), 0)
        .unwrap();
    let ann = caller(1000, "ann");
    let typed = |kind: &str| JobRequest {
        gpus: Some(1),
        gpu_type: Some(kind.into()),
        ..Default::default()
    };
    let first = submit_job(&mut c, &ann, typed("1g.10gb"), 10).unwrap();
    let second = submit_job(&mut c, &ann, typed("1g.10gb"), 11).unwrap();
    // The GPU in MIG mode is not an h100 to be had whole: it can never run.
    let whole = submit_job(&mut c, &ann, typed("h100"), 12);
    assert!(whole.is_err(), "{whole:?}");
    c.schedule(100).unwrap();
    let (launch, _) = c.orders("n1", &BTreeSet::new(), &BTreeSet::new(), &BTreeSet::new());
    let given: Vec<(JobId, Vec<u32>)> = launch.iter().map(|o| (o.id, o.gpu_ids.clone())).collect();
    assert_eq!(
        given,
        [
            (first, vec![mig_unit_id(0, 0)]),
            (second, vec![mig_unit_id(0, 1)])
        ]
    );
    // Two instances: the node reports two GPUs.
    let n = c.nodes().into_iter().find(|n| n.info.name == "n1").unwrap();
    assert_eq!(n.info.capacity().gpus, 2);
}

/// A job started, with its nodes and the CPU ids it holds on each.
type StartedOn = (JobId, Vec<(String, Vec<u32>)>);

/// The simulator and the controller decide around a pass with the same code
/// (`wharf_core::cycle`): one workload gives the same starts, on the same nodes with the same
/// CPU ids, through a simulated replay and through a controller's pass.
#[test]
fn the_simulator_and_the_controller_start_the_same_jobs_in_the_same_places() {
    use wharf_sim::driver::{Knobs, Policy};
    use wharf_sim::workload::{Account, Measure, SimJob, SimNodeSpec, Workload};

    let node = wharf_api::Resources {
        cpus: 8,
        memory: 16 << 30,
        gpus: 0,
    };
    let mut config = wharf_core::Config::default();
    config.accounts.push(wharf_core::Account {
        name: "physics".into(),
        parent: None,
        shares: 1,
    });
    for user in ["u0", "u1"] {
        config.users.push(wharf_core::UserShares {
            user: user.into(),
            account: "physics".into(),
            shares: 1,
        });
    }
    // (user, nodes, CPUs per node, time limit s): a node-filling job, a gang that must wait
    // for both nodes, short jobs to backfill around it, a long one that must not.
    let shapes = [
        (0, 1, 6, 3_600),
        (1, 2, 4, 3_600),
        (0, 1, 2, 600),
        (1, 1, 8, 7_200),
        (1, 1, 1, 300),
        (0, 1, 3, 900),
    ];
    let at = 1_000;
    let jobs: Vec<SimJob> = shapes
        .iter()
        .enumerate()
        .map(|(i, &(user, nodes, cpus, limit))| SimJob {
            id: i as JobId + 1,
            submit: at,
            run: limit * 1000,
            limit: limit * 1000,
            nodes,
            per_node: wharf_api::Resources {
                cpus,
                memory: 1 << 30,
                gpus: 0,
            },
            user,
            account: 0,
            partition: None,
        })
        .collect();
    let workload = Workload {
        name: "shared".into(),
        nodes: ["n1", "n2"]
            .iter()
            .map(|n| SimNodeSpec {
                name: n.to_string(),
                capacity: node,
            })
            .collect(),
        accounts: vec![Account {
            name: "physics".into(),
            shares: 1,
        }],
        partitions: vec![],
        jobs: jobs.clone(),
        measure: Measure::Cpus,
        skipped: 0,
    };
    let knobs = Knobs {
        config: config.clone(),
        billing: None,
    };
    let replay = wharf_sim::engine::replay_with(&workload, Policy::Wharf, &knobs).unwrap();
    let mut simulated: Vec<StartedOn> = replay
        .decisions
        .iter()
        .filter(|(t, _, _)| *t == at)
        .map(|(_, job, allocs)| {
            let allocs = allocs.iter().map(|(n, c, _)| (n.clone(), c.clone()));
            (*job, allocs.collect())
        })
        .collect();
    simulated.sort();

    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("wharf.db")).unwrap();
    let mut c =
        Cluster::load_with_scheduler(store, JobDefaults::default(), 60_000, 0, config).unwrap();
    for name in ["n1", "n2"] {
        let info = NodeInfo::new(name, "127.0.0.1", node.cpus, node.memory, vec![]);
        c.register(info, 0).unwrap();
    }
    for job in &jobs {
        let who = caller(1000 + job.user, &format!("u{}", job.user));
        let req = JobRequest {
            cpus: Some(job.per_node.cpus),
            memory: Some(job.per_node.memory),
            nodes: Some(job.nodes),
            time: Some(job.limit / 1000),
            ..Default::default()
        };
        assert_eq!(submit_job(&mut c, &who, req, at).unwrap(), job.id);
    }
    c.schedule(at).unwrap();
    let controlled: Vec<StartedOn> = jobs
        .iter()
        .map(|j| record(&c, j.id))
        .filter(|r| r.state == JobState::Starting)
        .map(|r| {
            let allocs = r.allocs.iter().map(|a| (a.node.clone(), a.cpu_ids.clone()));
            (r.id, allocs.collect())
        })
        .collect();

    assert!(
        controlled.len() >= 3 && controlled.len() < jobs.len(),
        "some start, some wait: {controlled:?}"
    );
    assert_eq!(simulated, controlled);
}

/// ann's job waits for the node from 2 s; bob, who has used nothing, sends the same job at
/// 15 min; the pass at 20 min decides whose job holds the one reservation (is expected to
/// start at some time; no estimates past it).
fn next_on_the_node(keep_after_min: u64) -> (Option<u64>, Option<u64>) {
    let dir = tempfile::tempdir().unwrap();
    let config = wharf_core::Config {
        reservations: 1,
        assoc_reservations: 0,
        keep_reservations_after: keep_after_min * 60_000,
        start_estimates: 0,
        ..Default::default()
    };
    let mut c = cluster_with(&dir, config);
    let (ann, bob) = (caller(1000, "ann"), caller(1001, "bob"));
    holds_the_node_after_an_hour_on_it(&mut c, &ann);
    let ann_next = submit(&mut c, &ann, 3, 2_000);
    c.schedule(3_000).unwrap();
    assert!(record(&c, ann_next).expected_start.is_some());
    let bob_next = submit(&mut c, &bob, 3, 15 * 60_000);
    c.schedule(20 * 60_000).unwrap();
    (
        record(&c, ann_next).expected_start,
        record(&c, bob_next).expected_start,
    )
}

#[test]
fn a_job_that_waited_long_enough_keeps_its_reservation_from_pass_to_pass() {
    // ann's job has waited 20 min of the 10 needed: bob's waits behind it.
    let (ann, bob) = next_on_the_node(10);
    assert!(ann.is_some());
    assert_eq!(bob, None, "one reservation, ann's");
    // Of the 30 needed: bob's, of higher priority, takes it.
    let (ann, bob) = next_on_the_node(30);
    assert!(bob.is_some());
    assert_eq!(ann, None);
}

#[test]
fn a_job_moved_to_another_partition_does_not_keep_its_reservation() {
    use wharf_api::wire::UpdateRequest;
    let dir = tempfile::tempdir().unwrap();
    let config = wharf_core::Config {
        keep_reservations_after: 0,
        partitions: vec![
            wharf_core::Partition::new("a", &[]),
            wharf_core::Partition::new("b", &[]),
        ],
        ..Default::default()
    };
    let mut c = cluster_with(&dir, config);
    let ann = caller(1000, "ann");
    submit(&mut c, &ann, 3, 10);
    let next = submit(&mut c, &ann, 3, 20);
    c.schedule(1_000).unwrap();
    assert!(c.reserved.contains_key(&next), "it holds the reservation");
    let same = UpdateRequest {
        time: Some(600),
        ..Default::default()
    };
    c.update(&ann, next, &same, 2_000).unwrap();
    assert!(c.reserved.contains_key(&next), "a shorter time keeps it");
    let moved = UpdateRequest {
        partition: Some("b".into()),
        ..Default::default()
    };
    c.update(&ann, next, &moved, 2_000).unwrap();
    assert!(!c.reserved.contains_key(&next));
}

#[test]
fn a_job_without_a_time_gets_its_partitions_default_never_over_its_maximum() {
    use wharf_api::wire::UpdateRequest;
    let dir = tempfile::tempdir().unwrap();
    let mut short = wharf_core::Partition::new("short", &[]);
    short.max_time = Some(1_800_000);
    let mut quick = wharf_core::Partition::new("quick", &[]);
    quick.default_time = Some(600_000);
    let config = wharf_core::Config {
        partitions: vec![wharf_core::Partition::new("all", &[]), short, quick],
        ..Default::default()
    };
    let mut c = cluster_with(&dir, config);
    let ann = caller(1000, "ann");
    let named = |p: &str, time: Option<u64>| JobRequest {
        partition: Some(p.into()),
        time,
        ..Default::default()
    };
    let limit = |c: &Cluster, id: JobId| {
        let r = record(c, id);
        assert_eq!(r.spec.as_ref().unwrap().time_limit, r.time_limit);
        r.time_limit
    };
    // The site's default is an hour: over short's maximum, which it gets instead.
    let in_short = submit_job(&mut c, &ann, named("short", None), 1).unwrap();
    assert_eq!(limit(&c, in_short), 1800);
    let in_quick = submit_job(&mut c, &ann, named("quick", None), 2).unwrap();
    assert_eq!(limit(&c, in_quick), 600);
    let in_all = submit_job(&mut c, &ann, named("all", None), 3).unwrap();
    assert_eq!(limit(&c, in_all), 3600);
    let given = submit_job(&mut c, &ann, named("quick", Some(1200)), 4).unwrap();
    assert_eq!(limit(&c, given), 1200);

    // Moved, a job that gave no time takes the new partition's; one that gave one keeps it.
    let to = |p: &str| UpdateRequest {
        partition: Some(p.into()),
        ..Default::default()
    };
    c.update(&ann, in_quick, &to("short"), 10).unwrap();
    assert_eq!(limit(&c, in_quick), 1800);
    c.update(&ann, in_short, &to("quick"), 10).unwrap();
    assert_eq!(limit(&c, in_short), 600);
    c.update(&ann, given, &to("all"), 10).unwrap();
    assert_eq!(limit(&c, given), 1200);
    // A time given by update is the job's own from then on.
    let shorter = UpdateRequest {
        time: Some(300),
        ..Default::default()
    };
    c.update(&ann, in_all, &shorter, 10).unwrap();
    c.update(&ann, in_all, &to("short"), 10).unwrap();
    assert_eq!(limit(&c, in_all), 300);
}

#[test]
fn memory_per_cpu_and_per_gpu_default_convert_and_are_capped_by_the_partition() {
    use wharf_api::wire::UpdateRequest;
    const G: u64 = 1 << 30;
    let dir = tempfile::tempdir().unwrap();
    let mut gpu = wharf_core::Partition::new("gpu", &[]);
    gpu.def_mem_per_cpu = Some(G / 2);
    gpu.def_mem_per_gpu = Some(4 * G);
    gpu.max_mem_per_cpu = Some(3 * G);
    gpu.max_mem_per_gpu = Some(5 * G);
    let config = wharf_core::Config {
        partitions: vec![wharf_core::Partition::new("all", &[]), gpu],
        ..Default::default()
    };
    let mut c = cluster_with(&dir, config);
    let ann = caller(1000, "ann");
    let job = |cpus: u32, gpus: u32| JobRequest {
        partition: Some("gpu".into()),
        cpus: Some(cpus),
        gpus: Some(gpus),
        ..Default::default()
    };
    let memory = |c: &Cluster, id: JobId| {
        let r = record(c, id);
        assert_eq!(r.spec.as_ref().unwrap().resources, r.resources);
        r.resources.memory
    };
    let with_gpus = submit_job(&mut c, &ann, job(1, 2), 1).unwrap();
    assert_eq!(
        memory(&c, with_gpus),
        8 * G,
        "DefMemPerGPU times 2 GPUs (what the partition gave is not held against its maxima)"
    );
    let cpus_only = submit_job(&mut c, &ann, job(4, 0), 2).unwrap();
    assert_eq!(memory(&c, cpus_only), 2 * G, "DefMemPerCPU times 4 CPUs");
    let per_cpu = JobRequest {
        mem_per_cpu: Some(G),
        ..job(3, 0)
    };
    let per_cpu = submit_job(&mut c, &ann, per_cpu, 3).unwrap();
    assert_eq!(memory(&c, per_cpu), 3 * G);
    let per_gpu = JobRequest {
        mem_per_gpu: Some(5 * G),
        ..job(4, 2)
    };
    let per_gpu = submit_job(&mut c, &ann, per_gpu, 4).unwrap();
    assert_eq!(memory(&c, per_gpu), 10 * G);

    let over = JobRequest {
        mem_per_cpu: Some(4 * G),
        ..job(2, 0)
    };
    let err = submit_job(&mut c, &ann, over, 5).unwrap_err();
    assert_eq!(err.kind, ErrorKind::InvalidInput);
    assert!(
        err.message
            .contains("4G per CPU, over partition gpu's MaxMemPerCPU of 3G"),
        "{}",
        err.message
    );
    let over = JobRequest {
        memory: Some(12 * G),
        ..job(8, 2)
    };
    let err = submit_job(&mut c, &ann, over, 6).unwrap_err();
    assert!(
        err.message
            .contains("6G per GPU, over partition gpu's MaxMemPerGPU of 5G"),
        "{}",
        err.message
    );
    let both = JobRequest {
        memory: Some(G),
        mem_per_cpu: Some(G),
        ..job(1, 0)
    };
    let err = submit_job(&mut c, &ann, both, 7).unwrap_err();
    assert!(
        err.message.contains("give one of `memory`"),
        "{}",
        err.message
    );

    // Moved to a partition without defaults, a job that asked for no memory gets the site's;
    // one that asked keeps what it asked for.
    let to_all = UpdateRequest {
        partition: Some("all".into()),
        ..Default::default()
    };
    c.update(&ann, with_gpus, &to_all, 10).unwrap();
    assert_eq!(memory(&c, with_gpus), JobDefaults::default().memory);
    c.update(&ann, per_cpu, &to_all, 10).unwrap();
    assert_eq!(memory(&c, per_cpu), 3 * G);
}

#[test]
fn moving_a_whole_array_to_a_capped_qos_counts_every_task() {
    use wharf_core::QosLimits;
    let dir = tempfile::tempdir().unwrap();
    let mut config = wharf_core::Config::default();
    for name in ["normal", "small"] {
        config.qos.push(wharf_core::Qos {
            name: name.into(),
            priority: 0,
        });
    }
    config.limits.qos.insert(
        "small".into(),
        QosLimits {
            max_submit_jobs_per_user: Some(2),
            ..QosLimits::default()
        },
    );
    let mut c = cluster_with(&dir, config);
    let ann = caller(1000, "ann");
    let array = |tasks: &str| JobRequest {
        qos: Some("normal".into()),
        hold: Some(true),
        array: Some(wharf_api::array::parse_array(tasks).unwrap()),
        ..Default::default()
    };
    let four = submit_job(&mut c, &ann, array("0-3"), 1).unwrap();
    let to_small = wharf_api::wire::UpdateRequest {
        qos: Some("small".into()),
        ..Default::default()
    };
    // Task by task each saw the other three still in `normal`, and all four moved.
    let err = c.update_array(&ann, four, &to_small, 2).unwrap_err();
    assert!(err.message.contains("refused"), "{}", err.message);
    for id in four..four + 4 {
        assert_eq!(
            record(&c, id).spec.unwrap().qos.as_deref(),
            Some("normal"),
            "none changed"
        );
    }
    let two = submit_job(&mut c, &ann, array("0-1"), 3).unwrap();
    c.update_array(&ann, two, &to_small, 4).unwrap();
    assert_eq!(
        record(&c, two + 1).spec.unwrap().qos.as_deref(),
        Some("small")
    );
}

#[test]
fn a_partitions_default_memory_is_held_to_the_sites_ceiling() {
    const G: u64 = 1 << 30;
    let dir = tempfile::tempdir().unwrap();
    let mut gpu = wharf_core::Partition::new("gpu", &[]);
    gpu.def_mem_per_gpu = Some(4 * G);
    let config = wharf_core::Config {
        partitions: vec![gpu],
        ..Default::default()
    };
    let mut c = cluster_with(&dir, config);
    c.defaults.max_resources.memory = Some(6 * G);
    let ann = caller(1000, "ann");
    let job = |gpus: u32| JobRequest {
        partition: Some("gpu".into()),
        gpus: Some(gpus),
        ..Default::default()
    };
    // 2 GPUs x 4G is over the site's 6G: refused, naming where it came from.
    let err = submit_job(&mut c, &ann, job(2), 1).unwrap_err();
    assert!(
        err.message
            .starts_with("with partition gpu's default memory per CPU or GPU:")
            && err.message.contains("give --mem"),
        "{}",
        err.message
    );
    assert!(c.jobs.is_empty());
    let one = submit_job(&mut c, &ann, job(1), 2).unwrap();
    assert_eq!(record(&c, one).resources.memory, 4 * G);
}

/// An agent gives up on a report when something changes on its node and sends a newer one;
/// the older one may still reach the controller after it. Taken then, it would make a job
/// launched in between look lost.
#[test]
fn a_report_older_than_one_already_taken_is_not_taken() {
    use wharf_api::wire::{AgentJob, PollRequest, PollSeq};
    let dir = tempfile::tempdir().unwrap();
    let mut c = cluster(&dir);
    let id = submit(&mut c, &caller(1000, "ann"), 1, 10);
    c.schedule(1_000).unwrap();
    let started = AgentJob {
        id,
        start_time: Some(1_100),
        exit: None,
        end_time: None,
        stopping: false,
        ready: false,
        time_limit: None,
    };
    let poll = |n: u64, jobs: Vec<AgentJob>| PollRequest {
        seq: Some(PollSeq { boot: 7, n }),
        node: "n1".into(),
        jobs,
        ..Default::default()
    };
    // Report 2 (the job started) arrives first; report 1, sent before the launch, after.
    assert!(!c.ingest(&poll(2, vec![started]), 1_200).unwrap().stale);
    assert_eq!(record(&c, id).state, JobState::Running);
    assert!(c.ingest(&poll(1, vec![]), 1_300).unwrap().stale);
    assert_eq!(
        record(&c, id).state,
        JobState::Running,
        "not taken for lost"
    );
    // A newer report without it, or one of a new run of the agent, is news.
    let restarted = PollRequest {
        seq: Some(PollSeq { boot: 8, n: 1 }),
        ..poll(1, vec![])
    };
    assert!(!c.ingest(&restarted, 1_400).unwrap().stale);
    assert!(!c.jobs.contains_key(&id), "taken for lost, it ended");
}

/// A QoS taken out of an association's list holds the jobs queued under it (InvalidQOS, as
/// Slurm), until it is granted again; one an admin set holds whatever the list says.
#[test]
fn a_revoked_qos_holds_its_queued_jobs_until_granted_again_unless_an_admin_set_it() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = wharf_core::Config::default();
    config.qos.push(wharf_core::Qos {
        name: "urgent".into(),
        priority: 10,
    });
    in_lab(&mut config, &["ann", "bob"]);
    let mut c = cluster_with(&dir, config);
    grant(&mut c, &["urgent"]);
    let (ann, bob) = (caller(1000, "ann"), caller(1001, "bob"));
    let mut root = caller(0, "root");
    root.admin = true;
    let urgent = |gpus| JobRequest {
        qos: Some("urgent".into()),
        gpus: Some(gpus),
        ..Default::default()
    };
    // The node's 3 GPUs are taken, so both wait.
    let busy = submit_job(&mut c, &ann, urgent(3), 1).unwrap();
    c.schedule(2).unwrap();
    assert_eq!(record(&c, busy).state, JobState::Starting);
    let mine = submit_job(&mut c, &ann, urgent(1), 3).unwrap();
    let set = submit_job(&mut c, &bob, JobRequest::default(), 3).unwrap();
    grant(&mut c, &[]);
    let moved = wharf_api::wire::UpdateRequest {
        qos: Some("urgent".into()),
        ..Default::default()
    };
    c.update(&root, set, &moved, 4).unwrap();
    c.schedule(5).unwrap();
    let held = record(&c, mine);
    assert_eq!(
        held.pending_reason,
        Some(PendingReason::InvalidQos {
            qos: "urgent".into()
        }),
        "{:?}",
        held.reason
    );
    assert!(held
        .reason
        .unwrap()
        .starts_with("InvalidQOS: QoS urgent is no longer"));
    // The job an admin moved into it waits only for resources.
    assert_ne!(
        record(&c, set).pending_reason.map(|r| r.code()),
        Some("InvalidQOS")
    );
    // Granted again: it waits for resources like any other.
    grant(&mut c, &["urgent"]);
    c.schedule(6).unwrap();
    assert_ne!(
        record(&c, mine).pending_reason.map(|r| r.code()),
        Some("InvalidQOS")
    );
}

#[test]
fn a_job_that_names_no_qos_keeps_the_default_qos_of_its_submit() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = wharf_core::Config::default();
    for (name, priority) in [("normal", 100), ("low", 0)] {
        config.qos.push(wharf_core::Qos {
            name: name.into(),
            priority,
        });
    }
    config.limits.default_qos = Some("normal".into());
    in_lab(&mut config, &["ann"]);
    let mut c = cluster_with(&dir, config);
    // The account grants only `low`: `normal` was open to anyone as the default.
    grant(&mut c, &["low"]);
    let ann = caller(1000, "ann");
    let busy = submit(&mut c, &ann, 3, 1);
    c.schedule(2).unwrap();
    assert_eq!(record(&c, busy).state, JobState::Starting);
    let queued = submit(&mut c, &ann, 1, 3);
    let spec = record(&c, queued).spec.unwrap();
    assert_eq!(spec.qos.as_deref(), Some("normal"));
    // The admin makes `low` the default: the queued job keeps `normal`, is not held for a QoS
    // its account does not grant, and later jobs get `low`.
    c.sched.limits.default_qos = Some("low".into());
    let later = submit(&mut c, &ann, 1, 4);
    assert_eq!(record(&c, later).spec.unwrap().qos.as_deref(), Some("low"));
    c.schedule(5).unwrap();
    let held = record(&c, queued);
    assert_ne!(
        held.pending_reason.map(|r| r.code()),
        Some("InvalidQOS"),
        "{:?}",
        held.reason
    );
    let qos_factor = |id| record(&c, id).priority.map(|p| p.qos);
    assert!(
        qos_factor(queued) > qos_factor(later),
        "normal's priority still counts: {:?} against {:?}",
        qos_factor(queued),
        qos_factor(later)
    );
    // Moving the job to another account checks no QoS the job never named.
    let moved = wharf_api::wire::UpdateRequest {
        account: Some("lab".into()),
        ..Default::default()
    };
    c.update(&ann, queued, &moved, 6).unwrap();
    // A QoS that no longer exists holds it, defaulted or not.
    c.sched.qos.retain(|q| q.name != "normal");
    c.schedule(7).unwrap();
    assert_eq!(
        record(&c, queued).pending_reason,
        Some(PendingReason::InvalidQos {
            qos: "normal".into()
        })
    );
}

#[test]
fn an_exclusive_job_over_a_limit_on_every_whole_node_is_refused_at_submit() {
    use wharf_core::{QosLimits, TresLimit};
    let dir = tempfile::tempdir().unwrap();
    let config = normal_qos(QosLimits {
        max_tres_per_user: TresLimit {
            gpu: Some(2),
            ..TresLimit::default()
        },
        ..QosLimits::default()
    });
    // The one node holds 3 GPUs: an exclusive job is charged all 3, over the cap of 2.
    let mut c = cluster_with(&dir, config);
    let ann = caller(1000, "ann");
    let job = |exclusive| JobRequest {
        gpus: Some(1),
        exclusive: Some(exclusive),
        ..Default::default()
    };
    let err = submit_job(&mut c, &ann, job(true), 1).unwrap_err();
    assert_eq!(err.kind, ErrorKind::InvalidInput);
    assert!(
        err.message
            .starts_with("this job could never start: it is exclusive")
            && err.message.contains("it asks for 3 GPUs on its own"),
        "{}",
        err.message
    );
    assert!(c.jobs.is_empty(), "nothing is stored");
    // The same job, not exclusive, is taken and starts.
    let shared = submit_job(&mut c, &ann, job(false), 2).unwrap();
    c.schedule(3).unwrap();
    assert_eq!(record(&c, shared).state, JobState::Starting);
}

#[test]
fn an_unlimited_time_is_the_partitions_maximum_wherever_the_job_goes() {
    use wharf_api::wire::UpdateRequest;
    use wharf_api::UNLIMITED_TIME;
    let dir = tempfile::tempdir().unwrap();
    let mut short = wharf_core::Partition::new("short", &[]);
    short.max_time = Some(1_800_000);
    let config = wharf_core::Config {
        partitions: vec![wharf_core::Partition::new("all", &[]), short],
        ..Default::default()
    };
    let mut c = cluster_with(&dir, config);
    let ann = caller(1000, "ann");
    let mut root = caller(0, "root");
    root.admin = true;
    let limit = |c: &Cluster, id: JobId| {
        let r = record(c, id);
        assert_eq!(r.spec.as_ref().unwrap().time_limit, r.time_limit);
        r.time_limit
    };
    let unlimited = |p: &str| JobRequest {
        partition: Some(p.into()),
        time: Some(UNLIMITED_TIME),
        ..Default::default()
    };
    let site_max = JobDefaults::default().max_time;
    let in_short = submit_job(&mut c, &ann, unlimited("short"), 1).unwrap();
    assert_eq!(limit(&c, in_short), 1800);
    let in_all = submit_job(&mut c, &ann, unlimited("all"), 2).unwrap();
    assert_eq!(limit(&c, in_all), site_max);
    // Moved, it takes the new partition's maximum.
    let to = |p: &str| UpdateRequest {
        partition: Some(p.into()),
        ..Default::default()
    };
    c.update(&ann, in_all, &to("short"), 3).unwrap();
    assert_eq!(limit(&c, in_all), 1800);
    c.update(&ann, in_all, &to("all"), 4).unwrap();
    assert_eq!(limit(&c, in_all), site_max);
    // By update: the owner may not raise a limit to it; an admin may.
    let shorter = UpdateRequest {
        time: Some(300),
        ..Default::default()
    };
    c.update(&ann, in_short, &shorter, 5).unwrap();
    let raise = UpdateRequest {
        time: Some(UNLIMITED_TIME),
        ..Default::default()
    };
    let err = c.update(&ann, in_short, &raise, 6).unwrap_err();
    assert_eq!(err.kind, ErrorKind::PermissionDenied);
    assert_eq!(limit(&c, in_short), 300);
    c.update(&root, in_short, &raise, 7).unwrap();
    assert_eq!(limit(&c, in_short), 1800);
    c.update(&ann, in_short, &to("all"), 8).unwrap();
    assert_eq!(limit(&c, in_short), site_max);
}

#[test]
fn a_task_held_for_a_revoked_qos_takes_no_place_under_its_arrays_throttle() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = wharf_core::Config::default();
    for name in ["urgent", "normal"] {
        config.qos.push(wharf_core::Qos {
            name: name.into(),
            priority: 0,
        });
    }
    in_lab(&mut config, &["ann"]);
    let mut c = cluster_with(&dir, config);
    grant(&mut c, &["urgent"]);
    let ann = caller(1000, "ann");
    let mut root = caller(0, "root");
    root.admin = true;
    // Two tasks, one at a time. An admin puts the second in `normal`, which then holds
    // whatever the grants; `urgent` is then taken from the account.
    let array = JobRequest {
        qos: Some("urgent".into()),
        cpus: Some(1),
        array: Some(wharf_api::array::parse_array("0-1%1").unwrap()),
        ..Default::default()
    };
    let first = submit_job(&mut c, &ann, array, 1).unwrap();
    let second = first + 1;
    let to_normal = wharf_api::wire::UpdateRequest {
        qos: Some("normal".into()),
        ..Default::default()
    };
    c.update(&root, second, &to_normal, 2).unwrap();
    grant(&mut c, &[]);
    c.schedule(3).unwrap();
    // The first task is held for its QoS, so the second has the throttle's one place.
    assert_eq!(
        record(&c, first).pending_reason.map(|r| r.code()),
        Some("InvalidQOS")
    );
    let ran = record(&c, second);
    assert_eq!(ran.state, JobState::Starting, "{:?}", ran.reason);
}

#[test]
fn moving_a_job_to_an_account_its_owner_is_not_in_names_the_account_not_the_qos() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = wharf_core::Config::default();
    config.qos.push(wharf_core::Qos {
        name: "urgent".into(),
        priority: 10,
    });
    in_lab(&mut config, &["ann"]);
    let mut c = cluster_with(&dir, config);
    grant(&mut c, &["urgent"]);
    let ann = caller(1000, "ann");
    let job = JobRequest {
        qos: Some("urgent".into()),
        hold: Some(true),
        ..Default::default()
    };
    let id = submit_job(&mut c, &ann, job, 1).unwrap();
    let elsewhere = wharf_api::wire::UpdateRequest {
        account: Some("nosuch".into()),
        ..Default::default()
    };
    let err = c.update(&ann, id, &elsewhere, 2).unwrap_err();
    assert!(
        err.message.contains("you are not in account \"nosuch\""),
        "{}",
        err.message
    );
}
