//! Accounting queries (`wharf acct`, Slurm's `sacct`): jobs, ended or not, that were in the
//! system during a time window, filtered by user, account, partition and state, read from the
//! store, where every job's record is kept in the same transaction as each of its changes.

use wharf_api::wire::{AcctQuery, ErrorKind};
use wharf_api::{JobId, JobRecord, JobState};

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
        let ids = list(&q.jobs)
            .iter()
            .map(|s| {
                s.parse::<JobId>().map_err(|_| {
                    Failure::new(ErrorKind::InvalidInput, format!("{s:?} is not a job id"))
                })
            })
            .collect::<Result<Vec<JobId>, Failure>>()?;
        let states = list(&q.states)
            .iter()
            .map(|s| {
                JobState::parse(s).ok_or_else(|| {
                    let names: Vec<&str> = JobState::ALL.iter().map(|s| s.as_str()).collect();
                    Failure::new(
                        ErrorKind::InvalidInput,
                        format!("unknown state {s:?}; states are {}", names.join(", ")),
                    )
                })
            })
            .collect::<Result<Vec<JobState>, Failure>>()?;
        let users = list(&q.users);
        let (accounts, partitions) = (list(&q.accounts), list(&q.partitions));
        let uid = match (caller.admin, users.is_empty() && !q.all_users) {
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
        let since = q.since.unwrap_or(if ids.is_empty() {
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
        let ids = (!ids.is_empty()).then_some(ids.as_slice());
        let rows = self
            .store
            .jobs_in_window(uid, ids, since, until, MAX_ROWS)?;
        Ok(rows
            .into_iter()
            .filter(|j| users.is_empty() || users.contains(&j.owner.user))
            .filter(|j| states.is_empty() || states.contains(&j.state))
            .filter_map(|mut j| {
                let account = self.assoc(&j).account;
                let partition = super::sched::partition(&j)
                    .unwrap_or_else(|| wharf_core::DEFAULT_PARTITION.to_string());
                let wanted = (accounts.is_empty() || accounts.contains(&account))
                    && (partitions.is_empty() || partitions.contains(&partition));
                if let Some(s) = j.spec.as_mut() {
                    s.account = Some(account);
                }
                wanted.then(|| view(caller, j))
            })
            .collect())
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
        let jobs = self
            .store
            .jobs_in_window(uid, None, since, until, MAX_ROWS)?;
        let runs: Vec<wharf_api::report::Run> = jobs
            .iter()
            .filter_map(|j| {
                let partition = super::sched::partition(j);
                let billing = self
                    .sched
                    .partitions
                    .iter()
                    .find(|p| Some(&p.name) == partition.as_ref())
                    .map(|p| p.billing)
                    .unwrap_or_default();
                wharf_api::report::Run::of(
                    j,
                    self.assoc(j).account,
                    partition.unwrap_or_else(|| wharf_core::DEFAULT_PARTITION.to_string()),
                    [billing.cpu, billing.memory_gib, billing.gpu],
                    now,
                )
            })
            .collect();
        let cpus = self.nodes.values().map(|n| u64::from(n.info.cpus)).sum();
        let gpus = self.nodes.values().map(|n| n.info.gpus.len() as u64).sum();
        Ok(wharf_api::report::Report::of(
            &runs,
            since,
            until.min(now.max(since + 1)),
            cpus,
            gpus,
        ))
    }
}
