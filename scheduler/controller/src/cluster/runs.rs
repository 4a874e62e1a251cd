//! The cluster's side of the ledger: which rows an ended run makes, where they are written
//! (with the job's final state in one SQLite transaction, or after it to PostgreSQL), and
//! the one-time fill of a new ledger from the jobs that ended before it existed.

use wharf_api::JobRecord;

use super::{Cluster, Failure};
use crate::ledger::{JobRun, LedgerError};
use crate::store::StoreError;

/// Ended jobs read per batch when a ledger is filled.
const FILL_BATCH: u32 = 5_000;

impl Cluster {
    /// Copies every ended job in the jobs table into the ledger, once per engine: rows already
    /// there are kept (the idempotent key), so an interrupted fill is simply run again.
    pub(super) fn fill_ledger(&mut self, engine: &str) -> Result<(), LedgerError> {
        let key = format!("ledger_filled:{engine}");
        let db = |e: StoreError| LedgerError::Database(e.to_string());
        if self.store.meta(&key).map_err(db)?.is_some() {
            return Ok(());
        }
        let (mut after, mut filled) = (0, 0usize);
        loop {
            let batch = self.store.ended_after(after, FILL_BATCH).map_err(db)?;
            let Some(last) = batch.last() else { break };
            after = last.id;
            let runs: Vec<JobRun> = batch
                .iter()
                .filter_map(|j| self.run_of(j, j.state.as_str()))
                .collect();
            filled += runs.len();
            self.ledger.record(&runs)?;
        }
        self.store.set_meta(&key, "1").map_err(db)?;
        if filled > 0 {
            tracing::info!(
                runs = filled,
                engine,
                "accounting ledger filled from ended jobs"
            );
        }
        Ok(())
    }

    /// Records the runs a crash (or a failed write) left in the state store's outbox: their
    /// jobs' final states were committed, but the runs may not have reached the ledger or its
    /// spool. Recording is idempotent (job id and run), so runs that did arrive are kept as
    /// they were. Returns how many runs were in the outbox.
    pub(super) fn reconcile_ledger(&mut self) -> Result<usize, LedgerError> {
        let db = |e: StoreError| LedgerError::Database(e.to_string());
        let runs = self.store.outbox().map_err(db)?;
        if runs.is_empty() {
            return Ok(0);
        }
        self.ledger.record(&runs)?;
        let keys: Vec<_> = runs.iter().map(|r| (r.job_id, r.run)).collect();
        self.store.clear_outbox(&keys).map_err(db)?;
        tracing::info!(
            runs = runs.len(),
            "accounting: runs whose jobs ended just before the controller stopped recorded"
        );
        Ok(runs.len())
    }

    /// The billing weights the ledger and `wharf report` charge a run in `partition` at: those
    /// of the partition named, none for a job that names no partition or one not configured.
    pub(super) fn run_billing(&self, partition: &str) -> wharf_core::Billing {
        // The weights fair share charges with, so reports and priorities agree.
        self.sched.billing_for(Some(partition))
    }

    /// The partition `job` runs (or ran, or waits) in: the one it named, else the default.
    pub(super) fn partition_name(&self, job: &JobRecord) -> String {
        super::sched::partition(job)
            .unwrap_or_else(|| self.sched.default_partition_name().to_string())
    }

    /// The ledger row of `job`'s run as it stands, ended as `state`; `None` while it has no
    /// end.
    pub(super) fn run_of(&self, job: &JobRecord, state: &str) -> Option<JobRun> {
        let end = job.end_time?;
        // The run's steps end with it: a requeued job goes on with them open in its own
        // record until it commits, and the row keeps the run as it ended.
        let mut record = job.clone();
        super::steps::close(&mut record, end);
        let spec = job.spec.as_ref();
        let partition = self.partition_name(job);
        let billing = self.run_billing(&partition);
        let r = job.resources;
        let started = job.start_time.is_some();
        // Resources are per node; a run holds them on each of its nodes.
        let n = job.node_count().max(1);
        let (cpus, memory, gpus) = (r.cpus * n, r.memory * u64::from(n), r.gpus * n);
        Some(JobRun {
            job_id: job.id,
            run: job.restarts,
            array_job_id: job.array.as_ref().map(|a| a.job_id),
            array_task_id: job.array.as_ref().map(|a| a.task_id),
            uid: job.owner.uid,
            user: job.owner.user.clone(),
            account: self.assoc(job).account,
            partition,
            qos: self.qos_of(spec),
            nodes: if started {
                job.nodelist()
            } else {
                String::new()
            },
            node_count: if started { n } else { 0 },
            submit_time: job.submit_time,
            eligible_time: job.begin_time.unwrap_or(0).max(job.submit_time),
            start_time: job.start_time,
            end_time: end.max(job.start_time.unwrap_or(0)),
            state: state.to_string(),
            exit_code: job.exit.as_ref().and_then(|e| e.code),
            exit_signal: job.exit.as_ref().and_then(|e| e.signal),
            cpus,
            memory,
            gpus,
            gpu_type: spec.and_then(|s| s.gpu_type.clone()),
            billing: billing.rate(cpus.into(), memory, gpus.into()),
            image: spec.map(|s| s.image.clone()),
            requeues: job.restarts,
            usage: job.exit.as_ref().and_then(|e| e.usage.clone()),
            record,
        })
    }

    /// Stores `changed` and the runs that ended with them: in one transaction when the ledger
    /// is the state database's table, else the jobs first and then the ledger (which spools
    /// what it cannot write; a failure there is logged, the jobs' states stand).
    pub(super) fn store_with_runs(&mut self, changed: &[JobRecord]) -> Result<(), Failure> {
        let mut runs = std::mem::take(&mut self.requeued_runs);
        runs.extend(
            changed
                .iter()
                .filter(|j| j.state.is_terminal())
                .filter_map(|j| self.run_of(j, j.state.as_str())),
        );
        if self.ledger_in_store {
            self.store.update_jobs_with_runs(changed, &runs)?;
        } else if runs.is_empty() {
            self.store.update_jobs(changed)?;
        } else {
            // The runs wait in the state store's outbox, committed with the jobs, until the
            // ledger (or its spool) has them; what a crash leaves there is recorded at start.
            self.store.update_jobs_with_outbox(changed, &runs)?;
            match self.ledger.record(&runs) {
                Ok(()) => {
                    let keys: Vec<_> = runs.iter().map(|r| (r.job_id, r.run)).collect();
                    if let Err(e) = self.store.clear_outbox(&keys) {
                        // Harmless: recorded again (idempotently) at the next start.
                        tracing::warn!(error = %e, "accounting outbox not cleared");
                    }
                }
                Err(e) => {
                    let ids: Vec<_> = runs.iter().map(|r| r.job_id).collect();
                    tracing::error!(
                        error = %e,
                        jobs = ?ids,
                        "accounting records not written; kept in the outbox for the next start"
                    );
                }
            }
        }
        self.budget_runs_ended(&runs);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use wharf_api::wire::{AcctQuery, AgentJob, PollRequest};
    use wharf_api::{ExitInfo, JobId, JobRequest, JobState};

    use wharf_api::{JobDefaults, NodeInfo};

    use crate::cluster::sched::tests::{caller, cluster, cluster_with, record, submit_job};
    use crate::cluster::Cluster;
    use crate::ledger::pg_server::PgServer;
    use crate::ledger::postgres::PgLedger;
    use crate::ledger::{
        sqlite::SqliteLedger, Ledger, LedgerError, RunFilter, UsageGroup, REQUEUED,
    };
    use crate::store::Store;

    /// n1's agent reports `id` started at `start`, and ended at `end` with `exit` if given.
    fn agent(c: &mut Cluster, id: JobId, start: u64, end: Option<(u64, ExitInfo)>, now: u64) {
        let jobs = vec![AgentJob {
            id,
            start_time: Some(start),
            end_time: end.as_ref().map(|e| e.0),
            exit: end.map(|e| e.1),
            stopping: false,
            ready: false,
            time_limit: None,
        }];
        let poll = PollRequest {
            seq: None,
            node: "n1".into(),
            jobs,
            ..Default::default()
        };
        c.ingest(&poll, now).unwrap();
    }

    /// Ann's 2-CPU job, started at 1 s and requeued (its run stopped at 5 s); it waits again.
    fn requeued_job(c: &mut Cluster, ann: &crate::cluster::Caller) -> JobId {
        let id = running_job(c, ann);
        c.requeue(ann, id).unwrap();
        stopped_at(c, id, 5_000);
        id
    }

    /// Ann's 2-CPU job, running on n1 since 1 s.
    fn running_job(c: &mut Cluster, ann: &crate::cluster::Caller) -> JobId {
        let two_cpus = JobRequest {
            cpus: Some(2),
            ..Default::default()
        };
        let id = submit_job(c, ann, two_cpus, 10).unwrap();
        c.schedule(1_000).unwrap();
        agent(c, id, 1_000, None, 1_500);
        id
    }

    /// n1's agent reports job `id`'s run stopped at `at`, as a stop order stops it.
    fn stopped_at(c: &mut Cluster, id: JobId, at: u64) {
        let stopped = ExitInfo {
            signal: Some(15),
            cancelled: true,
            ..Default::default()
        };
        agent(c, id, 1_000, Some((at, stopped)), at);
    }

    /// n1 lets go of job `id`'s first run; the second starts at 7 s and completes at 9 s.
    fn second_run_completes(c: &mut Cluster, id: JobId) {
        c.ingest(
            &PollRequest {
                seq: None,
                node: "n1".into(),
                jobs: vec![],
                ..Default::default()
            },
            6_000,
        )
        .unwrap();
        c.schedule(7_000).unwrap();
        agent(c, id, 7_000, None, 7_500);
        let done = ExitInfo {
            code: Some(0),
            ..Default::default()
        };
        agent(c, id, 7_000, Some((9_000, done)), 9_000);
    }

    #[test]
    fn a_requeued_run_and_the_last_run_are_each_a_row_written_with_the_jobs_state() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = cluster(&dir);
        let ann = caller(1000, "ann");
        let id = requeued_job(&mut c, &ann);
        assert_eq!(record(&c, id).state, JobState::Pending);
        let runs = c.ledger.lookup(id).unwrap();
        assert_eq!(runs.len(), 1);
        assert_eq!(
            (
                runs[0].run,
                runs[0].state.as_str(),
                runs[0].start_time,
                runs[0].end_time
            ),
            (0, REQUEUED, Some(1_000), 5_000)
        );
        second_run_completes(&mut c, id);
        // Read through a connection of its own: committed, with the job's final state.
        let other = SqliteLedger::open(&dir.path().join("wharf.db")).unwrap();
        let runs = other.lookup(id).unwrap();
        let got: Vec<(u32, &str)> = runs.iter().map(|r| (r.run, r.state.as_str())).collect();
        assert_eq!(got, [(0, REQUEUED), (1, "COMPLETED")]);
        assert_eq!(runs[1].record.state, JobState::Completed);
        assert_eq!(c.store.job(id).unwrap().unwrap().state, JobState::Completed);
        // acct shows the job once, as it ended; the report counts both runs.
        let q = AcctQuery {
            since: Some(0),
            ..AcctQuery::default()
        };
        let rows = c.acct(&ann, &q, 10_000).unwrap();
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].state, JobState::Completed);
        // With --duplicates, every run, the earlier first, each as it ended.
        let q = AcctQuery {
            duplicates: true,
            ..q
        };
        let rows = c.acct(&ann, &q, 10_000).unwrap();
        let runs: Vec<(JobId, u32, Option<u64>)> = rows
            .iter()
            .map(|r| (r.id, r.restarts, r.end_time))
            .collect();
        assert_eq!(runs, [(id, 0, Some(5_000)), (id, 1, Some(9_000))]);
        // The earlier run says it ended in a requeue; the last does not.
        let requeued: Vec<bool> = (rows.iter())
            .map(|r| r.stop.as_ref().is_some_and(|s| s.requeues()))
            .collect();
        assert_eq!(requeued, [true, false]);
        // Each row names the partition and QoS it ran in, named or not.
        assert!(rows
            .iter()
            .all(|r| r.spec.as_ref().unwrap().partition.is_some()));
        // REQUEUED (or RQ) picks the requeued runs alone, whatever --duplicates says.
        for name in ["REQUEUED", "rq"] {
            let q = AcctQuery {
                states: Some(name.into()),
                duplicates: false,
                ..q.clone()
            };
            let rows = c.acct(&ann, &q, 10_000).unwrap();
            let got: Vec<(JobId, u32)> = rows.iter().map(|r| (r.id, r.restarts)).collect();
            assert_eq!(got, [(id, 0)], "{name}");
        }
        let q = AcctQuery {
            states: Some("REQUEUED,COMPLETED".into()),
            ..q.clone()
        };
        assert_eq!(c.acct(&ann, &q, 10_000).unwrap().len(), 2);
        let r = c.report(&ann, 0, 10_000, 10_000).unwrap();
        assert_eq!(r.total.jobs, 2);
        assert!((r.total.cpu_hours - 2.0 * 6_000.0 / 3_600_000.0).abs() < 1e-12);
    }

    #[test]
    fn a_requeue_a_cancel_overtook_is_not_shown_as_one() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = cluster(&dir);
        let ann = caller(1000, "ann");
        let id = running_job(&mut c, &ann);
        c.requeue(&ann, id).unwrap();
        c.cancel(&ann, id, 2_000).unwrap();
        stopped_at(&mut c, id, 3_000);
        let q = AcctQuery {
            since: Some(0),
            duplicates: true,
            ..AcctQuery::default()
        };
        let rows = c.acct(&ann, &q, 10_000).unwrap();
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].state, JobState::Cancelled);
        assert_eq!(rows[0].stop, None, "the requeue did not happen");
        // Nor does the record the ledger keeps, nor the job's.
        assert_eq!(c.ledger.lookup(id).unwrap()[0].record.stop, None);
        assert_eq!(c.store.job(id).unwrap().unwrap().stop, None);
    }

    #[test]
    fn a_requeued_runs_row_ends_the_steps_still_open_when_it_stopped() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = cluster(&dir);
        let ann = caller(1000, "ann");
        let id = running_job(&mut c, &ann);
        let ask = crate::cluster::steps::tests::ask(id, "n1", 1000, Default::default());
        c.start_step(ask, 2_000)
            .map(crate::cluster::steps::tests::started)
            .unwrap();
        c.requeue(&ann, id).unwrap();
        // The job's end is reported before its step's: the run ends with the step open.
        stopped_at(&mut c, id, 5_000);
        let runs = c.ledger.lookup(id).unwrap();
        assert_eq!(runs[0].state, REQUEUED);
        let steps = &runs[0].record.steps;
        assert_eq!(steps.len(), 1);
        assert_eq!(steps[0].end_time, Some(5_000), "{steps:?}");
        assert_eq!(steps[0].state(), JobState::Cancelled);
        // The job waits again with no step: the next run's steps start afresh.
        assert!(record(&c, id).steps.is_empty());
    }

    #[test]
    fn jobs_that_ended_before_the_ledger_fill_it_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("wharf.db");
        let mut store = crate::store::Store::open(&path).unwrap();
        let mut j = crate::store::tests::record();
        store.insert_job(&mut j, None).unwrap();
        j.state = JobState::Failed;
        j.start_time = Some(100);
        j.end_time = Some(200);
        store.update_jobs([&j]).unwrap();
        let c = Cluster::load(store, Default::default(), 60_000, 0).unwrap();
        let runs = c.ledger.lookup(j.id).unwrap();
        assert_eq!(runs.len(), 1);
        assert_eq!((runs[0].state.as_str(), runs[0].end_time), ("FAILED", 200));
        drop(c);
        // Filled once: a run deleted since (by retention) does not come back at the next start.
        SqliteLedger::open(&path)
            .unwrap()
            .delete(&[(j.id, 0)])
            .unwrap();
        let c = Cluster::load(
            crate::store::Store::open(&path).unwrap(),
            Default::default(),
            60_000,
            0,
        )
        .unwrap();
        assert!(c.ledger.lookup(j.id).unwrap().is_empty());
    }

    #[test]
    fn a_run_that_named_no_partition_is_recorded_and_billed_in_the_default_one() {
        let dir = tempfile::tempdir().unwrap();
        let mut config = wharf_core::Config::default();
        let mut cpu = wharf_core::Partition::new("cpu", &[]);
        cpu.billing.cpu = 1.0;
        let mut gpu = wharf_core::Partition::new("gpu", &[]);
        gpu.billing.cpu = 3.0;
        config.partitions = vec![cpu, gpu];
        config.default_partition = Some("gpu".into());
        let mut c = cluster_with(&dir, config);
        let ann = caller(1000, "ann");
        let one_cpu = JobRequest {
            cpus: Some(1),
            ..Default::default()
        };
        let id = submit_job(&mut c, &ann, one_cpu, 10).unwrap();
        c.schedule(1_000).unwrap();
        let done = ExitInfo {
            code: Some(0),
            ..Default::default()
        };
        agent(&mut c, id, 1_000, Some((2_000, done)), 2_000);
        let runs = c.ledger.lookup(id).unwrap();
        assert_eq!(runs.len(), 1);
        assert_eq!(runs[0].partition, "gpu");
        assert!((runs[0].billing - 3.0).abs() < 1e-9, "{}", runs[0].billing);
    }

    #[test]
    fn fair_share_after_a_restart_is_replayed_from_the_ledger_requeued_runs_included() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = cluster(&dir);
        let ann = caller(1000, "ann");
        let id = requeued_job(&mut c, &ann);
        second_run_completes(&mut c, id);
        let before = c.usage.snapshot(10_000);
        drop(c);
        // Both runs count: 2 CPUs for 4 s, then for 2 s (decayed a little since).
        let used: f64 = before.values().sum();
        assert!((used - 12.0).abs() < 1e-3, "{before:?}");
        let after = cluster(&dir).usage.snapshot(10_000);
        assert_eq!(
            after.keys().collect::<Vec<_>>(),
            before.keys().collect::<Vec<_>>()
        );
        for (assoc, u) in &after {
            assert!(
                (u - before[assoc]).abs() < 1e-9,
                "{assoc:?}: {u} after, {before:?} before"
            );
        }
    }

    /// The PostgreSQL ledger as a controller that crashes right after committing a job's
    /// final state sees it: the run never reaches the database nor the spool.
    #[derive(Debug)]
    struct CrashBeforeRecord(crate::ledger::postgres::PgLedger);

    impl Ledger for CrashBeforeRecord {
        fn record(&mut self, _: &[crate::ledger::JobRun]) -> Result<(), LedgerError> {
            Err(LedgerError::Database("the controller stopped here".into()))
        }
        fn lookup(&self, id: JobId) -> Result<Vec<crate::ledger::JobRun>, LedgerError> {
            self.0.lookup(id)
        }
        fn query(&self, f: &RunFilter) -> Result<Vec<crate::ledger::JobRun>, LedgerError> {
            self.0.query(f)
        }
        fn report(&self, s: u64, u: u64, uid: Option<u32>) -> Result<Vec<UsageGroup>, LedgerError> {
            self.0.report(s, u, uid)
        }
        fn ended_before(&self, c: u64, l: u32) -> Result<Vec<crate::ledger::JobRun>, LedgerError> {
            self.0.ended_before(c, l)
        }
        fn last_ended(&self, l: u32) -> Result<Vec<crate::ledger::JobRun>, LedgerError> {
            self.0.last_ended(l)
        }
        fn delete(&mut self, keys: &[(JobId, u32)]) -> Result<usize, LedgerError> {
            self.0.delete(keys)
        }
    }

    fn pg_cluster(dir: &tempfile::TempDir, ledger: Box<dyn Ledger>) -> Cluster {
        let store = Store::open(&dir.path().join("wharf.db")).unwrap();
        let mut c = Cluster::load_with_ledger(
            store,
            JobDefaults::default(),
            60_000,
            0,
            wharf_core::Config::default(),
            Some((ledger, "postgres")),
        )
        .unwrap();
        c.register(NodeInfo::new("n1", "127.0.0.1", 8, 16 << 30, vec![]), 0)
            .unwrap();
        c
    }

    #[test]
    fn a_run_lost_between_the_jobs_commit_and_postgres_is_recorded_at_the_next_start() {
        let Some(mut server) = PgServer::start() else {
            return;
        };
        let settings = server.database();
        let spool = server.scratch().join("ledger.spool");
        let every = std::time::Duration::from_millis(200);
        let dir = tempfile::tempdir().unwrap();
        let crashing = CrashBeforeRecord(PgLedger::open(&settings, None).unwrap());
        let mut c = pg_cluster(&dir, Box::new(crashing));
        let ann = caller(1000, "ann");
        let requeued = requeued_job(&mut c, &ann);
        second_run_completes(&mut c, requeued);
        assert_eq!(record_state(&dir, requeued), Some(JobState::Completed));
        drop(c);
        let pg = PgLedger::open(&settings, None).unwrap();
        assert!(
            pg.lookup(requeued).unwrap().is_empty(),
            "nothing reached it"
        );
        assert_eq!(
            Store::open(&dir.path().join("wharf.db"))
                .unwrap()
                .outbox()
                .unwrap()
                .len(),
            2
        );

        // The next start records both runs, once, and empties the outbox.
        for _ in 0..2 {
            let ledger = PgLedger::open(&settings, Some((spool.clone(), every))).unwrap();
            drop(pg_cluster(&dir, Box::new(ledger)));
            let runs = pg.lookup(requeued).unwrap();
            let states: Vec<&str> = runs.iter().map(|r| r.state.as_str()).collect();
            assert_eq!(states, [REQUEUED, "COMPLETED"]);
            assert_eq!(runs[1].end_time, 9_000);
            let store = Store::open(&dir.path().join("wharf.db")).unwrap();
            assert!(store.outbox().unwrap().is_empty());
        }

        // With a ledger that takes the rows, nothing stays in the outbox.
        let ledger = PgLedger::open(&settings, Some((spool.clone(), every))).unwrap();
        let mut c = pg_cluster(&dir, Box::new(ledger));
        let next = requeued_job(&mut c, &ann);
        second_run_completes(&mut c, next);
        assert_eq!(pg.lookup(next).unwrap().len(), 2);
        let store = Store::open(&dir.path().join("wharf.db")).unwrap();
        assert!(store.outbox().unwrap().is_empty());
    }

    fn record_state(dir: &tempfile::TempDir, id: JobId) -> Option<JobState> {
        let store = Store::open(&dir.path().join("wharf.db")).unwrap();
        store.job(id).unwrap().map(|j| j.state)
    }
}
