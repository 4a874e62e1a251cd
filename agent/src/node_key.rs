//! The node's own key. The cluster's join token only lets an agent join: the agent makes a
//! key for its node (32 random bytes), keeps it in its state directory (`node-key`, root's,
//! 0600), and then joins with it; every other request carries it. Made and kept before the
//! join, the key survives a join whose answer is lost (the controller takes the same key
//! again) and a restart (the agent is the same node without the join token).

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use wharf_api::wire::{is_node_key, JoinRequest, JoinResponse, NODE_KEY_PREFIX};
use wharf_client::ClientError;
use wharf_runtime::JobDir;

use crate::AgentConfig;

/// Longest wait between tries to join.
const MAX_BACKOFF: Duration = Duration::from_secs(60);

/// The file the key is kept in: the node's name, then the key, a line each.
fn file(cfg: &AgentConfig) -> PathBuf {
    cfg.state_dir.join("node-key")
}

/// The node's key: the one kept for this name, unless `fresh` (the controller refused it);
/// else a new one, kept, then joined with. Waits, retrying with a growing pause, until the
/// controller takes it.
pub async fn obtain(cfg: &AgentConfig, fresh: bool) -> String {
    if !fresh {
        if let Some(key) = kept(cfg) {
            return key;
        }
    }
    let key = loop {
        match new_key() {
            Ok(k) => break k,
            Err(e) => {
                tracing::error!(error = %e, "no random bytes for the node's key; trying again");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    };
    // Kept before it is sent: a key the controller takes and the agent loses would shut the
    // node out until an admin forgets it.
    let mut pause = Duration::from_secs(1);
    while let Err(e) = save(cfg, &key) {
        tracing::error!(error = %e, file = %file(cfg).display(), "cannot keep the node's key; it is not sent before it is kept");
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(MAX_BACKOFF);
    }
    if cfg.token.is_empty() {
        tracing::error!(node = %cfg.node_name, "this node must join again, and the agent has no join token: copy the controller's join-token file to the node and restart the agent");
    }
    let joiner = cfg.client(cfg.token.clone());
    let req = JoinRequest {
        node: cfg.node_name.clone(),
        key: key.clone(),
    };
    pause = Duration::from_secs(1);
    loop {
        match joiner.post::<_, JoinResponse>("/v1/agent/join", &req).await {
            Ok(_) => {
                tracing::info!(node = %cfg.node_name, "joined the cluster with a key of this node's own");
                return key;
            }
            // Joined already, with a key this agent does not hold: an admin must forget it.
            Err(e @ ClientError::Api { status: 409, .. }) => {
                tracing::error!(error = %e, "cannot join");
            }
            Err(e) => tracing::warn!(error = %e, "joining failed; retrying"),
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(MAX_BACKOFF);
    }
}

/// The key kept for this node's name, if any.
pub fn kept(cfg: &AgentConfig) -> Option<String> {
    let text = std::fs::read_to_string(file(cfg)).ok()?;
    let mut lines = text.lines();
    let (name, key) = (lines.next()?, lines.next()?.trim());
    (name == cfg.node_name && is_node_key(key)).then(|| key.to_string())
}

/// A new key: [`NODE_KEY_PREFIX`] and 32 bytes from the kernel, as hex.
fn new_key() -> std::io::Result<String> {
    Ok(format!(
        "{NODE_KEY_PREFIX}{}",
        wharf_client::random_hex(32)?
    ))
}

/// Keeps `key`: written beside the file (root's, 0600, never through a link), synced,
/// renamed over it, and the rename synced.
fn save(cfg: &AgentConfig, key: &str) -> std::io::Result<()> {
    let path = file(cfg);
    let tmp = cfg.state_dir.join(".node-key.new");
    let mut f = JobDir::open_private(&tmp, false)?;
    writeln!(f, "{}\n{key}", cfg.node_name)?;
    f.sync_all()?;
    std::fs::rename(&tmp, &path)?;
    std::fs::File::open(&cfg.state_dir)?.sync_all()
}
