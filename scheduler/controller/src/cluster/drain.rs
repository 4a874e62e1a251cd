//! Drained nodes: a node keeps its running jobs and takes no new ones, with a reason (Slurm's
//! `Reason=`). A launch that failed through the node's fault drains it at once; an admin
//! drains or resumes a node with `wharf nodes --drain NODE --reason TEXT` / `--resume NODE`.
//! Drains are stored, so a restarted controller keeps them.

use wharf_api::admin::{AdminKind, AuditEntry};
use wharf_api::fault::FaultKind;
use wharf_api::wire::{ErrorKind, NodeStateChange, NodeStateRequest};
use wharf_api::{ExitInfo, JobId, NodeRecord};

use super::{Caller, Cluster, Failure};

/// How long a drain reason may be: it is shown in `wharf nodes` to every user.
const MAX_REASON: usize = 512;

/// Why a node is drained, and since when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Drain {
    pub reason: String,
    pub since: u64,
}

/// The drain reason for a launch of job `id` that failed through its node's fault, when
/// `exit` says so.
pub(super) fn fault_reason(id: JobId, exit: &ExitInfo) -> Option<String> {
    let fault = exit.fault.filter(|f| f.kind == FaultKind::Node)?;
    let words = exit.message.as_deref().unwrap_or("no reason given");
    Some(format!(
        "launch of job {id} failed ({}): {words}",
        fault.code
    ))
}

impl Cluster {
    /// Drains `node` with `reason` (stored first; a drained node's reason is replaced).
    pub(super) fn drain(&mut self, node: &str, reason: &str, now: u64) -> Result<(), Failure> {
        let reason =
            wharf_api::text::bounded(&wharf_api::text::printable(reason), MAX_REASON).into_owned();
        let Some(entry) = self.nodes.get_mut(node) else {
            return Err(no_node(node));
        };
        self.store.set_drain(node, Some((&reason, now)))?;
        tracing::warn!(node, %reason, "node drained");
        entry.drain = Some(Drain { reason, since: now });
        Ok(())
    }

    /// Drains or resumes a node as an admin asks (`wharf nodes --drain/--resume`), recorded in
    /// the admin audit. Returns the node as it is then.
    pub fn set_node_state(
        &mut self,
        caller: &Caller,
        node: &str,
        req: &NodeStateRequest,
        now: u64,
    ) -> Result<NodeRecord, Failure> {
        if !caller.admin {
            return Err(Failure::new(
                ErrorKind::PermissionDenied,
                "only an admin may drain or resume a node",
            ));
        }
        let record = |c: &Self| {
            c.nodes()
                .into_iter()
                .find(|n| n.info.name == node)
                .ok_or_else(|| no_node(node))
        };
        let before = record(self)?;
        let command = match req.state {
            NodeStateChange::Drain => format!(
                "node drain {node} reason={}",
                req.reason.as_deref().unwrap_or("").trim()
            ),
            NodeStateChange::Resume => format!("node resume {node}"),
        };
        match req.state {
            NodeStateChange::Drain => {
                let reason = req.reason.as_deref().map(str::trim).unwrap_or("");
                if reason.is_empty() {
                    return Err(Failure::new(
                        ErrorKind::InvalidInput,
                        "a drain needs a reason (--reason TEXT): it is what `wharf nodes` shows",
                    ));
                }
                let reason = format!("{reason} [by {}]", caller.owner.user);
                self.drain(node, &reason, now)?;
            }
            NodeStateChange::Resume => {
                if req.reason.is_some() {
                    return Err(Failure::new(
                        ErrorKind::InvalidInput,
                        "a resume takes no reason",
                    ));
                }
                self.store.set_drain(node, None)?;
                if let Some(entry) = self.nodes.get_mut(node) {
                    if let Some(d) = entry.drain.take() {
                        tracing::info!(node, was = %d.reason, by = %caller.owner.user, "node resumed");
                    }
                }
            }
        }
        let after = record(self)?;
        // Audited as `wharf admin` changes are: who, what and when, the state before and after.
        let view =
            |n: &NodeRecord| serde_json::json!({ "state": n.state.as_str(), "reason": n.reason });
        let entry = AuditEntry {
            id: 0,
            time: now,
            uid: caller.owner.uid,
            user: caller.owner.user.clone(),
            command,
            kind: AdminKind::Node,
            name: node.to_string(),
            old: Some(view(&before)),
            new: Some(view(&after)),
        };
        self.store.change_associations(&[], &entry)?;
        Ok(after)
    }
}

fn no_node(node: &str) -> Failure {
    Failure::new(ErrorKind::NotFound, format!("no node {node:?}"))
}

#[cfg(test)]
pub(super) mod tests;
