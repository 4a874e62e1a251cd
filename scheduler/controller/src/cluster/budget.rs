//! Account budgets (GrpTRESMins): what the runs that ended in the current budget period used,
//! per user association, for the core's limits ([`wharf_core::BudgetUsage`]).
//!
//! The sums come from one indexed query of the ledger (its usage report over the period, by
//! account, user and partition) when a period begins or budgets are first configured, and
//! are then kept up to date as runs end, so a pass reads no ledger row.

use std::collections::BTreeMap;

use wharf_core::{Assoc, BudgetUsage, TresMinutes};

use super::Cluster;
use crate::ledger::JobRun;

/// The current period's sums.
#[derive(Debug, Default)]
pub(super) struct Budgets {
    /// The period (start, reset) the sums are for; `None` until they are read.
    period: Option<(u64, Option<u64>)>,
    /// TRES-minutes used inside the period by runs that ended in it.
    used: BTreeMap<Assoc, TresMinutes>,
}

impl Budgets {
    /// Adds the part of `run` inside the period.
    fn add(&mut self, run: &JobRun) {
        let (Some((since, _)), Some(start)) = (self.period, run.start_time) else {
            return;
        };
        let ms = run.end_time.saturating_sub(start.max(since));
        if ms == 0 {
            return;
        }
        let m = TresMinutes::held(run.cpus.into(), run.gpus.into(), run.billing, ms);
        self.used
            .entry(Assoc::new(&run.account, &run.user))
            .or_default()
            .add(&m);
    }
}

impl Cluster {
    /// The budget inputs of a pass at `now`: the period that holds it and what ended runs
    /// used in it. Empty while no budget is configured. The period's sums are read from the
    /// ledger when it begins; a ledger that cannot be read is logged and tried again at the
    /// next pass (until then only running jobs count).
    pub(super) fn budget_usage(&mut self, now: u64) -> BudgetUsage {
        if !self.sched.limits.has_budgets() {
            self.budgets = Budgets::default();
            return BudgetUsage::default();
        }
        let (since, resets) = self.sched.budget_period.bounds(now);
        if self.budgets.period != Some((since, resets)) {
            match self.ledger.report(since, i64::MAX as u64, None) {
                Ok(groups) => {
                    let mut used: BTreeMap<Assoc, TresMinutes> = BTreeMap::new();
                    for g in groups {
                        let m = TresMinutes {
                            cpu: g.cpu_ms as f64 / 60_000.0,
                            gpu: g.gpu_ms as f64 / 60_000.0,
                            billing: g.billing / 60.0,
                        };
                        used.entry(Assoc::new(&g.account, &g.user))
                            .or_default()
                            .add(&m);
                    }
                    tracing::info!(
                        since,
                        associations = used.len(),
                        "budgets: usage of the period read from the accounting ledger"
                    );
                    self.budgets = Budgets {
                        period: Some((since, resets)),
                        used,
                    };
                }
                Err(e) => {
                    tracing::warn!(
                        "budgets: the accounting ledger cannot be read ({e}); only running \
                         jobs count against budgets until it can"
                    );
                    self.budgets = Budgets::default();
                }
            }
        }
        BudgetUsage {
            since,
            resets,
            used: self.budgets.used.clone(),
        }
    }

    /// Counts runs that just ended (written to the ledger) against their budgets.
    pub(super) fn budget_runs_ended(&mut self, runs: &[JobRun]) {
        for run in runs {
            self.budgets.add(run);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use wharf_api::admin::{AdminAction, AdminChange, AdminKind};
    use wharf_api::wire::{AgentJob, PollRequest};
    use wharf_api::{ExitInfo, JobDefaults, JobId, JobRequest, JobState};

    use crate::cluster::sched::tests::{caller, cluster_with, record, submit_job};
    use crate::cluster::{Caller, Cluster};
    use crate::ledger::{sqlite::SqliteLedger, Ledger};
    use crate::store::Store;

    const MIN: u64 = 60_000;
    /// 2026-11-10 00:00 UTC.
    const T0: u64 = 1_794_268_800_000;
    /// 2026-12-01 00:00 UTC: the monthly budget resets.
    const DEC: u64 = 1_796_083_200_000;

    fn config() -> wharf_core::Config {
        let mut c = wharf_core::Config::default();
        c.accounts.push(wharf_core::Account {
            name: "lab".into(),
            parent: None,
            shares: 1,
        });
        c.users.push(wharf_core::UserShares {
            user: "ann".into(),
            account: "lab".into(),
            shares: 1,
        });
        c
    }

    fn root() -> Caller {
        let mut c = caller(0, "root");
        c.admin = true;
        c
    }

    fn set_budget(c: &mut Cluster, value: &str) -> Result<(), String> {
        let change = AdminChange {
            kind: AdminKind::Account,
            action: AdminAction::Modify,
            name: "lab".into(),
            account: None,
            settings: BTreeMap::from([("grp_tres_mins".to_string(), value.to_string())]),
        };
        c.admin_change(&root(), &change, T0)
            .map(|_| ())
            .map_err(|f| f.message)
    }

    /// One GPU for `minutes`.
    fn gpu_job(minutes: u64) -> JobRequest {
        JobRequest {
            gpus: Some(1),
            time: Some(minutes * 60),
            ..Default::default()
        }
    }

    /// n1's agent reports `id` running since `start`, or ended at `end`.
    fn agent(c: &mut Cluster, id: JobId, start: u64, end: Option<u64>, now: u64) {
        let poll = PollRequest {
            seq: None,
            node: "n1".into(),
            jobs: vec![AgentJob {
                id,
                start_time: Some(start),
                end_time: end,
                exit: end.map(|_| ExitInfo {
                    code: Some(0),
                    ..Default::default()
                }),
                stopping: false,
                ready: false,
                time_limit: None,
            }],
            wait_ms: 0,
            images: vec![],
            pulling: vec![],
            prepulls: vec![],
            steps: vec![],
            signalled: vec![],
        };
        c.ingest(&poll, now).unwrap();
    }

    #[test]
    fn a_spent_budget_holds_the_job_with_the_reason_until_the_period_resets() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = cluster_with(&dir, config());
        let ann = caller(1000, "ann");

        // Bad budgets are refused whole, and nothing is changed or audited.
        for (bad, want) in [
            ("gpu=-1", "whole number of minutes"),
            ("gpu=10,mem=5", "unknown TRES \"mem\""),
            ("garbage", "write TRES=MINUTES"),
        ] {
            let err = set_budget(&mut c, bad).unwrap_err();
            assert!(
                err.contains("grp_tres_mins") && err.contains(want),
                "{bad}: {err}"
            );
        }
        assert!(c.audit(&root(), 0, 100).unwrap().is_empty());
        assert!(!c.sched.limits.has_budgets());

        set_budget(&mut c, "gpu=120").unwrap();
        let audit = c.audit(&root(), 0, 100).unwrap();
        assert_eq!(audit.len(), 1);
        assert!(
            audit[0].command.contains("grp_tres_mins=gpu=120"),
            "{audit:?}"
        );

        // A job whose time limit alone is over the budget could never run.
        let err = submit_job(&mut c, &ann, gpu_job(180), T0).unwrap_err();
        assert!(
            err.message
                .contains("could never start: AssocGrpGRESMinutes")
                && err.message.contains("more than the whole budget"),
            "{}",
            err.message
        );

        // The first job starts (60 of 120 reserved), runs 50 minutes and completes.
        let first = submit_job(&mut c, &ann, gpu_job(60), T0).unwrap();
        c.schedule(T0).unwrap();
        assert_eq!(record(&c, first).state, JobState::Starting);
        agent(&mut c, first, T0, None, T0 + MIN);
        agent(&mut c, first, T0, Some(T0 + 50 * MIN), T0 + 50 * MIN);
        let ledger = SqliteLedger::open(&dir.path().join("wharf.db")).unwrap();
        assert_eq!(
            ledger.lookup(first).unwrap().len(),
            1,
            "the run is recorded"
        );

        // 50 used + 80 asked is over 120.
        let second = submit_job(&mut c, &ann, gpu_job(80), T0 + 51 * MIN).unwrap();
        c.schedule(T0 + 52 * MIN).unwrap();
        let held = record(&c, second);
        assert_eq!(held.state, JobState::Pending);
        let reason = held.reason.unwrap();
        for want in [
            "AssocGrpGRESMinutes: account lab has a budget of 120 GPU-minutes",
            "until it resets at 2026-12-01 00:00 UTC",
            "50 are used and",
            "would use 80",
        ] {
            assert!(reason.contains(want), "{want:?} in {reason}");
        }
        // Nothing of the account runs: nothing ending early would let it start sooner.
        assert!(!reason.contains("sooner"), "{reason}");

        // A restarted controller reads the period's usage back from the ledger.
        drop(c);
        let store = Store::open(&dir.path().join("wharf.db")).unwrap();
        let mut c =
            Cluster::load_with_scheduler(store, JobDefaults::default(), 60_000, T0, config())
                .unwrap();
        c.schedule(T0 + 53 * MIN).unwrap();
        let reason = record(&c, second).reason.unwrap();
        assert!(reason.contains("50 are used and"), "{reason}");

        // Still held on the last day of the month; it starts when the month is over.
        c.schedule(DEC - MIN).unwrap();
        assert_eq!(record(&c, second).state, JobState::Pending);
        c.schedule(DEC + 1_000).unwrap();
        assert_eq!(record(&c, second).state, JobState::Starting);
    }
}
