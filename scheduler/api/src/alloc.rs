//! Where a job runs: one [`NodeAlloc`] per node, in rank order (rank 0 first, the node whose
//! address is `MASTER_ADDR`), each with the CPUs and GPUs it holds there and how its rank on
//! that node is doing. A one-node job has one entry; a gang job has one per node, all
//! allocated at once and launched together.
//!
//! Records stored before gang jobs held one `node` with its `cpu_ids` and `gpu_ids`;
//! [`upgrade_record`] turns such a record into the current form, so the store reads both.

use serde::{Deserialize, Serialize};

use crate::job::ExitInfo;

/// What a job holds on one of its nodes, and how its rank there is doing.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeAlloc {
    /// Node name.
    pub node: String,
    /// CPU indices allocated on that node.
    #[serde(default)]
    pub cpu_ids: Vec<u32>,
    /// GPU ids allocated on that node.
    #[serde(default)]
    pub gpu_ids: Vec<u32>,
    /// When this rank's first process started, ms since the Unix epoch (its agent's word).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<u64>,
    /// When this rank ended, ms since the Unix epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_time: Option<u64>,
    /// How this rank ended, once its node has said so (or was lost).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit: Option<ExitInfo>,
    /// Its node has prepared this rank (a gang's first phase) and waits for the release.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub ready: bool,
}

impl NodeAlloc {
    /// A new allocation on `node`, its rank not started.
    pub fn new(node: &str, cpu_ids: Vec<u32>, gpu_ids: Vec<u32>) -> NodeAlloc {
        NodeAlloc {
            node: node.to_string(),
            cpu_ids,
            gpu_ids,
            ..NodeAlloc::default()
        }
    }

    /// True once this rank has ended (or its node was lost).
    pub fn ended(&self) -> bool {
        self.exit.is_some()
    }
}

/// The file rank `rank` of a job writes where the job's output (or error) file is `path`
/// (its job's letters expanded, see [`crate::pattern`]): rank 0 writes the job's own file,
/// rank `r` the same path with `.rank<r>` after it, so that ranks on nodes sharing a
/// filesystem never write over each other. A path with `%t` (Slurm's task id) has the rank
/// there instead. `%%` is a `%` here.
pub fn rank_path(path: &str, rank: u32) -> String {
    match crate::pattern::finish(path, rank) {
        (name, true) => name,
        (name, false) if rank == 0 => name,
        (name, false) => format!("{name}.rank{rank}"),
    }
}

/// Brings a stored job record written before gang jobs up to date: its `node`, `cpu_ids` and
/// `gpu_ids` become one [`NodeAlloc`] (with its start, end and exit when the job had them),
/// and a `requeued_from` that named one node becomes a list. Records already current are left
/// as they are.
pub fn upgrade_record(record: &mut serde_json::Value) {
    let Some(obj) = record.as_object_mut() else {
        return;
    };
    let node = obj.remove("node");
    let cpu_ids = obj.remove("cpu_ids");
    let gpu_ids = obj.remove("gpu_ids");
    if let (Some(serde_json::Value::String(node)), false) = (node, obj.contains_key("allocs")) {
        let mut alloc = serde_json::json!({
            "node": node,
            "cpu_ids": cpu_ids.unwrap_or_default(),
            "gpu_ids": gpu_ids.unwrap_or_default(),
        });
        for key in ["start_time", "end_time", "exit"] {
            if let Some(v) = obj.get(key).filter(|v| !v.is_null()) {
                alloc[key] = v.clone();
            }
        }
        obj.insert("allocs".into(), serde_json::Value::Array(vec![alloc]));
    }
    match obj.get("requeued_from") {
        Some(serde_json::Value::String(n)) => {
            let list = serde_json::json!([n]);
            obj.insert("requeued_from".into(), list);
        }
        Some(serde_json::Value::Null) => {
            obj.remove("requeued_from");
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{JobRecord, JobState};

    #[test]
    fn a_record_stored_before_gang_jobs_loads_with_one_alloc() {
        let old = r#"{"id":7,"owner":{"uid":1000,"gid":1000,"user":"ana"},"spec":null,
            "name":"t","resources":{"cpus":2,"memory":1073741824,"gpus":1},"time_limit":60,
            "state":"RUNNING","reason":null,"submit_time":1,"start_time":5,"end_time":null,
            "node":"n1","cpu_ids":[2,3],"gpu_ids":[1],"exit":null,"cancel_requested":false,
            "requeued_from":"n0"}"#;
        let mut v: serde_json::Value = serde_json::from_str(old).unwrap();
        upgrade_record(&mut v);
        let rec: JobRecord = serde_json::from_value(v).unwrap();
        assert_eq!(rec.state, JobState::Running);
        assert_eq!(rec.allocs.len(), 1);
        assert_eq!(rec.allocs[0].node, "n1");
        assert_eq!(rec.allocs[0].cpu_ids, [2, 3]);
        assert_eq!(rec.allocs[0].gpu_ids, [1]);
        assert_eq!(rec.allocs[0].start_time, Some(5));
        assert_eq!(rec.requeued_from, ["n0"]);
        // A current record goes through unchanged.
        let mut again = serde_json::to_value(&rec).unwrap();
        upgrade_record(&mut again);
        assert_eq!(serde_json::from_value::<JobRecord>(again).unwrap(), rec);
    }

    #[test]
    fn a_pending_record_of_old_has_no_alloc() {
        let old = r#"{"id":8,"owner":{"uid":1,"gid":1,"user":"b"},"spec":null,"name":"t",
            "resources":{"cpus":1,"memory":1073741824,"gpus":0},"time_limit":60,
            "state":"PENDING","reason":null,"submit_time":1,"start_time":null,"end_time":null,
            "node":null,"cpu_ids":[],"gpu_ids":[],"exit":null,"cancel_requested":false,
            "requeued_from":null}"#;
        let mut v: serde_json::Value = serde_json::from_str(old).unwrap();
        upgrade_record(&mut v);
        let rec: JobRecord = serde_json::from_value(v).unwrap();
        assert!(rec.allocs.is_empty());
        assert!(rec.requeued_from.is_empty());
    }

    #[test]
    fn ranks_past_the_first_write_their_own_files() {
        assert_eq!(rank_path("/h/wharf-4.out", 0), "/h/wharf-4.out");
        assert_eq!(rank_path("/h/wharf-4.out", 2), "/h/wharf-4.out.rank2");
    }
}
