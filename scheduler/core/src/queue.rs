//! The pending queue in scheduling order, worked out per run of alike jobs.
//!
//! A deep queue is mostly arrays: tasks submitted together that differ only in their id.
//! Consecutive pending jobs that are [`alike`] form a run; a run's admission, hold and begin
//! reason and priority are those of its first job, worked out once, and runs are sorted
//! instead of jobs. The order is exactly that of sorting every job by its key (tier, priority,
//! submit time, id): runs whose keys tie but for the id are merged by id. The backfill pass
//! is told which ready jobs are alike their predecessor in that order, so that a job whose
//! twin just before it waited without a reservation waits for the same reason at once (see
//! [`crate::backfill`]).

use std::collections::BTreeMap;
use std::ops::Range;

use wharf_api::JobId;

use crate::backfill::Ready;
use crate::state::{KeptReservation, PendingJob, Time};

/// The part of a job's sort key that alike jobs share: inverted tier, inverted priority,
/// submit time.
pub(crate) type Prefix = (u64, u64, Time);

/// Ready jobs of one run (or one job), sharing a sort prefix, partition and time limit.
pub(crate) struct Segment {
    pub prefix: Prefix,
    /// Indices into the pending list, ids ascending.
    pub jobs: Range<usize>,
    pub part: usize,
    pub limit: Time,
}

/// True when `b` differs from `a` in nothing the scheduler looks at but its id, and comes
/// after it in id order. Cheap fields first: most neighbours differ in their submit time.
pub(crate) fn alike(a: &PendingJob, b: &PendingJob) -> bool {
    b.id > a.id
        && a.submit == b.submit
        && a.time_limit == b.time_limit
        && a.begin == b.begin
        && a.hold == b.hold
        && a.nice == b.nice
        && a.priority == b.priority
        && a.request == b.request
        && a.after == b.after
        && a.partition == b.partition
        && a.qos == b.qos
        && a.select == b.select
        && a.assoc == b.assoc
}

/// The pending list as runs of consecutive alike jobs, read in one sweep, or kept up to date
/// as jobs join and leave (see [`crate::Live`]). A pass needs only that every run be
/// consecutive jobs alike their first; runs that could be merged may stay apart (a plan does
/// not depend on how alike jobs are grouped, `scheduler/core/tests/runs.rs`).
#[derive(Debug, Clone, Default)]
pub(crate) struct Runs {
    /// Index ranges into the pending list.
    pub runs: Vec<Range<usize>>,
    /// Every pending job's id, in list order: later steps read these, not the jobs.
    pub ids: Vec<JobId>,
    /// Some job has dependencies.
    pub any_after: bool,
}

impl Runs {
    /// `job` joined the end of the pending list, after `last` (the job that was last).
    pub fn push(&mut self, last: Option<&PendingJob>, job: &PendingJob) {
        let k = self.ids.len();
        self.ids.push(job.id);
        self.any_after |= !job.after.is_empty();
        match (last, self.runs.last_mut()) {
            (Some(last), Some(run)) if run.end == k && alike(last, job) => run.end = k + 1,
            _ => self.runs.push(k..k + 1),
        }
    }

    /// The job at list position `k` left the queue but stays in the list for now: the run
    /// that held it is cut around it.
    pub fn cut(&mut self, k: usize) {
        let Some(r) = self
            .runs
            .partition_point(|run| run.start <= k)
            .checked_sub(1)
        else {
            return;
        };
        let run = self.runs[r].clone();
        if !run.contains(&k) {
            return;
        }
        let parts = [run.start..k, k + 1..run.end];
        let kept: Vec<Range<usize>> = parts.into_iter().filter(|p| !p.is_empty()).collect();
        self.runs.splice(r..=r, kept);
    }

    /// The jobs at `gone` (list positions, ascending, distinct), in no run, left the list,
    /// which was closed up behind them; neighbouring runs alike are joined again.
    /// `any_after`: some job still pending has dependencies.
    pub fn close_up(&mut self, pending: &[PendingJob], gone: &[usize], any_after: bool) {
        self.remove(gone, any_after);
        let mut out: Vec<Range<usize>> = Vec::with_capacity(self.runs.len());
        for run in self.runs.drain(..) {
            match out.last_mut() {
                Some(last)
                    if last.end == run.start
                        && alike(&pending[last.end - 1], &pending[run.start]) =>
                {
                    last.end = run.end;
                }
                _ => out.push(run),
            }
        }
        self.runs = out;
    }

    /// The jobs at `gone` (list positions, ascending, distinct) left the list, which was
    /// closed up behind them; `any_after`: some job still pending has dependencies.
    pub fn remove(&mut self, gone: &[usize], any_after: bool) {
        self.any_after = any_after;
        if gone.is_empty() {
            return;
        }
        retain_but(&mut self.ids, gone);
        // Gone before a run's start, and before its end.
        let mut at = 0;
        let mut out = Vec::with_capacity(self.runs.len());
        for run in &self.runs {
            while at < gone.len() && gone[at] < run.start {
                at += 1;
            }
            let before = at;
            while at < gone.len() && gone[at] < run.end {
                at += 1;
            }
            let r = run.start - before..run.end - at;
            if !r.is_empty() {
                out.push(r);
            }
        }
        self.runs = out;
    }
}

/// Splits `pending` into runs of consecutive alike jobs.
pub(crate) fn runs(pending: &[PendingJob]) -> Runs {
    let mut out = Runs {
        runs: Vec::new(),
        ids: Vec::with_capacity(pending.len()),
        any_after: false,
    };
    let mut start = 0;
    for (k, job) in pending.iter().enumerate() {
        out.ids.push(job.id);
        out.any_after |= !job.after.is_empty();
        if k > 0 && !alike(&pending[k - 1], job) {
            out.runs.push(start..k);
            start = k;
        }
    }
    if !pending.is_empty() {
        out.runs.push(start..pending.len());
    }
    out
}

/// Keeps every element of `list` but those at `gone` (positions, ascending, distinct).
pub(crate) fn retain_but<T>(list: &mut Vec<T>, gone: &[usize]) {
    let (mut k, mut next) = (0, 0);
    list.retain(|_| {
        let keep = gone.get(next) != Some(&k);
        next += usize::from(!keep);
        k += 1;
        keep
    });
}

/// The ready jobs of `segments` in scheduling order: by prefix, then job id.
pub(crate) fn order<'a>(
    pending: &'a [PendingJob],
    ids: &[JobId],
    mut segments: Vec<Segment>,
) -> Vec<Ready<'a>> {
    let total = segments.iter().map(|s| s.jobs.len()).sum();
    segments.sort_unstable_by_key(|s| (s.prefix, ids[s.jobs.start]));
    let mut out = Vec::with_capacity(total);
    let mut i = 0;
    while i < segments.len() {
        let mut j = i + 1;
        while j < segments.len() && segments[j].prefix == segments[i].prefix {
            j += 1;
        }
        if j == i + 1 {
            let s = &segments[i];
            out.extend(s.jobs.clone().enumerate().map(|(n, k)| Ready {
                job: &pending[k],
                id: ids[k],
                part: s.part,
                limit: s.limit,
                alike_prev: n > 0,
                kept: None,
            }));
        } else {
            // Keys tie but for the id: interleave by id, as a sort of every job would.
            let mut merged: Vec<(u64, usize, usize)> = segments[i..j]
                .iter()
                .enumerate()
                .flat_map(|(s, seg)| seg.jobs.clone().map(move |k| (ids[k], k, s)))
                .collect();
            merged.sort_unstable();
            let mut prev: Option<usize> = None;
            for (id, k, s) in merged {
                let seg = &segments[i + s];
                // Alike only when the one before came from the same run.
                out.push(Ready {
                    job: &pending[k],
                    id,
                    part: seg.part,
                    limit: seg.limit,
                    alike_prev: prev == Some(s),
                    kept: None,
                });
                prev = Some(s);
            }
        }
        i = j;
    }
    out
}

/// `ready` (in scheduling order, highest partition tier first) with the first `places` of
/// the jobs in `reserved` that have `waited` (by the order the last pass made their
/// reservations in, across every partition) moved ahead of the other jobs of their tier, in their order there (the
/// order the last pass made their reservations in), each marked with where its reservation
/// started. So such a reservation is not taken over by a job that comes later with a higher
/// priority, nor by another kept one (Maui's `RESERVATIONPOLICY HIGHEST` keeps reservations
/// the same way). Without this a large job whose reservation keeps being overtaken waits
/// forever, and the nodes drained for it idle in vain each time.
pub(crate) fn reserved_first<'a>(
    ready: Vec<Ready<'a>>,
    reserved: &BTreeMap<JobId, KeptReservation>,
    places: usize,
    waited: impl Fn(&PendingJob) -> bool,
    tier: impl Fn(usize) -> u32,
) -> Vec<Ready<'a>> {
    // The jobs that have waited, in the order their reservations were made: the first
    // `places` of them keep theirs (a job that has not waited, or has gone, takes no place).
    let mut eligible: Vec<(u32, usize, &KeptReservation)> = ready
        .iter()
        .enumerate()
        .filter_map(|(k, r)| {
            let h = reserved.get(&r.id).filter(|_| waited(r.job))?;
            Some((h.place, k, h))
        })
        .collect();
    if eligible.is_empty() || places == 0 {
        return ready;
    }
    if eligible.len() > places {
        eligible.sort_unstable_by_key(|&(place, k, _)| (place, k));
        eligible.truncate(places);
    }
    let mut held: Vec<Option<&KeptReservation>> = vec![None; ready.len()];
    for (_, k, h) in eligible {
        held[k] = Some(h);
    }
    let mut out = Vec::with_capacity(ready.len());
    let mut i = 0;
    while i < ready.len() {
        let t = tier(ready[i].part);
        let mut j = i + 1;
        while j < ready.len() && tier(ready[j].part) == t {
            j += 1;
        }
        let mut first: Vec<(u32, usize, Time)> = (i..j)
            .filter_map(|k| held[k].map(|h| (h.place, k, h.start)))
            .collect();
        first.sort_unstable();
        out.extend(first.iter().map(|&(_, k, start)| Ready {
            alike_prev: false,
            kept: Some(start),
            ..ready[k]
        }));
        // A job that was alike the one before it is alike it still only if that one stayed.
        out.extend((i..j).filter(|&k| held[k].is_none()).map(|k| Ready {
            alike_prev: ready[k].alike_prev && k > i && held[k - 1].is_none(),
            ..ready[k]
        }));
        i = j;
    }
    out
}
