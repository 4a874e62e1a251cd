//! Pulling a job's registry image on demand, off the poll loop.
//!
//! A launch whose image is a registry reference that the store does not hold yet is handed to
//! a thread of its own: it pulls (two jobs asking for one image wait on the store's per-layer
//! locks and download each layer once), then launches as usual. [`Pulls`] remembers the jobs
//! whose pull is under way, so that a repeated launch order is not started twice, and how far
//! each pull has come: the poll reports it (`PollRequest::pulling`), which also tells the
//! controller not to repeat those orders, and a step of a pull wakes a report (at most once
//! per [`crate::PROGRESS_EVERY`]). A failed pull ends the job with the registry's reason.
//!
//! The pull uses the job's own user's credential for its image's registry when the launch
//! order carries one (sent with the submit), else the node's (`[images] auth_file`). It is
//! held in memory only, for this job's pull, and never written on the node.
//!
//! An image that needed credentials to pull is private ([`wharf_images::ImageInfo::private`]):
//! a later job that names it is served the cached copy only once its own credential (else the
//! node's, else none) proves access to the same manifest digest at the registry
//! ([`wharf_images::check_access`], on the job's own thread as a pull is); otherwise the job
//! ends with "access denied to private image" and nothing of the image is mounted. A proof
//! holds for [`PROOF_TTL`] per user and digest.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use wharf_api::wire::LaunchOrder;
use wharf_api::PullProgress;
use wharf_images::registry::{Credentials, RegistryOptions};
use wharf_images::{ImageInfo, ImageRef, ImageStore, Pin, PullEvent};

use crate::launch::LaunchError;
use crate::{AgentConfig, BackendKind};

/// How long a user's proven access to a private image's digest is taken on trust.
pub const PROOF_TTL: Duration = Duration::from_secs(60);

/// The jobs whose image is being pulled (or whose access to a private image is being
/// checked) and how far each pull has come, the recent proofs of access, and the image pins
/// held for launched jobs. Cheap to clone; clones share them.
#[derive(Debug, Clone, Default)]
pub struct Pulls {
    jobs: Arc<Mutex<BTreeSet<u64>>>,
    /// (uid, manifest digest) -> when access was proven.
    proofs: Arc<Mutex<BTreeMap<(u32, String), Instant>>>,
    /// Per job, its image's pin from its launch until it is seen ended: the job's shim pins
    /// the image too, for its whole life, but only once it runs.
    pins: Arc<Mutex<BTreeMap<u64, Pin>>>,
    /// Per job whose image is being pulled, how far its pull has come (reported with each
    /// poll until the pull is over).
    progress: Arc<Mutex<BTreeMap<u64, Progress>>>,
    /// Woken at each step of a pull, so that the report loop may send the progress (at most
    /// once per [`crate::PROGRESS_EVERY`]).
    progressed: Arc<tokio::sync::Notify>,
    /// Admins' pre-pulls on this node.
    prepulls: crate::prepull::PrePulls,
}

/// One job's pull, as its [`PullEvent`]s tell it.
#[derive(Debug, Clone, Default)]
pub(crate) struct Progress {
    /// The reference pulled.
    image: String,
    /// Layers of its manifest; 0 until it is resolved.
    layers: usize,
    /// Compressed bytes of all layers; 0 until the manifest is resolved.
    total: u64,
    /// The indices (from 1) of the layers in the store so far.
    done: BTreeSet<usize>,
    /// Compressed bytes of the layers that were in the store already (or another pull made):
    /// done at once.
    kept: u64,
    /// Compressed bytes of the layers this pull downloaded to the end.
    fetched: u64,
    /// Bytes this pull has downloaded so far, layers under way included.
    downloaded: u64,
}

impl Progress {
    /// A pull of `image` not resolved yet.
    pub(crate) fn of(image: &str) -> Progress {
        Progress {
            image: image.to_string(),
            ..Default::default()
        }
    }

    /// Takes in one event of the pull. A new manifest (the pull went on at the next mirror)
    /// starts the count again: its layers are reported again, those kept at once.
    pub(crate) fn apply(&mut self, event: &PullEvent) {
        match event {
            PullEvent::Resolved { layers, bytes, .. } => {
                *self = Progress {
                    image: std::mem::take(&mut self.image),
                    layers: *layers,
                    total: *bytes,
                    ..Default::default()
                };
            }
            PullEvent::Layer {
                index,
                size,
                fetched,
                ..
            } => {
                if (1..=self.layers).contains(index) && self.done.insert(*index) {
                    if *fetched {
                        self.fetched += size;
                    } else {
                        self.kept += size;
                    }
                }
            }
            PullEvent::Bytes { fetched } => self.downloaded = *fetched,
            // The entry goes when the pull's thread is over.
            PullEvent::Done(_) => {}
        }
    }

    /// As reported to the controller: the bytes of the layers kept, and of those downloaded
    /// (the count of downloaded bytes, which comes at intervals, or the layers it has
    /// finished, whichever is further).
    pub(crate) fn report(&self, job: u64) -> PullProgress {
        PullProgress {
            job,
            node: String::new(),
            image: self.image.clone(),
            layers_done: self.done.len() as u64,
            layers: self.layers as u64,
            bytes_done: (self.kept + self.fetched.max(self.downloaded)).min(self.total),
            bytes: self.total,
        }
    }
}

impl Pulls {
    /// Whether `uid` proved access to `digest` less than [`PROOF_TTL`] ago.
    pub fn proven(&self, uid: u32, digest: &str) -> bool {
        self.proofs.lock().is_ok_and(|p| {
            p.get(&(uid, digest.to_string()))
                .is_some_and(|at| at.elapsed() < PROOF_TTL)
        })
    }

    /// Records that `uid` proved access to `digest` now (and forgets expired proofs).
    pub fn prove(&self, uid: u32, digest: &str) {
        if let Ok(mut p) = self.proofs.lock() {
            p.retain(|_, at| at.elapsed() < PROOF_TTL);
            p.insert((uid, digest.to_string()), Instant::now());
        }
    }

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

    /// The pulls under way, as reported to the controller, by job.
    pub fn progress(&self) -> Vec<PullProgress> {
        self.progress
            .lock()
            .map(|p| p.iter().map(|(id, p)| p.report(*id)).collect())
            .unwrap_or_default()
    }

    /// Waits until a pull or a pre-pull made a step (or began, or ended) since the last wait
    /// returned.
    pub async fn progressed(&self) {
        tokio::select! {
            () = self.progressed.notified() => {}
            () = self.prepulls.progressed() => {}
        }
    }

    /// Admins' pre-pulls on this node.
    pub fn prepulls(&self) -> &crate::prepull::PrePulls {
        &self.prepulls
    }

    /// Job `id`'s pull of `image` begins.
    pub(crate) fn began(&self, id: u64, image: &ImageRef) {
        if let Ok(mut p) = self.progress.lock() {
            p.insert(
                id,
                Progress {
                    image: image.to_string(),
                    ..Default::default()
                },
            );
        }
        self.progressed.notify_one();
    }

    /// Job `id`'s pull made a step.
    pub(crate) fn stepped(&self, id: u64, event: &PullEvent) {
        if let Ok(mut p) = self.progress.lock() {
            if let Some(p) = p.get_mut(&id) {
                p.apply(event);
            }
        }
        self.progressed.notify_one();
    }

    /// Job `id`'s pull is over, whichever way.
    pub(crate) fn ended(&self, id: u64) {
        if let Ok(mut p) = self.progress.lock() {
            p.remove(&id);
        }
        self.progressed.notify_one();
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

/// The options for `order`'s pull of `reference`: the node's, with the job's user's own
/// credential when the order carries one for that registry.
pub fn options_for(
    site: &RegistryOptions,
    order: &LaunchOrder,
    reference: &ImageRef,
) -> RegistryOptions {
    let mut opts = site.clone();
    opts.user = order
        .registry_auth
        .as_ref()
        .filter(|c| c.registry == reference.registry)
        .map(|c| Credentials {
            username: c.username.clone(),
            password: c.password.clone(),
        });
    opts
}

/// The private image cached on this node that `image` names, when it is one: its access
/// must be proven for the job before the job may use it.
pub fn to_prove(
    cfg: &AgentConfig,
    store: &ImageStore,
    image: &str,
) -> Option<(ImageRef, ImageInfo)> {
    if cfg.backend != BackendKind::Oci || image == "host" || image.starts_with('/') {
        return None;
    }
    let info = store
        .get(image)
        .ok()
        .or_else(|| store.pulled(&image.parse().ok()?))?;
    if !info.private {
        return None;
    }
    let reference: ImageRef = info.name.parse().ok()?;
    Some((reference, info))
}

/// Checks that job `order` may use the cached private image `info` (pulled for `reference`):
/// its credentials must prove access to the same digest. The error is the job's reason, and
/// the job's fault unless the registry could not be reached.
pub fn prove_for(
    cfg: &AgentConfig,
    pulls: &Pulls,
    order: &LaunchOrder,
    reference: &ImageRef,
    info: &ImageInfo,
) -> Result<(), LaunchError> {
    let opts = options_for(&cfg.registry, order, reference);
    let whose = if opts.user.is_some() {
        "the job's registry credential"
    } else {
        "the job carries no registry credential (none for this registry in the user's auth \
         file), and the node's"
    };
    match wharf_images::check_access(reference, &info.digest, &opts) {
        Ok(()) => {
            tracing::info!(job = order.id, image = %reference, digest = %info.digest, "access to a private image proven");
            pulls.prove(order.owner.uid, &info.digest);
            Ok(())
        }
        Err(e) => {
            tracing::warn!(job = order.id, image = %reference, error = %e, "access to a private image refused");
            // Not shown the digest is the job's own doing; a registry away is nobody's.
            let code = match e.kind {
                wharf_images::ErrorKind::Refused | wharf_images::ErrorKind::NotFound => {
                    wharf_api::fault::FaultCode::ImageDenied
                }
                _ => crate::launch::image_fault(&e),
            };
            Err(LaunchError::new(
                code,
                format!(
                    "access denied to private image {reference} on node {}: it is cached from a \
                     registry that required credentials, and {whose} did not prove access to \
                     {}: {}",
                    cfg.node_name, info.digest, e.message
                ),
            ))
        }
    }
}

/// Pulls `reference` for job `order`, keeping its progress in `pulls` while it lasts and
/// logging it; returns the image pinned until the
/// launch holds its own pin. The error says what the registry said, and whose fault it is
/// ([`crate::launch::image_fault`]).
pub fn pull_for(
    cfg: &AgentConfig,
    store: &ImageStore,
    pulls: &Pulls,
    order: &LaunchOrder,
    reference: &ImageRef,
) -> Result<Pin, LaunchError> {
    tracing::info!(job = order.id, image = %reference, "pulling");
    pulls.began(order.id, reference);
    let pulled = store.pull_pinned(
        reference,
        &options_for(&cfg.registry, order, reference),
        &mut |event| {
            pulls.stepped(order.id, &event);
            if let PullEvent::Layer {
                index,
                digest,
                size,
                fetched,
            } = &event
            {
                tracing::debug!(job = order.id, layer = index, %digest, size, fetched, "layer ready");
            }
        },
    );
    pulls.ended(order.id);
    pulled
        .map(|(info, pin)| {
            tracing::info!(job = order.id, image = %reference, digest = %info.digest, "pulled");
            pin
        })
        .map_err(|e| {
            LaunchError::new(
                crate::launch::image_fault(&e),
                format!("pulling image {reference} on node {}: {e}", cfg.node_name),
            )
        })
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
    fn the_jobs_credential_is_used_only_for_its_registry_and_proofs_are_per_user_and_digest() {
        use wharf_api::wire::RegistryCredential;
        let spec = wharf_api::JobRequest {
            command: Some(vec!["/bin/true".into()]),
            ..Default::default()
        }
        .resolve("/tmp", &wharf_api::JobDefaults::default())
        .unwrap();
        let order = LaunchOrder {
            id: 1,
            owner: wharf_api::Owner {
                uid: 1001,
                gid: 1001,
                user: "ann".into(),
            },
            spec,
            cpu_ids: vec![],
            gpu_ids: vec![],
            restarts: 0,
            rendezvous: Default::default(),
            registry_auth: Some(RegistryCredential {
                registry: "127.0.0.1:5000".into(),
                username: "ann".into(),
                password: "pw".into(),
            }),
            hold: false,
            stops_holders: false,
        };
        let site = RegistryOptions::default();
        let mine: ImageRef = "127.0.0.1:5000/team/app:v1".parse().unwrap();
        let other: ImageRef = "nvcr.io/team/app:v1".parse().unwrap();
        let opts = options_for(&site, &order, &mine);
        assert_eq!(opts.user.unwrap().password, "pw");
        assert!(options_for(&site, &order, &other).user.is_none());

        let pulls = Pulls::default();
        assert!(!pulls.proven(1001, "sha256:a"));
        pulls.prove(1001, "sha256:a");
        assert!(pulls.proven(1001, "sha256:a"));
        assert!(
            !pulls.proven(1002, "sha256:a"),
            "another user proves it himself"
        );
        assert!(!pulls.proven(1001, "sha256:b"), "another digest too");
    }

    #[test]
    fn a_pulls_progress_counts_layers_and_bytes_as_they_land() {
        let pulls = Pulls::default();
        let reference: ImageRef = "127.0.0.1:5000/test/app:v1".parse().unwrap();
        let layer = |index: usize, size: u64, fetched: bool| PullEvent::Layer {
            index,
            digest: format!("sha256:{index}"),
            size,
            fetched,
        };
        let resolved = PullEvent::Resolved {
            digest: "sha256:m".into(),
            layers: 3,
            bytes: 600,
        };
        assert!(pulls.progress().is_empty());
        pulls.began(4, &reference);
        let p = &pulls.progress()[0];
        assert_eq!(
            (p.job, p.image.as_str(), p.layers, p.bytes),
            (4, "127.0.0.1:5000/test/app:v1", 0, 0)
        );
        pulls.stepped(4, &resolved);
        // Layer 2 was in the store already: its bytes count as done at once.
        pulls.stepped(4, &layer(2, 200, false));
        pulls.stepped(4, &layer(3, 300, true));
        let p = &pulls.progress()[0];
        assert_eq!(
            (p.layers_done, p.layers, p.bytes_done, p.bytes),
            (2, 3, 500, 600)
        );
        assert_eq!(
            p.describe(),
            "pulling 127.0.0.1:5000/test/app:v1: 500 of 600 B, 2 of 3 layers"
        );
        // A layer reported twice, or out of range, counts once or not at all.
        pulls.stepped(4, &layer(3, 300, false));
        pulls.stepped(4, &layer(7, 999, true));
        pulls.stepped(5, &layer(1, 100, true));
        assert_eq!(pulls.progress()[0].layers_done, 2);
        assert_eq!(pulls.progress().len(), 1, "no entry for a job not pulling");
        // The next mirror's manifest: counted again from its layers.
        pulls.stepped(4, &resolved);
        assert_eq!(
            (
                pulls.progress()[0].layers_done,
                pulls.progress()[0].bytes_done
            ),
            (0, 0)
        );
        pulls.stepped(4, &layer(2, 200, false));
        assert_eq!(pulls.progress()[0].bytes_done, 200);
        // Bytes of the layers under way count as they arrive, never past the total.
        pulls.stepped(4, &PullEvent::Bytes { fetched: 150 });
        assert_eq!(
            (
                pulls.progress()[0].layers_done,
                pulls.progress()[0].bytes_done
            ),
            (1, 350)
        );
        pulls.stepped(4, &layer(1, 100, true));
        assert_eq!(pulls.progress()[0].bytes_done, 350);
        pulls.stepped(4, &PullEvent::Bytes { fetched: 10_000 });
        assert_eq!(pulls.progress()[0].bytes_done, 600);
        pulls.ended(4);
        assert!(pulls.progress().is_empty());
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
