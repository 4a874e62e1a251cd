//! Admins' pre-pulls (`wharf image pull REF --nodes A,B`): each named node's agent is ordered
//! to pull the image into its store, and reports how far it has come with its polls. Kept in
//! memory only (see [`wharf_api::prepull`]); the most recent [`KEPT`] are kept, and those
//! whose every node is finished go first when that many are reached.
//!
//! ```text
//! Waiting --(node reports it)--> Pulling --> Done | Failed
//!    \-----------(node DOWN, or reports it finished at once)----^
//! ```
//!
//! A node that goes DOWN before finishing fails its part ("node n1 is DOWN"): the pull may
//! still end there, but nobody is waiting for it.

use std::collections::BTreeMap;

use wharf_api::image_ref::ImageRef;
use wharf_api::prepull::{NodePull, NodePullState, PrePull, PrePullRequest, PullOrder};
use wharf_api::wire::ErrorKind;

use super::{Caller, Cluster, Failure};

/// Most pre-pulls kept at once.
pub const KEPT: usize = 64;
/// Most nodes one pre-pull may name.
pub const MAX_NODES: usize = 10_000;

/// The pre-pulls, by id.
#[derive(Debug, Default)]
pub struct PrePulls {
    next: u64,
    pulls: BTreeMap<u64, PrePull>,
}

impl Cluster {
    /// Starts `req` for `caller`, who must be an admin; every node must be registered and UP.
    ///
    /// Errors: `PermissionDenied` for a non-admin; `InvalidInput` for a reference that is not
    /// a registry image, an empty node list or a node that is not UP; `NotFound` naming the
    /// nodes not registered; `Unavailable` when [`KEPT`] pre-pulls are all under way.
    pub fn start_prepull(
        &mut self,
        caller: &Caller,
        req: &PrePullRequest,
    ) -> Result<PrePull, Failure> {
        if !caller.admin {
            return Err(Failure::new(
                ErrorKind::PermissionDenied,
                format!(
                    "only an admin may pull images on nodes (user {} is not one); pull into a \
                     store of your own with `wharf image pull REF --store DIR`, or name the \
                     image in a job and its node pulls it",
                    caller.owner.user
                ),
            ));
        }
        let image: ImageRef = req.image.parse().map_err(|why| {
            Failure::new(
                ErrorKind::InvalidInput,
                format!("{:?} is not a registry image reference: {why}", req.image),
            )
        })?;
        if req.nodes.is_empty() {
            return Err(Failure::new(
                ErrorKind::InvalidInput,
                "name the nodes to pull on (--nodes A,B)",
            ));
        }
        if req.nodes.len() > MAX_NODES {
            return Err(Failure::new(
                ErrorKind::InvalidInput,
                format!("at most {MAX_NODES} nodes per pull"),
            ));
        }
        let mut names: Vec<String> = Vec::new();
        for n in &req.nodes {
            if !names.contains(n) {
                names.push(n.clone());
            }
        }
        let unknown: Vec<&str> = names
            .iter()
            .filter(|n| !self.nodes.contains_key(*n))
            .map(String::as_str)
            .collect();
        if !unknown.is_empty() {
            let known: Vec<&str> = self.nodes.keys().map(String::as_str).collect();
            return Err(Failure::new(
                ErrorKind::NotFound,
                format!(
                    "no node {} (the nodes are: {})",
                    unknown
                        .iter()
                        .map(|n| format!("{n:?}"))
                        .collect::<Vec<_>>()
                        .join(", "),
                    if known.is_empty() {
                        "none".to_string()
                    } else {
                        known.join(", ")
                    }
                ),
            ));
        }
        if let Some(down) = names.iter().find(|n| !self.nodes[*n].up) {
            return Err(Failure::new(
                ErrorKind::InvalidInput,
                format!("node {down:?} is DOWN; it cannot pull until its agent is back"),
            ));
        }
        let p = &mut self.prepulls;
        if p.pulls.len() >= KEPT {
            let oldest_finished = p.pulls.iter().find(|(_, v)| v.finished()).map(|(k, _)| *k);
            match oldest_finished {
                Some(id) => {
                    p.pulls.remove(&id);
                }
                None => {
                    return Err(Failure::new(
                        ErrorKind::Unavailable,
                        format!("{KEPT} pre-pulls are under way; try again once one ends"),
                    ))
                }
            }
        }
        p.next += 1;
        let id = p.next;
        let pull = PrePull {
            id,
            image: image.to_string(),
            by: caller.owner.user.clone(),
            nodes: names
                .into_iter()
                .map(|node| NodePull {
                    id,
                    node,
                    state: NodePullState::Waiting,
                    progress: Default::default(),
                    digest: None,
                    cached: false,
                    message: String::new(),
                })
                .collect(),
        };
        tracing::info!(id, image = %pull.image, by = %pull.by, nodes = pull.nodes.len(), "pre-pull ordered");
        p.pulls.insert(id, pull.clone());
        Ok(pull)
    }

    /// Pre-pull `id`, as it stands now (nodes that went DOWN meanwhile count as failed).
    ///
    /// Errors: `PermissionDenied` for a non-admin; `NotFound` for an id not kept.
    pub fn prepull(&mut self, caller: &Caller, id: u64) -> Result<PrePull, Failure> {
        if !caller.admin {
            return Err(Failure::new(
                ErrorKind::PermissionDenied,
                "only an admin may follow pulls on nodes",
            ));
        }
        let nodes = &self.nodes;
        let pull = self.prepulls.pulls.get_mut(&id).ok_or_else(|| {
            Failure::new(
                ErrorKind::NotFound,
                format!(
                    "no pre-pull {id} (the controller keeps the last {KEPT}, and forgets them \
                     when it restarts)"
                ),
            )
        })?;
        for n in &mut pull.nodes {
            if !n.state.is_final() && !nodes.get(&n.node).is_some_and(|e| e.up) {
                n.state = NodePullState::Failed;
                n.message = format!("node {} is DOWN", n.node);
            }
        }
        Ok(pull.clone())
    }

    /// The pulls `node` must make, under way there or not: its unfinished parts.
    pub fn pull_orders(&self, node: &str) -> Vec<PullOrder> {
        self.prepulls
            .pulls
            .values()
            .filter(|p| {
                p.nodes
                    .iter()
                    .any(|n| n.node == node && !n.state.is_final())
            })
            .map(|p| PullOrder {
                id: p.id,
                image: p.image.clone(),
            })
            .collect()
    }

    /// Takes in `node`'s reports of its parts; a finished part is final.
    pub(super) fn take_prepulls(&mut self, node: &str, reported: &[NodePull]) {
        if reported.len() > NodePull::MAX_PER_POLL {
            tracing::warn!(
                node,
                prepulls = reported.len(),
                "a node reported too many pre-pulls; none kept"
            );
            return;
        }
        for r in reported {
            let Some(part) = self
                .prepulls
                .pulls
                .get_mut(&r.id)
                .and_then(|p| p.nodes.iter_mut().find(|n| n.node == node))
            else {
                continue;
            };
            if part.state.is_final() || r.state == NodePullState::Waiting {
                continue;
            }
            let mut r = r.clone();
            r.node = node.to_string();
            r.progress.image =
                wharf_api::text::bounded(&r.progress.image, wharf_api::PullProgress::MAX_IMAGE_LEN)
                    .into_owned();
            r.message =
                wharf_api::text::bounded(&r.message, wharf_api::text::MAX_MESSAGE).into_owned();
            if r.state.is_final() {
                tracing::info!(id = r.id, node, state = ?r.state, message = %r.message, "pre-pull part finished");
            }
            *part = r;
        }
    }
}

#[cfg(test)]
mod tests;
