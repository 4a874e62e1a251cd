//! An admin's pre-pull of a registry image on chosen nodes (`wharf image pull REF --nodes
//! A,B`): the controller hands each node a [`PullOrder`], each agent pulls with the node's own
//! credentials and reports a [`NodePull`] with its polls, and the CLI follows the [`PrePull`]
//! until every node is done. Kept by the controller in memory only: a pre-pull is a request to
//! warm caches, not a record, and a controller restart forgets it (the CLI then says so).

use serde::{Deserialize, Serialize};

/// `POST /v1/images/pull`: pull `image` on `nodes`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PrePullRequest {
    /// A registry reference (`ubuntu:24.04`, `docker://...`, `host:5000/team/app@sha256:...`).
    pub image: String,
    /// Node names; each must be registered and UP.
    pub nodes: Vec<String>,
}

/// A pull for an agent to make (sent with each poll until the agent reports it finished).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PullOrder {
    /// The pre-pull it belongs to.
    pub id: u64,
    /// The reference, as the controller parsed it (canonical form).
    pub image: String,
}

/// Where one node's part of a pre-pull stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NodePullState {
    /// Ordered, not yet reported by the node.
    Waiting,
    /// The node is pulling.
    Pulling,
    /// In the node's store.
    Done,
    /// The node could not pull it; `message` says why.
    Failed,
}

impl NodePullState {
    /// Done or failed: nothing more will come of it.
    pub fn is_final(self) -> bool {
        matches!(self, NodePullState::Done | NodePullState::Failed)
    }
}

/// One node's part of a pre-pull: reported by its agent (`node` empty there) and shown by
/// the controller.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodePull {
    /// The pre-pull.
    pub id: u64,
    /// The node; empty in an agent's poll (the poll names its node).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub node: String,
    /// Where it stands.
    pub state: NodePullState,
    /// How far the pull has come (its `job` is 0).
    #[serde(default)]
    pub progress: crate::pull::PullProgress,
    /// When done: the image's manifest digest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
    /// When done: no layer was downloaded (each was in the node's store, or in the shared
    /// layer cache).
    #[serde(default)]
    pub cached: bool,
    /// When failed: why (the registry's reason, or the node's).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}

impl NodePull {
    /// Most entries one poll may carry: beyond, the controller keeps none of them.
    pub const MAX_PER_POLL: usize = 256;

    /// `pulling IMAGE: 2.1 of 8.4 GB, 3 of 14 layers`, `pulled (sha256:...)`, `failed: why`,
    /// `waiting for the node`. Not escaped: callers that print it clean it.
    pub fn describe(&self) -> String {
        match self.state {
            NodePullState::Waiting => "waiting for the node".into(),
            NodePullState::Pulling => format!("pulling: {}", self.progress.counts()),
            NodePullState::Done if self.cached => format!(
                "pulled {} (no layer downloaded: all were in the node's store or the shared \
                 cache)",
                self.digest.as_deref().unwrap_or("?")
            ),
            NodePullState::Done => format!(
                "pulled {} ({} layers, {})",
                self.digest.as_deref().unwrap_or("?"),
                self.progress.layers,
                crate::pull::bytes_of(self.progress.bytes_done, self.progress.bytes)
            ),
            NodePullState::Failed => format!("failed: {}", self.message),
        }
    }
}

/// A pre-pull as the controller sees it (`POST /v1/images/pull` and
/// `GET /v1/images/pull/{id}`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PrePull {
    /// Its id (per controller run).
    pub id: u64,
    /// The reference, in canonical form.
    pub image: String,
    /// Who asked.
    pub by: String,
    /// Each node's part, in the order asked.
    pub nodes: Vec<NodePull>,
}

impl PrePull {
    /// Every node done or failed.
    pub fn finished(&self) -> bool {
        self.nodes.iter().all(|n| n.state.is_final())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_pull_is_described_by_its_state() {
        let mut n = NodePull {
            id: 1,
            node: "n1".into(),
            state: NodePullState::Waiting,
            progress: Default::default(),
            digest: None,
            cached: false,
            message: String::new(),
        };
        assert_eq!(n.describe(), "waiting for the node");
        n.state = NodePullState::Pulling;
        assert_eq!(n.describe(), "pulling: resolving");
        n.progress.layers = 2;
        n.progress.layers_done = 1;
        n.progress.bytes = 2_000_000;
        n.progress.bytes_done = 1_000_000;
        assert_eq!(n.describe(), "pulling: 1.0 of 2.0 MB, 1 of 2 layers");
        n.state = NodePullState::Done;
        n.digest = Some("sha256:ab".into());
        n.progress.bytes_done = 2_000_000;
        assert_eq!(n.describe(), "pulled sha256:ab (2 layers, 2.0 of 2.0 MB)");
        n.cached = true;
        assert_eq!(
            n.describe(),
            "pulled sha256:ab (no layer downloaded: all were in the node's store or the shared \
             cache)"
        );
        n.state = NodePullState::Failed;
        n.message = "MANIFEST_UNKNOWN".into();
        assert_eq!(n.describe(), "failed: MANIFEST_UNKNOWN");
        assert!(n.state.is_final() && !NodePullState::Pulling.is_final());
        // The node's own report carries no node name.
        n.node.clear();
        assert!(serde_json::to_value(&n).unwrap().get("node").is_none());
    }
}
