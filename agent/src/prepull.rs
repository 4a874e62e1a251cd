//! Admins' pre-pulls on this node (`wharf image pull REF --nodes ...`), off the poll loop.
//!
//! Each [`PullOrder`] the controller sends starts one pull on a thread of its own, with the
//! node's credentials (`[images] auth_file`): into the store on a node running Wharf's own
//! sandbox, through the engine on a Docker node. Its part ([`NodePull`]) is reported with
//! every poll, its progress waking a report as a job's pull does; once finished it is kept
//! until the controller stops sending its order (so a lost answer costs nothing), then
//! dropped.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use wharf_api::prepull::{NodePull, NodePullState, PullOrder};
use wharf_images::{ImageRef, ImageStore, PullEvent};

use crate::images::Progress;
use crate::{AgentConfig, BackendKind};

/// This node's parts of pre-pulls, by id. Cheap to clone; clones share them.
#[derive(Debug, Clone, Default)]
pub struct PrePulls {
    parts: Arc<Mutex<BTreeMap<u64, Part>>>,
    /// Woken at each step of a pre-pull.
    progressed: Arc<tokio::sync::Notify>,
}

#[derive(Debug, Clone)]
struct Part {
    state: NodePullState,
    progress: Progress,
    digest: Option<String>,
    fetched: bool,
    message: String,
}

impl PrePulls {
    /// The parts to report, by id.
    pub fn reports(&self) -> Vec<NodePull> {
        let Ok(parts) = self.parts.lock() else {
            return vec![];
        };
        parts
            .iter()
            .map(|(id, p)| NodePull {
                id: *id,
                node: String::new(),
                state: p.state,
                progress: p.progress.report(0),
                digest: p.digest.clone(),
                cached: p.state == NodePullState::Done && !p.fetched,
                message: p.message.clone(),
            })
            .collect()
    }

    /// Waits until a pre-pull made a step (or began, or ended).
    pub async fn progressed(&self) {
        self.progressed.notified().await;
    }

    fn update(&self, id: u64, change: impl FnOnce(&mut Part)) {
        if let Ok(mut parts) = self.parts.lock() {
            if let Some(p) = parts.get_mut(&id) {
                change(p);
            }
        }
        self.progressed.notify_one();
    }

    /// Takes in the poll's orders: drops finished parts no longer ordered, and starts a pull
    /// for each order not seen yet (`pull` runs it, on a thread of its own, reporting its
    /// events; its error is the part's message).
    pub fn take(
        &self,
        orders: &[PullOrder],
        pull: impl Fn(&ImageRef, &mut dyn FnMut(PullEvent)) -> Result<String, String>
            + Clone
            + Send
            + 'static,
    ) {
        let fresh: Vec<&PullOrder> = {
            let Ok(mut parts) = self.parts.lock() else {
                return;
            };
            parts.retain(|id, p| !p.state.is_final() || orders.iter().any(|o| o.id == *id));
            let fresh: Vec<&PullOrder> = orders
                .iter()
                .filter(|o| !parts.contains_key(&o.id))
                .collect();
            for o in &fresh {
                parts.insert(
                    o.id,
                    Part {
                        state: NodePullState::Pulling,
                        progress: Progress::of(&o.image),
                        digest: None,
                        fetched: false,
                        message: String::new(),
                    },
                );
            }
            fresh
        };
        for order in fresh {
            let id = order.id;
            let reference: ImageRef = match order.image.parse() {
                Ok(r) => r,
                Err(why) => {
                    self.update(id, |p| {
                        p.state = NodePullState::Failed;
                        p.message = format!("{:?} is not a registry reference: {why}", order.image);
                    });
                    continue;
                }
            };
            tracing::info!(id, image = %reference, "pre-pulling");
            let (me, pull) = (self.clone(), pull.clone());
            let spawned = std::thread::Builder::new()
                .name(format!("prepull-{id}"))
                .spawn(move || {
                    let result = pull(&reference, &mut |event| {
                        me.update(id, |p| {
                            p.progress.apply(&event);
                            if matches!(event, PullEvent::Layer { fetched: true, .. }) {
                                p.fetched = true;
                            }
                        });
                    });
                    match &result {
                        Ok(digest) => {
                            tracing::info!(id, image = %reference, %digest, "pre-pulled")
                        }
                        Err(e) => {
                            tracing::warn!(id, image = %reference, error = %e, "pre-pull failed")
                        }
                    }
                    me.update(id, |p| match result {
                        Ok(digest) => {
                            p.state = NodePullState::Done;
                            p.digest = Some(digest);
                        }
                        Err(e) => {
                            p.state = NodePullState::Failed;
                            p.message = e;
                        }
                    });
                });
            if let Err(e) = spawned {
                self.update(id, |p| {
                    p.state = NodePullState::Failed;
                    p.message = format!("cannot start the pull thread: {e}");
                });
            }
        }
    }
}

/// Pulls `reference` as this node does for a pre-pull: into `store` with the node's
/// credentials, or through the Docker engine on a Docker node. Returns the image's digest,
/// or the reason, naming the node.
pub fn pull_on_node(
    cfg: &AgentConfig,
    store: &ImageStore,
    reference: &ImageRef,
    progress: &mut dyn FnMut(PullEvent),
) -> Result<String, String> {
    let pulled = match &cfg.backend {
        BackendKind::Oci => store
            .pull(reference, &cfg.registry, progress)
            .map(|info| info.digest)
            .map_err(|e| e.to_string()),
        BackendKind::Docker(socket) => {
            crate::engine::docker_pull(socket, reference, &cfg.registry, None, progress)
                .map_err(|e| e.to_string())
        }
    };
    pulled.map_err(|e| format!("pulling image {reference} on node {}: {e}", cfg.node_name))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn order(id: u64, image: &str) -> PullOrder {
        PullOrder {
            id,
            image: image.into(),
        }
    }

    fn wait_final(p: &PrePulls, id: u64) -> NodePull {
        loop {
            let r = p.reports().into_iter().find(|r| r.id == id).unwrap();
            if r.state.is_final() {
                return r;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }

    #[test]
    fn each_order_is_pulled_once_reported_and_dropped_once_no_longer_ordered() {
        let p = PrePulls::default();
        let runs = Arc::new(Mutex::new(Vec::new()));
        let r = runs.clone();
        let pull = move |reference: &ImageRef, progress: &mut dyn FnMut(PullEvent)| {
            r.lock().unwrap().push(reference.to_string());
            if reference.repository.ends_with("missing") {
                return Err("MANIFEST_UNKNOWN".to_string());
            }
            progress(PullEvent::Resolved {
                digest: "sha256:m".into(),
                layers: 1,
                bytes: 10,
            });
            let fetched = reference.repository.ends_with("new");
            progress(PullEvent::Layer {
                index: 1,
                digest: "sha256:l".into(),
                size: 10,
                fetched,
            });
            Ok("sha256:m".to_string())
        };
        let orders = [
            order(1, "127.0.0.1:5000/t/new:v1"),
            order(2, "127.0.0.1:5000/t/old:v1"),
            order(3, "127.0.0.1:5000/t/missing:v1"),
            order(4, "Bad:Ref"),
        ];
        p.take(&orders, pull.clone());
        let one = wait_final(&p, 1);
        assert_eq!(one.state, NodePullState::Done);
        assert_eq!(one.digest.as_deref(), Some("sha256:m"));
        assert!(!one.cached);
        assert_eq!((one.progress.layers_done, one.progress.bytes_done), (1, 10));
        assert!(wait_final(&p, 2).cached, "nothing downloaded");
        assert_eq!(wait_final(&p, 3).describe(), "failed: MANIFEST_UNKNOWN");
        assert!(wait_final(&p, 4)
            .message
            .contains("not a registry reference"));
        // The same orders again start nothing; once gone, their finished parts go too.
        p.take(&orders, pull.clone());
        assert_eq!(runs.lock().unwrap().len(), 3);
        p.take(&orders[..1], pull);
        let left: Vec<u64> = p.reports().iter().map(|r| r.id).collect();
        assert_eq!(left, [1]);
    }
}
