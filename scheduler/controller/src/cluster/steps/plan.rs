//! Where a step runs within its job's allocation: a pure function of the job's record and
//! the request.

use wharf_api::step::StepRequest;
use wharf_api::step_input::StepInput;
use wharf_api::wire::ErrorKind;
use wharf_api::JobRecord;

use super::refused;
use crate::cluster::Failure;

/// Where a step runs: its nodes (indices into the job's allocations, rank order) and tasks
/// on each.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// The job's ranks (node indices) the step runs on.
    pub ranks: Vec<usize>,
    /// Tasks on each of them.
    pub tasks_per_node: u32,
}

/// Where `req` runs within `job`, or why it cannot: it must ask for nodes of the job, tasks
/// that divide evenly over them, and no more tasks (one CPU each at least) or GPUs than the
/// job holds on each (nor more CPUs per task than the node's CPUs divided among its tasks);
/// an `--input` rank must be one of the step's. A node whose part of the batch command has ended (with status 0: a
/// failure stops the job) still belongs to the job until its last rank ends, so a batch
/// script that runs only on rank 0 (`if [ "$RANK" = 0 ]`) can run steps on every node.
pub fn plan(job: &JobRecord, req: &StepRequest) -> Result<Plan, Failure> {
    let invalid = |m: String| refused(ErrorKind::InvalidInput, m);
    let id = job.id;
    let all: Vec<usize> = (0..job.allocs.len()).collect();
    let mut ranks = match &req.nodelist {
        Some(text) => {
            let list = wharf_api::hostlist::HostList::parse(text)
                .map_err(|e| invalid(format!("--nodelist {text:?}: {e}")))?;
            for name in list.names() {
                if job.rank_on(name).is_none() {
                    return Err(invalid(format!(
                        "node {name} is not one of job {id}'s nodes ({})",
                        job.nodelist()
                    )));
                }
            }
            all.iter()
                .copied()
                .filter(|&r| list.contains(&job.allocs[r].node))
                .collect()
        }
        None => all.clone(),
    };
    if let Some(n) = req.nodes {
        if n == 0 || n as usize > ranks.len() {
            return Err(invalid(format!(
                "--nodes {n}: job {id} has {} node(s) to run the step on",
                ranks.len()
            )));
        }
        ranks.truncate(n as usize);
    } else if let (Some(t), None, None) = (req.ntasks, &req.nodelist, req.ntasks_per_node) {
        // `--ntasks T` alone: one task per node on the first T nodes, or T spread evenly.
        ranks.truncate((t as usize).clamp(1, ranks.len().max(1)));
    }
    let n = ranks.len() as u32;
    let spec_tasks = job.spec.as_ref().map_or(1, |s| s.tasks_per_node.max(1));
    let per_node = match (req.ntasks, req.ntasks_per_node) {
        (_, Some(0)) | (Some(0), _) => {
            return Err(invalid("a step needs at least one task".into()));
        }
        (Some(t), Some(k)) if t != k * n => {
            return Err(invalid(format!(
                "--ntasks {t} is not {k} tasks on each of {n} node(s)"
            )));
        }
        (_, Some(k)) => k,
        (Some(t), None) if t % n != 0 => {
            return Err(invalid(format!(
                "--ntasks {t} does not divide evenly over {n} node(s); give --ntasks-per-node \
                 or --nodes"
            )));
        }
        (Some(t), None) => t / n,
        (None, None) => spec_tasks,
    };
    for &r in &ranks {
        // A node whose batch rank is done (exit 0) is still the job's: steps run there.
        let a = &job.allocs[r];
        let cpus = a.cpu_ids.len() as u32;
        if per_node > cpus {
            return Err(invalid(format!(
                "{per_node} tasks per node is more than job {id} holds on node {}: {cpus} \
                 CPU(s), one task per CPU at most",
                a.node
            )));
        }
        match req.cpus_per_task {
            Some(0) => return Err(invalid("--cpus-per-task 0: a task needs a CPU".into())),
            Some(c) if c.saturating_mul(per_node) > cpus => {
                return Err(invalid(format!(
                    "{per_node} task(s) with {c} CPU(s) each is more than job {id} holds on \
                     node {}: {cpus} CPU(s)",
                    a.node
                )));
            }
            _ => {}
        }
    }
    if let StepInput::Task(r) = req.input {
        let ntasks = per_node * n;
        if r >= ntasks {
            return Err(invalid(format!(
                "--input {r}: the step has {ntasks} task(s), ranks 0 to {}",
                ntasks - 1
            )));
        }
    }
    Ok(Plan {
        ranks,
        tasks_per_node: per_node,
    })
}
