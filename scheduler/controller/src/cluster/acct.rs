//! Accounting queries (`wharf acct`, Slurm's `sacct`): jobs, ended or not, that were in the
//! system during a time window, filtered by user, account, partition and state. Ended jobs
//! come from the ledger (its last run of each), active ones from memory; `wharf report` adds
//! up the ledger's runs and the runs still going.

use wharf_api::wire::{AcctQuery, ErrorKind};
use wharf_api::{JobId, JobRecord, JobState};

use crate::ledger::{LedgerError, RunFilter, REQUEUED};

use super::{Caller, Cluster, Failure};
use crate::visibility::view;

/// Most jobs one query returns.
pub const MAX_ROWS: u32 = 100_000;

impl Cluster {
    /// The jobs `q` asks for that `caller` may see (their own, or every user's for an admin),
    /// oldest first, each with the account it is charged to filled in.
    pub fn acct(
        &self,
        caller: &Caller,
        q: &AcctQuery,
        now: u64,
    ) -> Result<Vec<JobRecord>, Failure> {
        let list = |text: &Option<String>| -> Vec<String> {
            text.as_deref()
                .unwrap_or("")
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_string)
                .collect()
        };
        let jobs = list(&q.jobs)
            .iter()
            .map(|s| {
                wharf_api::job::parse_job_ref(s).ok_or_else(|| {
                    Failure::new(
                        ErrorKind::InvalidInput,
                        format!(
                            "{s:?} is not a job id: write ID (a job, or every task of an array) \
                             or ARRAYID_TASKID (one task)"
                        ),
                    )
                })
            })
            .collect::<Result<Vec<(JobId, Option<u32>)>, Failure>>()?;
        // A run that ended in a requeue is REQUEUED (sacct's RQ): only an earlier run of a job
        // is, so asking for it shows every run, as --duplicates does.
        let mut requeued = false;
        let states = list(&q.states)
            .iter()
            .filter(|s| {
                let rq = s.eq_ignore_ascii_case(REQUEUED) || s.eq_ignore_ascii_case("RQ");
                requeued |= rq;
                !rq
            })
            .map(|s| {
                JobState::parse(s).ok_or_else(|| {
                    let names: Vec<&str> = JobState::ALL.iter().map(|s| s.as_str()).collect();
                    Failure::new(
                        ErrorKind::InvalidInput,
                        format!(
                            "unknown state {s:?}; states are {}, {REQUEUED}",
                            names.join(", ")
                        ),
                    )
                })
            })
            .collect::<Result<Vec<JobState>, Failure>>()?;
        let users = list(&q.users);
        let (accounts, partitions) = (list(&q.accounts), list(&q.partitions));
        // An admin who names jobs sees them whoever's they are, as root's sacct -j does.
        let uid = match (
            caller.admin,
            users.is_empty() && !q.all_users && jobs.is_empty(),
        ) {
            (false, _) => {
                if users.iter().any(|u| *u != caller.owner.user) {
                    return Err(Failure::new(
                        ErrorKind::PermissionDenied,
                        "you may see only your own jobs' records; an admin sees anyone's",
                    ));
                }
                Some(caller.owner.uid)
            }
            (true, true) => Some(caller.owner.uid),
            (true, false) => None,
        };
        let until = q.until.unwrap_or(u64::MAX / 2).min(i64::MAX as u64);
        // Without ids or a start, the window starts at the beginning of today (UTC).
        let since = q.since.unwrap_or(if jobs.is_empty() {
            now - now % 86_400_000
        } else {
            0
        });
        if since > until {
            return Err(Failure::new(
                ErrorKind::InvalidInput,
                "the window's start is after its end",
            ));
        }
        let filter = RunFilter {
            jobs,
            uid,
            users,
            accounts,
            partitions,
            states: (states.iter().map(|s| s.as_str().to_string()))
                .chain(requeued.then(|| REQUEUED.to_string()))
                .collect(),
            since,
            until,
            last_runs_only: !q.duplicates && !requeued,
            limit: MAX_ROWS,
        };
        // Ended jobs from the ledger; the jobs still in the system from memory.
        let ended = self.ledger.query(&filter).map_err(ledger_failure)?;
        let mut rows: Vec<JobRecord> = ended
            .into_iter()
            .map(|run| {
                let mut j = run.record;
                // A requeue asked of a run that ended otherwise first (a cancel, its own end)
                // did not happen: only a REQUEUED row carries one, as `wharf acct` reads it.
                // (Settling clears it; rows recorded before it did still hold it.)
                if run.state != REQUEUED && j.stop.as_ref().is_some_and(|s| s.requeues()) {
                    j.stop = None;
                }
                // The account, partition and QoS it ran under, named or not.
                if let Some(s) = j.spec.as_mut() {
                    s.account = Some(run.account);
                    s.partition = Some(run.partition).filter(|p| !p.is_empty());
                    s.qos = run.qos.or(s.qos.take());
                }
                j
            })
            .collect();
        rows.extend(self.jobs.values().filter_map(|j| {
            let account = self.assoc(j).account;
            let partition = self.partition_name(j);
            let wanted = j.submit_time <= until
                && j.end_time.is_none_or(|e| e >= since)
                && (filter.jobs.is_empty()
                    || filter.jobs.iter().any(|&n| {
                        let array = j.array.map(|a| (a.job_id, a.task_id));
                        wharf_api::job::job_ref_names(n, j.id, array)
                    }))
                && filter.uid.is_none_or(|u| u == j.owner.uid)
                && (filter.users.is_empty() || filter.users.contains(&j.owner.user))
                && ((states.is_empty() && !requeued) || states.contains(&j.state))
                && (filter.accounts.is_empty() || filter.accounts.contains(&account))
                && (filter.partitions.is_empty() || filter.partitions.contains(&partition));
            wanted.then(|| {
                let mut j = j.clone();
                if let Some(s) = j.spec.as_mut() {
                    s.qos = self.qos_of(Some(s));
                    s.account = Some(account);
                    s.partition = Some(partition);
                }
                j
            })
        }));
        rows.sort_by_key(|j| j.id);
        rows.truncate(MAX_ROWS as usize);
        Ok(rows.into_iter().map(|j| view(caller, j)).collect())
    }

    /// Usage over `[since, until)` (Slurm's `sreport`): every job's for an admin, the
    /// caller's own otherwise.
    pub fn report(
        &self,
        caller: &Caller,
        since: u64,
        until: u64,
        now: u64,
    ) -> Result<wharf_api::report::Report, Failure> {
        if since >= until {
            return Err(Failure::new(
                ErrorKind::InvalidInput,
                "the window's start must be before its end",
            ));
        }
        let uid = (!caller.admin).then_some(caller.owner.uid);
        // Ended runs, summed by the ledger; the runs still going, up to now.
        let mut groups = self
            .ledger
            .report(since, until, uid)
            .map_err(ledger_failure)?;
        groups.extend(
            self.jobs
                .values()
                .filter(|j| uid.is_none_or(|u| u == j.owner.uid))
                .filter_map(|j| {
                    let partition = self.partition_name(j);
                    let billing = self.run_billing(&partition);
                    wharf_api::report::Run::of(
                        j,
                        self.assoc(j).account,
                        partition,
                        [billing.cpu, billing.memory_gib, billing.gpu],
                        now,
                    )
                })
                .filter_map(|r| r.inside(since, until)),
        );
        let cpus = self.nodes.values().map(|n| u64::from(n.info.cpus)).sum();
        let gpus = self
            .nodes
            .values()
            .map(|n| u64::from(n.info.capacity().gpus))
            .sum();
        Ok(wharf_api::report::Report::of_groups(
            &groups,
            since,
            until.min(now.max(since + 1)),
            cpus,
            gpus,
        ))
    }
}

fn ledger_failure(e: LedgerError) -> Failure {
    Failure::new(e.kind(), e.to_string())
}
