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

use std::ops::Range;

use crate::backfill::Ready;
use crate::state::{PendingJob, Time};

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
        && a.request == b.request
        && a.after == b.after
        && a.partition == b.partition
        && a.qos == b.qos
        && a.select == b.select
        && a.assoc == b.assoc
}

/// Splits `pending` into runs of consecutive alike jobs.
pub(crate) fn runs(pending: &[PendingJob]) -> Vec<Range<usize>> {
    let mut runs = Vec::new();
    let mut start = 0;
    for k in 1..=pending.len() {
        if k == pending.len() || !alike(&pending[k - 1], &pending[k]) {
            runs.push(start..k);
            start = k;
        }
    }
    runs
}

/// The ready jobs of `segments` in scheduling order: by prefix, then job id.
pub(crate) fn order<'a>(pending: &'a [PendingJob], mut segments: Vec<Segment>) -> Vec<Ready<'a>> {
    let total = segments.iter().map(|s| s.jobs.len()).sum();
    segments.sort_unstable_by_key(|s| (s.prefix, pending[s.jobs.start].id));
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
                part: s.part,
                limit: s.limit,
                alike_prev: n > 0,
            }));
        } else {
            // Keys tie but for the id: interleave by id, as a sort of every job would.
            let mut merged: Vec<(u64, usize, usize)> = segments[i..j]
                .iter()
                .enumerate()
                .flat_map(|(s, seg)| seg.jobs.clone().map(move |k| (pending[k].id, k, s)))
                .collect();
            merged.sort_unstable();
            let mut prev: Option<usize> = None;
            for (_, k, s) in merged {
                let seg = &segments[i + s];
                // Alike only when the one before came from the same run.
                out.push(Ready {
                    job: &pending[k],
                    part: seg.part,
                    limit: seg.limit,
                    alike_prev: prev == Some(s),
                });
                prev = Some(s);
            }
        }
        i = j;
    }
    out
}
