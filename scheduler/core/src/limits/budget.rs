//! Account budgets (Slurm's GrpTRESMins): TRES-minutes an association's jobs may use in one
//! budget period, and the period's calendar boundaries.
//!
//! The core does no IO: the caller sums what ended runs used in the current period (from its
//! accounting records) into [`BudgetUsage`]; the pass adds what running jobs have used so far
//! and the rest of their time limits (they may use it all), and starts a job only when its
//! whole time limit fits in what is left. Unlike Slurm, which decays GrpTRESMins usage with
//! PriorityDecayHalfLife, usage is not decayed: it starts from zero at each period boundary.

use std::collections::BTreeMap;

use wharf_api::forms::{civil_from_days, days_from_civil};
pub use wharf_api::pending::{format_utc_minute as format_utc, BudgetTres};

use crate::state::{Assoc, Time};

const DAY: Time = 24 * 3600 * 1000;

/// When budgets start over: UTC calendar boundaries (Slurm's PriorityUsageResetPeriod).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub enum BudgetPeriod {
    /// Never: a budget is for the whole life of the cluster.
    Never,
    /// Every day at 00:00 UTC.
    Daily,
    /// Every Monday at 00:00 UTC.
    Weekly,
    /// The first of every month at 00:00 UTC.
    #[default]
    Monthly,
    /// The first of January, April, July and October at 00:00 UTC.
    Quarterly,
    /// The first of January at 00:00 UTC.
    Yearly,
}

impl BudgetPeriod {
    /// Every period, by its name.
    pub const ALL: [BudgetPeriod; 6] = [
        BudgetPeriod::Never,
        BudgetPeriod::Daily,
        BudgetPeriod::Weekly,
        BudgetPeriod::Monthly,
        BudgetPeriod::Quarterly,
        BudgetPeriod::Yearly,
    ];

    /// Its name in the config: `never`, `daily`, `weekly`, `monthly`, `quarterly`, `yearly`.
    pub fn as_str(self) -> &'static str {
        match self {
            BudgetPeriod::Never => "never",
            BudgetPeriod::Daily => "daily",
            BudgetPeriod::Weekly => "weekly",
            BudgetPeriod::Monthly => "monthly",
            BudgetPeriod::Quarterly => "quarterly",
            BudgetPeriod::Yearly => "yearly",
        }
    }

    /// The period named `text` (any case).
    pub fn parse(text: &str) -> Option<BudgetPeriod> {
        let t = text.trim().to_ascii_lowercase();
        Self::ALL.into_iter().find(|p| p.as_str() == t)
    }

    /// The period that holds `now` (ms since the Unix epoch): its start, and its end (when
    /// usage resets; `None` for [`BudgetPeriod::Never`]).
    pub fn bounds(self, now: Time) -> (Time, Option<Time>) {
        let days = (now / DAY) as i64;
        let (y, m, _) = civil_from_days(days);
        let at = |y: i64, m: u32| days_from_civil(y, m, 1) as Time * DAY;
        let next_month = |y: i64, m: u32, by: u32| {
            let m0 = m - 1 + by;
            (y + i64::from(m0 / 12), m0 % 12 + 1)
        };
        match self {
            BudgetPeriod::Never => (0, None),
            BudgetPeriod::Daily => (days as Time * DAY, Some((days as Time + 1) * DAY)),
            BudgetPeriod::Weekly => {
                // 1970-01-01 was a Thursday: days since the last Monday.
                let since_monday = (days + 3).rem_euclid(7);
                let start = (days - since_monday) as Time * DAY;
                (start, Some(start + 7 * DAY))
            }
            BudgetPeriod::Monthly => {
                let (ny, nm) = next_month(y, m, 1);
                (at(y, m), Some(at(ny, nm)))
            }
            BudgetPeriod::Quarterly => {
                let qm = (m - 1) / 3 * 3 + 1;
                let (ny, nm) = next_month(y, qm, 3);
                (at(y, qm), Some(at(ny, nm)))
            }
            BudgetPeriod::Yearly => (at(y, 1), Some(at(y + 1, 1))),
        }
    }
}

/// A budget per TRES, in TRES-minutes (GrpTRESMins); `None` is no budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TresMins {
    /// CPU-minutes.
    pub cpu: Option<u64>,
    /// GPU-minutes.
    pub gpu: Option<u64>,
    /// Billing-minutes: the partition's billing rate (units per second held) times minutes.
    pub billing: Option<u64>,
}

impl TresMins {
    /// True when no TRES has a budget.
    pub fn is_empty(&self) -> bool {
        self.cpu.is_none() && self.gpu.is_none() && self.billing.is_none()
    }
}

/// TRES-minutes used.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct TresMinutes {
    /// CPU-minutes.
    pub cpu: f64,
    /// GPU-minutes.
    pub gpu: f64,
    /// Billing-minutes.
    pub billing: f64,
}

impl TresMinutes {
    /// `cpus`, `gpus` and `billing` (units per second) held for `ms` milliseconds.
    pub fn held(cpus: u64, gpus: u64, billing: f64, ms: Time) -> TresMinutes {
        let min = ms as f64 / 60_000.0;
        TresMinutes {
            cpu: cpus as f64 * min,
            gpu: gpus as f64 * min,
            billing: billing * min,
        }
    }

    /// Adds `o`.
    pub fn add(&mut self, o: &TresMinutes) {
        self.cpu += o.cpu;
        self.gpu += o.gpu;
        self.billing += o.billing;
    }
}

/// What the pass needs to enforce budgets: the current period and what ended runs used in it.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct BudgetUsage {
    /// Start of the current period, ms: running jobs' usage counts from here.
    pub since: Time,
    /// End of the period (when usage resets), ms; `None`: it never does.
    pub resets: Option<Time>,
    /// TRES-minutes that runs which ended in the period used inside it, per user association
    /// (the pass rolls them up the account tree).
    pub used: BTreeMap<Assoc, TresMinutes>,
}

/// The first TRES of `cap` on which `used + asks` goes over it: (TRES, cap, used, asks),
/// amounts rounded up to whole minutes.
pub(crate) fn over(
    cap: &TresMins,
    used: &TresMinutes,
    asks: &TresMinutes,
) -> Option<(BudgetTres, u64, u64, u64)> {
    [
        (BudgetTres::Gpu, cap.gpu, used.gpu, asks.gpu),
        (BudgetTres::Cpu, cap.cpu, used.cpu, asks.cpu),
        (BudgetTres::Billing, cap.billing, used.billing, asks.billing),
    ]
    .into_iter()
    .find_map(|(kind, cap, used, asks)| {
        // A small tolerance: float sums of many runs must not refuse an exact fit.
        cap.filter(|&c| asks > 0.0 && used + asks > c as f64 + 1e-6)
            .map(|c| (kind, c, used.ceil() as u64, asks.ceil() as u64))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(y: i64, m: u32, d: u32, h: u64) -> Time {
        days_from_civil(y, m, d) as Time * DAY + h * 3_600_000
    }

    #[test]
    fn calendar_round_trips() {
        for z in [-800_000i64, -1, 0, 1, 59, 11_016, 20_000, 2_000_000] {
            let (y, m, d) = civil_from_days(z);
            assert_eq!(days_from_civil(y, m, d), z);
        }
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(
            format_utc(at(2024, 2, 29, 13) + 5 * 60_000),
            "2024-02-29 13:05 UTC"
        );
    }

    #[test]
    fn periods_follow_utc_calendar_boundaries() {
        let now = at(2026, 11, 26, 19); // a Thursday
        assert_eq!(
            BudgetPeriod::Monthly.bounds(now),
            (at(2026, 11, 1, 0), Some(at(2026, 12, 1, 0)))
        );
        assert_eq!(
            BudgetPeriod::Monthly.bounds(at(2026, 12, 31, 23)),
            (at(2026, 12, 1, 0), Some(at(2027, 1, 1, 0)))
        );
        assert_eq!(
            BudgetPeriod::Weekly.bounds(now),
            (at(2026, 11, 23, 0), Some(at(2026, 11, 30, 0)))
        );
        assert_eq!(
            BudgetPeriod::Weekly.bounds(at(2026, 11, 23, 0)).0,
            at(2026, 11, 23, 0)
        );
        assert_eq!(
            BudgetPeriod::Daily.bounds(now),
            (at(2026, 11, 26, 0), Some(at(2026, 11, 27, 0)))
        );
        assert_eq!(
            BudgetPeriod::Quarterly.bounds(now),
            (at(2026, 10, 1, 0), Some(at(2027, 1, 1, 0)))
        );
        assert_eq!(
            BudgetPeriod::Yearly.bounds(now),
            (at(2026, 1, 1, 0), Some(at(2027, 1, 1, 0)))
        );
        assert_eq!(BudgetPeriod::Never.bounds(now), (0, None));
        assert_eq!(BudgetPeriod::parse(" Weekly"), Some(BudgetPeriod::Weekly));
        assert_eq!(BudgetPeriod::parse("fortnightly"), None);
    }
}
