//! The one conformance suite every [`Ledger`] runs: SQLite always, PostgreSQL on a real
//! server that the test starts ([`super::pg_server`]). Each case gets a fresh, empty ledger
//! from the factory.

use std::collections::BTreeMap;
use std::time::Duration;

use wharf_api::usage::JobUsage;
use wharf_api::{JobRecord, JobState, Owner, Resources};

use super::pg_server::PgServer;
use super::postgres::PgLedger;
use super::sqlite::SqliteLedger;
use super::{JobRun, Ledger, RunFilter, REQUEUED};

const H: u64 = 3_600_000;
pub(crate) const T0: u64 = 1_800_000_000_000;

/// A run of `job` by `user` (uid 1000 + its index in "abcdefg") in `account`/`partition`,
/// from `start` to `end` (ms after T0), holding `cpus` and `gpus`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn run(
    job: u64,
    run: u32,
    user: &str,
    account: &str,
    partition: &str,
    start: Option<u64>,
    end: u64,
    cpus: u32,
    gpus: u32,
    state: &str,
) -> JobRun {
    let uid = 1000 + "abcdefg".find(user).unwrap_or(9) as u32;
    let owner = Owner {
        uid,
        gid: uid,
        user: user.into(),
    };
    let resources = Resources {
        cpus,
        memory: 2 << 30,
        gpus,
    };
    let mut record = JobRecord::pending(owner, format!("job{job}"), resources, 3600, T0);
    record.id = job;
    record.start_time = start.map(|s| T0 + s);
    record.end_time = Some(T0 + end);
    record.state = JobState::parse(state).unwrap_or(JobState::Pending);
    JobRun {
        job_id: job,
        run,
        array_job_id: None,
        array_task_id: None,
        uid,
        user: user.into(),
        account: account.into(),
        partition: partition.into(),
        qos: Some("normal".into()),
        nodes: "n1".into(),
        node_count: 1,
        submit_time: T0,
        eligible_time: T0,
        start_time: start.map(|s| T0 + s),
        end_time: T0 + end,
        state: state.into(),
        exit_code: Some(0),
        exit_signal: None,
        cpus,
        memory: 2 << 30,
        gpus,
        gpu_type: (gpus > 0).then(|| "a100".into()),
        billing: f64::from(cpus) + 10.0 * f64::from(gpus),
        image: Some("docker://debian:12".into()),
        requeues: run,
        usage: Some(JobUsage {
            cpu_time_ms: Some(1234),
            memory_peak: Some(1 << 30),
            samples: 3,
            ..JobUsage::default()
        }),
        record,
    }
}

fn keys(runs: &[JobRun]) -> Vec<(u64, u32)> {
    runs.iter().map(|r| (r.job_id, r.run)).collect()
}

/// Runs every case against ledgers from `fresh`.
pub(crate) fn suite(fresh: &mut dyn FnMut() -> Box<dyn Ledger>) {
    record_is_idempotent_and_lookup_lists_runs(fresh().as_mut());
    query_filters_like_acct(fresh().as_mut());
    report_adds_up_a_hand_computed_workload(fresh().as_mut());
    retention_reads_oldest_first_and_deletes_once(fresh().as_mut());
}

fn record_is_idempotent_and_lookup_lists_runs(l: &mut dyn Ledger) {
    let a0 = run(7, 0, "a", "phys", "gpu", Some(0), H, 4, 1, REQUEUED);
    let a1 = run(
        7,
        1,
        "a",
        "phys",
        "gpu",
        Some(2 * H),
        3 * H,
        4,
        1,
        "COMPLETED",
    );
    let b = run(8, 0, "b", "bio", "cpu", None, H, 1, 0, "CANCELLED");
    l.record(&[a1.clone(), a0.clone()]).unwrap();
    // A replay: the same runs again (one changed), with one new one. The first write wins.
    let mut changed = a1.clone();
    changed.state = "FAILED".into();
    l.record(&[changed, b.clone(), a0.clone()]).unwrap();
    l.record(&[]).unwrap();
    let got = l.lookup(7).unwrap();
    assert_eq!(
        got,
        vec![a0, a1.clone()],
        "every run, first first, as written"
    );
    assert_eq!(l.lookup(8).unwrap(), vec![b]);
    assert!(l.lookup(9).unwrap().is_empty());
    let all = l.query(&RunFilter::default()).unwrap();
    assert_eq!(keys(&all), [(7, 0), (7, 1), (8, 0)], "each run once");
    let last = l
        .query(&RunFilter {
            last_runs_only: true,
            ..RunFilter::default()
        })
        .unwrap();
    assert_eq!(keys(&last), [(7, 1), (8, 0)]);
    assert_eq!(last[0].usage, a1.usage);
}

fn query_filters_like_acct(l: &mut dyn Ledger) {
    l.record(&[
        run(1, 0, "a", "phys", "gpu", Some(0), H, 1, 1, "COMPLETED"),
        run(2, 0, "b", "phys", "cpu", Some(0), 2 * H, 1, 0, "FAILED"),
        run(
            3,
            0,
            "c",
            "bio",
            "cpu",
            Some(5 * H),
            6 * H,
            1,
            0,
            "COMPLETED",
        ),
        run(4, 0, "a", "bio", "gpu", None, 3 * H, 1, 0, "CANCELLED"),
        run(5, 0, "a", "ml", "gpu", Some(H), 2 * H, 1, 1, "TIMEOUT"),
    ])
    .unwrap();
    // Array 10's three tasks, of a user and a window the other filters leave out.
    let tasks: Vec<JobRun> = (0..3)
        .map(|t| JobRun {
            array_job_id: Some(10),
            array_task_id: Some(t),
            ..run(
                10 + u64::from(t),
                0,
                "g",
                "ml",
                "cpu",
                Some(0),
                H,
                1,
                0,
                "COMPLETED",
            )
        })
        .collect();
    l.record(&tasks).unwrap();
    let q = |f: RunFilter| keys(&l.query(&f).unwrap());
    let ids = |v: Vec<(u64, u32)>| v.into_iter().map(|k| k.0).collect::<Vec<_>>();
    assert_eq!(
        ids(q(RunFilter {
            uid: Some(1000),
            ..RunFilter::default()
        })),
        [1, 4, 5]
    );
    assert_eq!(
        ids(q(RunFilter {
            users: vec!["b".into(), "c".into()],
            ..RunFilter::default()
        })),
        [2, 3]
    );
    assert_eq!(
        ids(q(RunFilter {
            accounts: vec!["bio".into()],
            ..RunFilter::default()
        })),
        [3, 4]
    );
    assert_eq!(
        ids(q(RunFilter {
            partitions: vec!["gpu".into()],
            states: vec!["COMPLETED".into(), "TIMEOUT".into()],
            ..RunFilter::default()
        })),
        [1, 5]
    );
    assert_eq!(
        ids(q(RunFilter {
            jobs: vec![(5, None), (2, None), (99, None)],
            ..RunFilter::default()
        })),
        [2, 5]
    );
    // An array's id names each of its tasks; `ID_TASK` one of them.
    let jobs = |jobs: &[(u64, Option<u32>)]| {
        ids(q(RunFilter {
            jobs: jobs.to_vec(),
            ..RunFilter::default()
        }))
    };
    assert_eq!(jobs(&[(10, None)]), [10, 11, 12]);
    assert_eq!(jobs(&[(10, Some(1))]), [11]);
    assert_eq!(jobs(&[(12, None), (10, Some(0)), (1, None)]), [1, 10, 12]);
    assert!(jobs(&[(11, Some(0)), (10, Some(7))]).is_empty());
    // The window: runs that had not ended by its start (an end at the start counts).
    assert_eq!(
        ids(q(RunFilter {
            since: T0 + 2 * H,
            ..RunFilter::default()
        })),
        [2, 3, 4, 5]
    );
    assert!(q(RunFilter {
        until: T0 - 1,
        ..RunFilter::default()
    })
    .is_empty());
    assert_eq!(
        ids(q(RunFilter {
            limit: 2,
            ..RunFilter::default()
        })),
        [1, 2]
    );
}

/// Three accounts, seven users; hand-computed in the comments, over [T0 + 1 h, T0 + 9 h).
fn report_adds_up_a_hand_computed_workload(l: &mut dyn Ledger) {
    l.record(&[
        // 2 h inside: 8 CPU-h, 4 GPU-h; billing (4 + 20) per s × 7200 s.
        run(1, 0, "a", "phys", "gpu", Some(H), 3 * H, 4, 2, "COMPLETED"),
        // Starts before the window: 1 h of its 2 inside: 2 CPU-h.
        run(2, 0, "b", "phys", "cpu", Some(0), 2 * H, 2, 0, "COMPLETED"),
        // A requeued run and its second run: both count, 1 h each with 8 GPUs: 16 GPU-h.
        run(3, 0, "c", "ml", "gpu", Some(2 * H), 3 * H, 1, 8, REQUEUED),
        run(
            3,
            1,
            "c",
            "ml",
            "gpu",
            Some(4 * H),
            5 * H,
            1,
            8,
            "COMPLETED",
        ),
        // An array's two tasks: 3 h × 1 CPU each, cut at the window's end for the second.
        run(
            4,
            0,
            "d",
            "bio",
            "cpu",
            Some(3 * H),
            6 * H,
            1,
            0,
            "COMPLETED",
        ),
        run(
            5,
            0,
            "e",
            "bio",
            "cpu",
            Some(7 * H),
            10 * H,
            1,
            0,
            "COMPLETED",
        ),
        // Never started, ended before, started after: none of it.
        run(6, 0, "f", "bio", "cpu", None, 4 * H, 64, 0, "CANCELLED"),
        run(7, 0, "g", "ml", "gpu", Some(0), H / 2, 8, 8, "COMPLETED"),
        run(
            8,
            0,
            "g",
            "ml",
            "gpu",
            Some(9 * H),
            10 * H,
            8,
            8,
            "COMPLETED",
        ),
        // A run of no length inside the window counts once, for nothing.
        run(9, 0, "g", "ml", "gpu", Some(8 * H), 8 * H, 8, 8, "FAILED"),
    ])
    .unwrap();
    let groups = l.report(T0 + H, T0 + 9 * H, None).unwrap();
    let got: BTreeMap<(String, String), (u64, u64, u64)> = groups
        .iter()
        .map(|g| {
            (
                (g.account.clone(), g.user.clone()),
                (g.runs, g.cpu_ms / H, g.gpu_ms / H),
            )
        })
        .collect();
    let want: BTreeMap<(String, String), (u64, u64, u64)> = [
        (("bio", "d"), (1, 3, 0)),
        (("bio", "e"), (1, 2, 0)),
        (("ml", "c"), (2, 2, 16)),
        (("ml", "g"), (1, 0, 0)),
        (("phys", "a"), (1, 8, 4)),
        (("phys", "b"), (1, 2, 0)),
    ]
    .into_iter()
    .map(|((a, u), v)| ((a.to_string(), u.to_string()), v))
    .collect();
    assert_eq!(got, want);
    let a = groups.iter().find(|g| g.user == "a").unwrap();
    assert!((a.billing - 24.0 * 7200.0).abs() < 1e-6, "{}", a.billing);
    let order: Vec<&str> = groups.iter().map(|g| g.user.as_str()).collect();
    assert_eq!(order, ["d", "e", "c", "g", "a", "b"], "by account, user");
    let mine = l.report(T0 + H, T0 + 9 * H, Some(1000)).unwrap();
    assert_eq!(mine.len(), 1);
    assert_eq!((mine[0].user.as_str(), mine[0].cpu_ms), ("a", 8 * H));
    assert!(l.report(T0 + 20 * H, T0 + 21 * H, None).unwrap().is_empty());
}

fn retention_reads_oldest_first_and_deletes_once(l: &mut dyn Ledger) {
    l.record(&[
        run(1, 0, "a", "phys", "cpu", Some(0), 5 * H, 1, 0, "COMPLETED"),
        run(2, 0, "a", "phys", "cpu", Some(0), H, 1, 0, "COMPLETED"),
        run(2, 1, "a", "phys", "cpu", Some(0), 2 * H, 1, 0, "COMPLETED"),
        run(3, 0, "a", "phys", "cpu", Some(0), 9 * H, 1, 0, "COMPLETED"),
    ])
    .unwrap();
    // Fair share replays the latest ends first.
    assert_eq!(
        keys(&l.last_ended(10).unwrap()),
        [(3, 0), (1, 0), (2, 1), (2, 0)]
    );
    assert_eq!(keys(&l.last_ended(2).unwrap()), [(3, 0), (1, 0)]);
    let old = l.ended_before(T0 + 6 * H, 10).unwrap();
    assert_eq!(keys(&old), [(2, 0), (2, 1), (1, 0)]);
    assert_eq!(
        keys(&l.ended_before(T0 + 6 * H, 2).unwrap()),
        [(2, 0), (2, 1)]
    );
    assert_eq!(l.delete(&keys(&old)).unwrap(), 3);
    assert_eq!(
        l.delete(&keys(&old)).unwrap(),
        0,
        "deleting again finds none"
    );
    assert_eq!(keys(&l.query(&RunFilter::default()).unwrap()), [(3, 0)]);
}

#[test]
fn sqlite_passes_the_ledger_suite() {
    let dir = tempfile::tempdir().unwrap();
    let mut n = 0;
    suite(&mut || {
        n += 1;
        Box::new(SqliteLedger::open(&dir.path().join(format!("l{n}.db"))).unwrap())
    });
}

#[test]
fn postgres_passes_the_ledger_suite() {
    let Some(mut server) = PgServer::start() else {
        return;
    };
    let spool = server.scratch().join("unused.spool");
    suite(&mut || {
        let settings = server.database();
        Box::new(PgLedger::open(&settings, Some((spool.clone(), Duration::from_secs(1)))).unwrap())
    });
}
