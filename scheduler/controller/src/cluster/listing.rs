//! The queue listing in rows (`GET /v1/jobs?rows=true`, `wharf_api::listing`).

use wharf_api::wire::ErrorKind;
use wharf_api::JobRecord;

use super::{Caller, Cluster, Failure};
use crate::store::ListFilter;

impl Cluster {
    /// The jobs [`Cluster::list`] gives, as the rows of a queue listing, written as the
    /// answer's JSON (`{"rows": [JobRow]}`) straight from the records: none is copied, so a
    /// queue of 100,000 costs one pass over it with the lock held.
    /// Ended jobs are those `filter` keeps, filtered before the `finished` most recent are
    /// taken; active ones those in its partitions.
    pub fn list_rows(
        &self,
        caller: &Caller,
        finished: u32,
        only_uid: Option<u32>,
        filter: &ListFilter,
    ) -> Result<Vec<u8>, Failure> {
        let filter = &self.with_default_partition(filter)?;
        let ended = match finished {
            0 => Vec::new(),
            n => self.store.finished_jobs_where(only_uid, n, filter)?,
        };
        let mut jobs: Vec<&JobRecord> = self
            .jobs
            .values()
            .filter(|j| only_uid.is_none_or(|u| j.owner.uid == u))
            .filter(|j| filter.keeps_partition(super::sched::partition_of(j)))
            .collect();
        if !ended.is_empty() {
            // Active jobs come in id order; ended ones are merged in by id.
            jobs.extend(&ended);
            jobs.sort_by_key(|j| j.id);
        }
        // A pending job's row is about 100 bytes.
        let mut out = Vec::with_capacity(16 + 128 * jobs.len());
        let rows = jobs.into_iter().map(|j| {
            let pulls = self.pulls.get(&j.id).map_or(&[][..], Vec::as_slice);
            let partition = super::sched::partition_of(j).unwrap_or(&filter.default_partition);
            crate::visibility::row(caller, j, pulls, partition)
        });
        out.extend_from_slice(b"{\"rows\":");
        serde::Serializer::collect_seq(&mut serde_json::Serializer::new(&mut out), rows)
            .map_err(|e| Failure::new(ErrorKind::Internal, format!("listing the jobs: {e}")))?;
        out.push(b'}');
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use wharf_api::array::parse_array;
    use wharf_api::listing::{JobRow, Rows};
    use wharf_api::{JobRequest, JobState};

    use crate::cluster::drain::tests::{nodes, poll_pulling, started};
    use crate::cluster::sched::tests::{caller, submit_job};
    use crate::cluster::{Caller, Cluster};
    use crate::store::ListFilter;

    /// The rows `caller` gets, and those made from the whole records it gets.
    fn both(
        c: &Cluster,
        caller: &Caller,
        finished: u32,
        uid: Option<u32>,
    ) -> (Rows<'static>, Vec<JobRow<'static>>) {
        let bytes = c
            .list_rows(caller, finished, uid, &Default::default())
            .unwrap();
        let rows: Rows = serde_json::from_slice(&bytes).unwrap();
        let rows = Rows {
            rows: rows.rows.into_iter().map(owned).collect(),
        };
        let records = c.list(caller, finished, uid, true).unwrap();
        // A row's NODES is what the job holds or asks for, and its PARTITION the job's, to
        // every caller (as squeue shows them), which records without their spec cannot tell:
        // taken from the whole records.
        let admin = Caller {
            admin: true,
            ..caller.clone()
        };
        let asks: std::collections::BTreeMap<_, _> = c
            .list(&admin, finished, uid, false)
            .unwrap()
            .iter()
            .map(|j| {
                let part = j.spec.as_ref().and_then(|s| s.partition.clone());
                let part = part.unwrap_or(wharf_core::DEFAULT_PARTITION.into());
                (j.id, (j.node_count(), part))
            })
            .collect();
        let from_records = records
            .iter()
            .map(|j| {
                owned(JobRow {
                    nodes: asks[&j.id].0,
                    partition: asks[&j.id].1.as_str().into(),
                    ..JobRow::of(j, &j.pulling)
                })
            })
            .collect();
        (rows, from_records)
    }

    fn owned(r: JobRow<'_>) -> JobRow<'static> {
        JobRow {
            name: r.name.into_owned().into(),
            user: r.user.into_owned().into(),
            reason: r.reason.map(|r| r.into_owned().into()),
            nodelist: r.nodelist.into_owned().into(),
            partition: r.partition.into_owned().into(),
            ..r
        }
    }

    #[test]
    fn rows_show_what_the_whole_records_show_each_caller() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = nodes(&dir, 2);
        // Ann's gang starts on both nodes, which pull its image.
        let (gang, on) = started(&mut c, 2, false, 10);
        poll_pulling(&mut c, &on[0], &[], &[(gang, 3)]);
        poll_pulling(&mut c, &on[1], &[], &[(gang, 1)]);
        // Bob's jobs wait: one named with text that JSON escapes, an array, one held.
        let (ann, bob) = (caller(1000, "ann"), caller(1001, "bob"));
        let named = JobRequest {
            name: Some("a \"quoted\"\\ name 日本語 and more than twenty characters".into()),
            ..Default::default()
        };
        submit_job(&mut c, &bob, named, 20).unwrap();
        let array = JobRequest {
            array: Some(parse_array("0-2").unwrap()),
            ..Default::default()
        };
        submit_job(&mut c, &bob, array, 20).unwrap();
        // Held gangs: a pending job's NODES is what it asks for, to everyone.
        let held = JobRequest {
            hold: Some(true),
            nodes: Some(2),
            ..Default::default()
        };
        let cancelled = submit_job(&mut c, &ann, held.clone(), 20).unwrap();
        let waiting = submit_job(&mut c, &ann, held, 20).unwrap();
        c.cancel(&ann, cancelled, 30).unwrap();
        c.schedule(40).unwrap();

        let admin = Caller {
            admin: true,
            ..caller(0, "root")
        };
        for who in [&ann, &bob, &admin] {
            for (finished, uid) in [(0, None), (10, None), (10, Some(1000)), (0, Some(1001))] {
                let (rows, from_records) = both(&c, who, finished, uid);
                assert_eq!(rows.rows, from_records, "{who:?} {finished} {uid:?}");
            }
        }
        let (all, _) = both(&c, &bob, 10, None);
        assert_eq!(all.rows.len(), 1 + 1 + 3 + 2, "{all:?}");
        assert!(all
            .rows
            .iter()
            .any(|r| r.id == cancelled && r.state == JobState::Cancelled));
        assert!(all
            .rows
            .iter()
            .any(|r| r.id == waiting && r.state == JobState::Pending && r.nodes == 2));
        assert!(all
            .rows
            .iter()
            .any(|r| r.array.is_some_and(|(_, task)| task == 2)));
        assert!(all
            .rows
            .iter()
            .any(|r| r.name.starts_with("a \"quoted\"\\ name 日本語")));
        // The gang's pulls: the node furthest behind, to its owner only.
        let row = |who: &Caller| {
            both(&c, who, 0, None)
                .0
                .rows
                .into_iter()
                .find(|r| r.id == gang)
                .unwrap()
        };
        let theirs = row(&ann);
        assert_eq!((theirs.nodes, &*theirs.nodelist), (2, "g[1-2]"));
        assert_eq!(theirs.pull.map(|p| p.layers_done), Some(1));
        let others = row(&bob);
        assert_eq!(others.pull, None);
        // A pending job's reason comes as its code; nobody's reason for another state does.
        assert_eq!(others.reason, None);
        let held = all
            .rows
            .iter()
            .find(|r| r.state == JobState::Pending && r.user == "ann");
        assert_eq!(held.unwrap().reason.as_deref(), Some("JobHeldUser"));
    }

    /// `wharf queue -p`: the jobs of the partitions named, active and ended, to their owner
    /// and to other users alike (whose view of a job leaves its spec, which names its
    /// partition, out); a partition the cluster does not have is refused, naming those it has.
    #[test]
    fn a_listing_keeps_the_jobs_of_the_partitions_it_names_whoever_asks() {
        let dir = tempfile::tempdir().unwrap();
        let config = wharf_core::Config {
            partitions: vec![
                wharf_core::Partition::new("short", &["n1"]),
                wharf_core::Partition::new("big", &["n1"]),
            ],
            default_partition: Some("big".into()),
            ..Default::default()
        };
        let mut c = crate::cluster::sched::tests::cluster_with(&dir, config);
        let (ann, bob) = (caller(1000, "ann"), caller(1001, "bob"));
        let held = |partition: Option<&str>| JobRequest {
            partition: partition.map(Into::into),
            hold: Some(true),
            ..Default::default()
        };
        let short = submit_job(&mut c, &ann, held(Some("short")), 1).unwrap();
        let big = submit_job(&mut c, &ann, held(None), 2).unwrap();
        let ended = submit_job(&mut c, &ann, held(Some("short")), 3).unwrap();
        c.cancel(&ann, ended, 4).unwrap();
        let only = |names: &[&str]| ListFilter {
            partitions: names.iter().map(|n| n.to_string()).collect(),
            ..Default::default()
        };
        for who in [&ann, &bob] {
            let rows = |f: ListFilter| -> Vec<(u64, String)> {
                let bytes = c.list_rows(who, 10, None, &f).unwrap();
                let rows: Rows = serde_json::from_slice(&bytes).unwrap();
                (rows.rows.iter())
                    .map(|r| (r.id, r.partition.to_string()))
                    .collect()
            };
            let (s, b) = ("short".to_string(), "big".to_string());
            assert_eq!(rows(only(&["short"])), [(short, s.clone()), (ended, s)]);
            assert_eq!(rows(only(&["big"])), [(big, b)]);
            assert_eq!(rows(only(&["big", "short"])).len(), 3);
            assert_eq!(rows(only(&[])).len(), 3);
            let records = c.list_where(who, 10, None, false, &only(&["short"]));
            let ids: Vec<u64> = records.unwrap().iter().map(|j| j.id).collect();
            assert_eq!(ids, [short, ended], "{who:?}");
        }
        let err = c.list_rows(&bob, 0, None, &only(&["nope"])).unwrap_err();
        assert!(
            err.message
                .contains("unknown partition \"nope\"; this cluster has: short, big"),
            "{}",
            err.message
        );
        assert!(c.list_where(&bob, 0, None, true, &only(&["nope"])).is_err());
        // A cluster without partitions: its jobs name none, and are in the default one.
        let dir = tempfile::tempdir().unwrap();
        let mut c = nodes(&dir, 1);
        let active = submit_job(&mut c, &ann, held(None), 1).unwrap();
        let ended = submit_job(&mut c, &ann, held(None), 2).unwrap();
        c.cancel(&ann, ended, 3).unwrap();
        let bytes = c.list_rows(&bob, 10, None, &only(&["default"])).unwrap();
        let rows: Rows = serde_json::from_slice(&bytes).unwrap();
        let rows: Vec<(u64, &str)> = rows.rows.iter().map(|r| (r.id, &*r.partition)).collect();
        assert_eq!(rows, [(active, "default"), (ended, "default")]);
        let err = c.list_rows(&bob, 10, None, &only(&["gpu"])).unwrap_err();
        assert!(
            err.message.contains("this cluster has: default"),
            "{}",
            err.message
        );
    }
}
