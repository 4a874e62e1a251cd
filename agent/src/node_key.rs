//! The node's own key. The cluster's join token only lets an agent join: the controller
//! answers a join with a key for this node's name, which every other request carries. The key
//! is kept in the agent's state directory (`node-key`, root's, 0600), so that a restarted
//! agent is the same node; the join token is not needed again after the first join.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::time::Duration;

use wharf_api::wire::{JoinRequest, JoinResponse};
use wharf_client::{Client, ClientError};

use crate::AgentConfig;

/// What a key starts with (the controller's prefix).
const KEY_PREFIX: &str = "wnk_";

/// The file the key is kept in: the node's name, then the key, a line each.
pub fn file(cfg: &AgentConfig) -> PathBuf {
    cfg.state_dir.join("node-key")
}

/// The node's key: the one kept, unless `fresh` or it is for another name; else a new one
/// from a join, kept for next time. Waits, retrying, until the controller gives one.
pub async fn obtain(cfg: &AgentConfig, fresh: bool) -> String {
    if !fresh {
        if let Some(key) = load(cfg) {
            return key;
        }
    }
    let joiner = Client::new(cfg.controller.clone(), Some(cfg.token.clone()));
    let req = JoinRequest {
        node: cfg.node_name.clone(),
    };
    loop {
        match joiner.post::<_, JoinResponse>("/v1/agent/join", &req).await {
            Ok(JoinResponse { key }) => {
                if let Err(e) = save(cfg, &key) {
                    tracing::error!(error = %e, file = %file(cfg).display(), "cannot keep the node's key; the agent must join again after a restart");
                }
                tracing::info!(node = %cfg.node_name, "joined the cluster with a key of this node's own");
                return key;
            }
            // Joined already, with a key this agent does not hold: an admin must forget it.
            Err(e @ ClientError::Api { status: 409, .. }) => {
                tracing::error!(error = %e, "cannot join");
                tokio::time::sleep(Duration::from_secs(10)).await;
            }
            Err(e) => {
                tracing::warn!(error = %e, "joining failed; retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
}

/// The key kept for this node's name, if any.
fn load(cfg: &AgentConfig) -> Option<String> {
    let text = std::fs::read_to_string(file(cfg)).ok()?;
    let mut lines = text.lines();
    let (name, key) = (lines.next()?, lines.next()?.trim());
    (name == cfg.node_name && key.starts_with(KEY_PREFIX) && !key.contains(char::is_whitespace))
        .then(|| key.to_string())
}

/// Keeps `key`: written beside the file, 0600, then renamed over it.
fn save(cfg: &AgentConfig, key: &str) -> std::io::Result<()> {
    let path = file(cfg);
    let tmp = cfg.state_dir.join(".node-key.new");
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)?;
    writeln!(f, "{}\n{key}", cfg.node_name)?;
    f.sync_all()?;
    std::fs::rename(&tmp, &path)
}
