//! GPUs of a step's own: a step that asks for GPUs (`srun --gres=gpu:N`, `--gpus-per-node`,
//! `--gpus`, `--gpus-per-task`) without `--overlap` holds that many of its job's GPU ids on
//! each of its nodes, ids no other running step of the job holds, until its tasks there end
//! (as Slurm's steps do not share what they asked for). One that asks for more than are
//! free waits; one that asks for more than the job has is refused.
//!
//! What a step holds is kept in its record ([`StepNode::gpu_ids`]), and a node's entry
//! holds them until it has an exit, which every way a step ends gives it (its tasks'
//! reports, the job's end, a stop before they started): the held ids are worked out from
//! the running steps' records each time, so a restarted controller knows them as well.
//!
//! ```text
//!   job 7 holds GPUs 0,1,3 on g1; step 0 holds 0, step 1 holds 1
//!   step 2 asks 1 per node    ──▶ Given([[3]])
//!   step 3 asks 1 per node    ──▶ Busy: 0 of 3 free on g1, held by steps 0, 1, 2
//!   step 4 asks 4 per node    ──▶ refused: the job has 3 on g1
//! ```

use std::collections::BTreeMap;

use wharf_api::step::{StepNode, StepRequest};
use wharf_api::wire::ErrorKind;
use wharf_api::JobRecord;

use super::{refused, Plan};
use crate::cluster::Failure;

/// GPUs a step holds on each of its nodes, as `req` asks them of `plan`'s nodes: `None`
/// when it holds none (no GPU request, or `--overlap`).
///
/// Errors: `InvalidInput` for a total that does not divide evenly over the step's nodes,
/// for requests that disagree, and for more than the job has on one of its nodes.
pub fn asked(job: &JobRecord, req: &StepRequest, plan: &Plan) -> Result<Option<u32>, Failure> {
    let invalid = |m: String| refused(ErrorKind::InvalidInput, m);
    let nodes = plan.ranks.len() as u32;
    let total = match req.gpus {
        Some(t) if nodes > 0 && t % nodes != 0 => {
            return Err(invalid(format!(
                "--gpus {t} does not divide evenly over the step's {nodes} node(s); give \
                 --gpus-per-node, or a multiple of {nodes}"
            )));
        }
        Some(t) => Some(t / nodes.max(1)),
        None => None,
    };
    let per_task = req
        .gpus_per_task
        .map(|g| g.saturating_mul(plan.tasks_per_node));
    let mut per_node = None;
    for (what, n) in [
        ("--gpus-per-node", req.gpus_per_node),
        ("--gpus", total),
        ("--gpus-per-task", per_task),
    ] {
        match (per_node, n) {
            (Some((first, m)), Some(n)) if m != n => {
                return Err(invalid(format!(
                    "{first} asks for {m} GPU(s) on each node but {what} for {n}; give one \
                     of them"
                )));
            }
            (None, Some(n)) => per_node = Some((what, n)),
            _ => {}
        }
    }
    let Some((_, want)) = per_node else {
        return Ok(None);
    };
    let job_type = job.spec.as_ref().and_then(|s| s.gpu_type.as_deref());
    if let (Some(asked), Some(has)) = (req.gpu_type.as_deref(), job_type) {
        if asked != has {
            return Err(invalid(format!(
                "the step asks for {asked} GPUs but job {} holds {has} GPUs; leave the type \
                 out, or give {has}",
                job.id
            )));
        }
    }
    for &r in &plan.ranks {
        let a = &job.allocs[r];
        let has = a.gpu_ids.len() as u32;
        if want > has {
            return Err(invalid(format!(
                "the step asks for {want} GPU(s) on node {} but job {} has {has} there; ask \
                 for {has} at most, or submit the job with more",
                a.node, job.id
            )));
        }
    }
    Ok((!req.overlap).then_some(want))
}

/// The job's GPU ids on `node` that its running steps hold, each with the step that holds it.
pub fn held(job: &JobRecord, node: &str) -> BTreeMap<u32, u32> {
    let mut held = BTreeMap::new();
    for step in &job.steps {
        let mine = step.nodes.iter().filter(|n| n.node == node);
        for n in mine.filter(|n| n.exit.is_none()) {
            held.extend(n.gpu_ids.iter().map(|&g| (g, step.id)));
        }
    }
    held
}

/// Why a step cannot have its GPUs yet: the first of its nodes without enough free.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Busy {
    /// The node.
    pub node: String,
    /// GPUs the step needs there.
    pub want: u32,
    /// GPUs the job has there.
    pub has: u32,
    /// Of those, free.
    pub free: u32,
    /// The steps that hold the others.
    pub holders: Vec<u32>,
}

impl std::fmt::Display for Busy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let steps: Vec<String> = self.holders.iter().map(u32::to_string).collect();
        write!(
            f,
            "step waiting: GPUs held by step{} {} (job has {} on {}, {} free, the step needs \
             {}); it starts when they end",
            if steps.len() == 1 { "" } else { "s" },
            steps.join(", "),
            self.has,
            self.node,
            self.free,
            self.want
        )
    }
}

/// The GPU ids a step that holds `want` on each of `plan`'s nodes is given there: the
/// lowest of the job's ids on each (in the job's order) that no running step holds.
///
/// Errors: [`Busy`] for the first node with fewer free (an expected outcome: the step
/// waits for the holders to end).
pub fn pick(job: &JobRecord, plan: &Plan, want: u32) -> Result<Vec<Vec<u32>>, Busy> {
    let mut given = Vec::with_capacity(plan.ranks.len());
    for &r in &plan.ranks {
        let a = &job.allocs[r];
        let held = held(job, &a.node);
        let free: Vec<u32> = (a.gpu_ids.iter())
            .copied()
            .filter(|g| !held.contains_key(g))
            .collect();
        if (free.len() as u32) < want {
            let mut holders: Vec<u32> = held.values().copied().collect();
            holders.sort_unstable();
            holders.dedup();
            return Err(Busy {
                node: a.node.clone(),
                want,
                has: a.gpu_ids.len() as u32,
                free: free.len() as u32,
                holders,
            });
        }
        given.push(free[..want as usize].to_vec());
    }
    Ok(given)
}

/// The GPU ids a step's tasks on node `n` get of `job_ids` (the job's there): those the step
/// holds, or all the job's where it holds none.
pub fn visible(gpus_per_node: Option<u32>, n: &StepNode, job_ids: &[u32]) -> Vec<u32> {
    match gpus_per_node {
        Some(_) => n.gpu_ids.clone(),
        None => job_ids.to_vec(),
    }
}
