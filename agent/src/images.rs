//! Pulling a job's registry image on demand, off the poll loop.
//!
//! A launch whose image is a registry reference that the store does not hold yet is handed to
//! a thread of its own: it pulls (two jobs asking for one image wait on the store's per-layer
//! locks and download each layer once), then launches as usual. Meanwhile the controller
//! repeats the launch order at each poll; [`Pulls`] remembers the jobs whose pull is under way
//! so the order is not started twice. A failed pull ends the job with the registry's reason.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use wharf_api::wire::LaunchOrder;
use wharf_images::{ImageRef, ImageStore, Pin};

use crate::{AgentConfig, BackendKind};

/// The jobs whose image is being pulled, and the image pins held for launched jobs. Cheap to
/// clone; clones share them.
#[derive(Debug, Clone, Default)]
pub struct Pulls {
    jobs: Arc<Mutex<BTreeSet<u64>>>,
    /// Per job, its image's pin from its launch until it is seen ended: the job's shim pins
    /// the image too, for its whole life, but only once it runs.
    pins: Arc<Mutex<BTreeMap<u64, Pin>>>,
}

impl Pulls {
    /// Keeps `pin` (job `id`'s image) until [`Pulls::keep_pins`] no longer lists the job.
    pub fn hold(&self, id: u64, pin: Pin) {
        if let Ok(mut pins) = self.pins.lock() {
            pins.insert(id, pin);
        }
    }

    /// Drops the pins of the jobs that are neither in `running` nor being pulled.
    pub fn keep_pins(&self, running: &BTreeSet<u64>) {
        let pulling = self.jobs.lock().map(|j| j.clone()).unwrap_or_default();
        if let Ok(mut pins) = self.pins.lock() {
            pins.retain(|id, _| running.contains(id) || pulling.contains(id));
        }
    }

    /// The jobs whose image pin is held.
    pub fn pinned(&self) -> Vec<u64> {
        self.pins
            .lock()
            .map(|p| p.keys().copied().collect())
            .unwrap_or_default()
    }

    /// Whether job `id`'s pull is under way.
    pub fn pulling(&self, id: u64) -> bool {
        self.jobs.lock().is_ok_and(|j| j.contains(&id))
    }

    /// Runs `pull_then_launch` for job `id` on a thread of its own, unless one already runs
    /// for it; the job counts as pulling until the closure returns (it has launched by then,
    /// so a repeated order finds the job's directory).
    pub fn spawn(&self, id: u64, pull_then_launch: impl FnOnce() + Send + 'static) {
        {
            let Ok(mut jobs) = self.jobs.lock() else {
                return;
            };
            if !jobs.insert(id) {
                return;
            }
        }
        let jobs = self.jobs.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("pull-{id}"))
            .spawn(move || {
                pull_then_launch();
                if let Ok(mut j) = jobs.lock() {
                    j.remove(&id);
                }
            });
        if let Err(e) = spawned {
            tracing::error!(job = id, error = %e, "cannot start the pull thread");
            if let Ok(mut j) = self.jobs.lock() {
                j.remove(&id);
            }
        }
    }
}

/// The registry reference `image` names, when this node must pull it before launching:
/// Wharf's own sandbox, not the host or a SIF file, not an imported image, not pulled yet.
pub fn to_pull(cfg: &AgentConfig, store: &ImageStore, image: &str) -> Option<ImageRef> {
    if cfg.backend != BackendKind::Oci
        || image == "host"
        || image.starts_with('/')
        || store.get(image).is_ok()
    {
        return None;
    }
    let reference: ImageRef = image.parse().ok()?;
    store.pulled(&reference).is_none().then_some(reference)
}

/// Pulls `reference` for job `order`, logging progress; returns the image pinned until the
/// launch holds its own pin. The error says what the registry said.
pub fn pull_for(
    cfg: &AgentConfig,
    store: &ImageStore,
    order: &LaunchOrder,
    reference: &ImageRef,
) -> Result<Pin, String> {
    tracing::info!(job = order.id, image = %reference, "pulling");
    store
        .pull_pinned(reference, &cfg.registry, &mut |event| {
            if let wharf_images::PullEvent::Layer {
                index,
                digest,
                size,
                fetched,
            } = &event
            {
                tracing::debug!(job = order.id, layer = index, %digest, size, fetched, "layer ready");
            }
        })
        .map(|(info, pin)| {
            tracing::info!(job = order.id, image = %reference, digest = %info.digest, "pulled");
            pin
        })
        .map_err(|e| format!("pulling image {reference} on node {}: {e}", cfg.node_name))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::mpsc;

    /// Whether someone holds the pin file beside `rootfs` (an exclusive probe).
    fn held(rootfs: &std::path::Path) -> bool {
        let f = std::fs::File::open(rootfs.with_file_name("pin")).unwrap();
        let fd = std::os::fd::AsRawFd::as_raw_fd(&f);
        // SAFETY: flock on a descriptor owned by `f`, closed (and the lock with it) on return.
        let got = unsafe { libc::flock(fd, libc::LOCK_EX | libc::LOCK_NB) };
        got != 0
    }

    #[test]
    fn image_pins_are_kept_while_their_jobs_run_or_pull_then_released() {
        let tmp = tempfile::tempdir().unwrap();
        let roots: Vec<_> = ["a", "b", "c"]
            .iter()
            .map(|n| {
                let rootfs = tmp.path().join(n).join("rootfs");
                std::fs::create_dir_all(&rootfs).unwrap();
                rootfs
            })
            .collect();
        let pulls = Pulls::default();
        for (id, rootfs) in (1..).zip(&roots) {
            pulls.hold(id, Pin::rootfs(rootfs).unwrap());
        }
        assert!(roots.iter().all(|r| held(r)));
        // Job 1 runs, job 2 ended, job 3's pull-then-launch thread is still at work.
        pulls.jobs.lock().unwrap().insert(3);
        pulls.keep_pins(&BTreeSet::from([1]));
        assert_eq!(pulls.pinned(), [1, 3]);
        assert!(held(&roots[0]) && !held(&roots[1]) && held(&roots[2]));
        pulls.jobs.lock().unwrap().remove(&3);
        pulls.keep_pins(&BTreeSet::new());
        assert!(pulls.pinned().is_empty());
        assert!(roots.iter().all(|r| !held(r)));
    }

    #[test]
    fn a_repeated_order_does_not_start_a_second_pull() {
        let pulls = Pulls::default();
        let runs = Arc::new(AtomicUsize::new(0));
        let (release, wait) = mpsc::channel::<()>();
        let (done_tx, done) = mpsc::channel::<()>();
        let r = runs.clone();
        pulls.spawn(7, move || {
            r.fetch_add(1, Ordering::SeqCst);
            let _ = wait.recv();
            let _ = done_tx.send(());
        });
        assert!(pulls.pulling(7) && !pulls.pulling(8));
        let r = runs.clone();
        pulls.spawn(7, move || {
            r.fetch_add(1, Ordering::SeqCst);
        });
        release.send(()).unwrap();
        done.recv().unwrap();
        // The thread forgets the job once its closure is over.
        while pulls.pulling(7) {
            std::thread::yield_now();
        }
        assert_eq!(runs.load(Ordering::SeqCst), 1);
    }
}
