//! The cache of pulled images: a quota enforced after each pull by evicting the least recently
//! used images that no one pins, then the layers no remaining image is made of; pinned images
//! and their layers stay; a crash in the middle of an eviction leaves whole images.

mod common;

use std::collections::BTreeSet;
use std::fs;
use std::path::Path;
use std::time::Duration;

use common::served::Served;
use common::*;
use wharf_images::registry::RegistryOptions;
use wharf_images::{ErrorKind, ImageInfo, ImageStore, Pin};

const MIB: u64 = 1 << 20;

/// A layer of `size` bytes of content no other layer has (seeded by `seed`), gzip.
fn unique_layer(seed: u8, size: usize) -> Vec<u8> {
    let data: Vec<u8> = (0..size)
        .map(|i| ((i as u32).wrapping_mul(2_654_435_761) >> 7) as u8 ^ seed)
        .collect();
    gzip(&Tar::new().file(&format!("data-{seed}"), &data).bytes())
}

fn base_layer() -> Vec<u8> {
    gzip(
        &Tar::new()
            .dir("etc")
            .file("etc/base", &[b'b'; 1000])
            .bytes(),
    )
}

/// Serves images `img0`..`imgN` (tag `v1`), each the base layer and a 1 MiB layer of its own.
fn registry(n: u8) -> Served {
    let reg = Served::start();
    for i in 0..n {
        reg.image(
            &format!("test/img{i}"),
            "v1",
            &[
                (LAYER_GZIP, base_layer()),
                (LAYER_GZIP, unique_layer(i, MIB as usize)),
            ],
        );
    }
    reg
}

fn pull(store: &ImageStore, reg: &Served, i: u8) -> ImageInfo {
    let r = reg.reference(&format!("test/img{i}:v1"));
    let info = store
        .pull(&r, &RegistryOptions::default(), &mut |_| {})
        .unwrap();
    // Uses far enough apart for any filesystem's timestamps to order them.
    std::thread::sleep(Duration::from_millis(20));
    info
}

fn names(store: &ImageStore) -> BTreeSet<String> {
    store.list().unwrap().into_iter().map(|i| i.name).collect()
}

fn dir_names(dir: &Path) -> BTreeSet<String> {
    fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect()
}

fn hexes(digests: &[String]) -> BTreeSet<String> {
    digests
        .iter()
        .map(|d| d.trim_start_matches("sha256:").to_string())
        .collect()
}

/// Every root and layer left by [`many`] is whole: its directory `d` holds both its files.
fn assert_many_whole(store: &ImageStore) {
    for top in ["roots", "layers"] {
        for hex in dir_names(&store.root().join(top)) {
            let mut d = store.root().join(top).join(&hex);
            if top == "roots" {
                d = d.join("rootfs");
            }
            assert_eq!(
                dir_names(&d.join("d")).len(),
                2,
                "{top}/{hex} is half deleted"
            );
        }
    }
}

/// Every name refers to a root that is there, and every root's layers are there.
fn assert_whole(store: &ImageStore) {
    for info in store.list().unwrap() {
        assert!(info.rootfs.is_dir(), "{} lost its root", info.name);
        for l in &info.layers {
            let dir = store
                .root()
                .join("layers")
                .join(l.trim_start_matches("sha256:"));
            assert!(dir.is_dir(), "{} lost its layer {l}", info.name);
        }
    }
}

#[test]
fn eviction_follows_last_use_and_spares_pinned_images_and_their_layers() {
    let reg = registry(4);
    let s = scratch();
    let base = sha256(&base_layer());
    let per_image = MIB + 1000;
    // Room for three images' own layers and the base, not four.
    let store = s.store.clone().with_quota(Some(3 * MIB + 1000 + 4096));
    let a = pull(&store, &reg, 0);
    let pin = Pin::rootfs(&a.rootfs).unwrap();
    let b = pull(&store, &reg, 1);
    let c = pull(&store, &reg, 2);
    // A job on b makes it more recent than c.
    drop(Pin::rootfs(&b.rootfs).unwrap());
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(store.cache_bytes().unwrap(), 3 * MIB + 1000);

    let d = pull(&store, &reg, 3);
    // The fourth image put the cache over: c, least recently used, went, and its own layer.
    assert_eq!(
        names(&store),
        [&a, &b, &d].iter().map(|i| i.name.clone()).collect()
    );
    assert!(!c.rootfs.exists());
    let layers = dir_names(&store.root().join("layers"));
    assert!(!layers.contains(c.layers[1].trim_start_matches("sha256:")));
    assert!(layers.contains(base.trim_start_matches("sha256:")));
    assert_eq!(store.cache_bytes().unwrap(), 3 * MIB + 1000);
    assert_whole(&store);

    // On demand, down to nothing: only the pinned image and its layers stay. A dry run
    // says the same and removes nothing.
    let dry = store.evict_to(0, true, true).unwrap().unwrap();
    assert_eq!(names(&store).len(), 3);
    let removed = store.evict(0, true).unwrap().unwrap();
    assert_eq!(removed, dry);
    assert_eq!(
        removed.images.iter().cloned().collect::<BTreeSet<_>>(),
        [b.name.clone(), d.name.clone()].into()
    );
    assert_eq!(removed.bytes, 2 * MIB);
    assert_eq!(removed.in_use, vec![a.digest.clone()]);
    assert_eq!(names(&store), [a.name.clone()].into());
    assert_eq!(dir_names(&store.root().join("layers")), hexes(&a.layers));
    assert!(a.rootfs.join("etc/base").is_file());
    assert_eq!(store.cache_bytes().unwrap(), per_image);
    assert_whole(&store);

    // Removing a pinned image is refused, by name, until the pin goes.
    let err = store.remove(&a.name).unwrap_err();
    assert_eq!(err.kind, ErrorKind::InvalidInput, "{err}");
    assert!(err.message.contains("in use"), "{err}");
    drop(pin);
    store.evict(0, true).unwrap().unwrap();
    assert!(store.list().unwrap().is_empty());
    for dir in ["layers", "roots", "meta"] {
        assert!(dir_names(&store.root().join(dir)).is_empty(), "{dir}");
    }
    assert_eq!(store.cache_bytes().unwrap(), 0);
    s.assert_no_leftovers();
}

#[test]
fn a_pin_taken_after_an_eviction_fails_and_a_pull_brings_the_image_back() {
    let reg = registry(1);
    let s = scratch();
    let a = pull(&s.store, &reg, 0);
    s.store.evict(0, true).unwrap().unwrap();
    let err = Pin::rootfs(&a.rootfs).unwrap_err();
    assert_eq!(err.kind, ErrorKind::NotFound, "{err}");
    assert!(err.message.contains("evicted"), "{err}");
    let before = reg.blob_requests.load(std::sync::atomic::Ordering::SeqCst);
    let again = pull(&s.store, &reg, 0);
    assert_eq!(again.rootfs, a.rootfs);
    assert!(again.rootfs.join("etc/base").is_file());
    // Config and both layers fetched again.
    assert_eq!(
        reg.blob_requests.load(std::sync::atomic::Ordering::SeqCst) - before,
        3
    );
}

#[test]
fn prune_removes_what_no_name_uses_and_all_removes_unpinned_images() {
    let reg = registry(3);
    let s = scratch();
    let a = pull(&s.store, &reg, 0);
    let b = pull(&s.store, &reg, 1);
    let c = pull(&s.store, &reg, 2);
    let pin = Pin::rootfs(&c.rootfs).unwrap();
    // `rm` of a: its root and own layer go at once; the shared base stays.
    s.store.remove(&a.name).unwrap();
    assert!(!a.rootfs.exists());
    let layers = dir_names(&s.store.root().join("layers"));
    assert_eq!(layers.len(), 3, "{layers:?}");
    assert!(!layers.contains(a.layers[1].trim_start_matches("sha256:")));

    // Nothing dangles: a plain prune removes nothing.
    let dry = s.store.prune(false, true).unwrap();
    assert!(dry.roots.is_empty() && dry.layers.is_empty(), "{dry:?}");
    // --all, dry: says b would go (c is pinned), removes nothing.
    let dry = s.store.prune(true, true).unwrap();
    assert_eq!(dry.images, vec![b.name.clone()]);
    assert_eq!(dry.in_use, vec![c.digest.clone()]);
    assert_eq!(dry.bytes, MIB);
    assert!(b.rootfs.is_dir());
    let done = s.store.prune(true, false).unwrap();
    assert_eq!(done.images, dry.images);
    assert_eq!(done.layers, dry.layers);
    assert!(!b.rootfs.exists() && c.rootfs.is_dir());
    assert_eq!(names(&s.store), [c.name.clone()].into());
    drop(pin);
    s.assert_no_leftovers();
}

#[test]
fn status_reports_sizes_sharing_last_use_and_pins() {
    let reg = registry(2);
    let s = scratch();
    let a = pull(&s.store, &reg, 0);
    let b = pull(&s.store, &reg, 1);
    let pin = Pin::rootfs(&b.rootfs).unwrap();
    let status = s.store.status().unwrap();
    let of = |name: &str| status.iter().find(|i| i.info.name == name).unwrap();
    assert_eq!(of(&a.name).disk_size, MIB + 1000);
    assert_eq!(of(&a.name).shared_size, 1000);
    assert!(!of(&a.name).in_use && of(&b.name).in_use);
    assert!(of(&b.name).last_used_ms >= of(&a.name).last_used_ms);
    let layers = s.store.layers_of(&a.name).unwrap();
    assert_eq!(layers.len(), 2);
    assert_eq!(layers[0].images, vec![a.name.clone(), b.name.clone()]);
    assert_eq!((layers[0].size, layers[1].size), (1000, MIB));
    assert_eq!(layers[1].images, vec![a.name.clone()]);
    let config = s.store.config_of(&a.name).unwrap().unwrap();
    assert_eq!(config["os"], "linux");
    drop(pin);
}

/// Many small images, for the crash test.
fn many(reg: &Served, store: &ImageStore, n: u8) {
    for i in 0..n {
        let layer = gzip(
            &Tar::new()
                .dir("d")
                .file(&format!("d/f{i}"), &[i; 5000])
                .file(&format!("d/g{i}"), &[i; 3000])
                .bytes(),
        );
        reg.image(&format!("test/many{i}"), "v1", &[(LAYER_GZIP, layer)]);
        store
            .pull(
                &reg.reference(&format!("test/many{i}:v1")),
                &RegistryOptions::default(),
                &mut |_| {},
            )
            .unwrap();
    }
}

/// The child of the crash test: evicts the store named by the environment to nothing.
#[test]
fn crash_child_evicts() {
    let Ok(root) = std::env::var("WHARF_CACHE_CRASH_STORE") else {
        return;
    };
    let store = ImageStore::open(root.into()).unwrap();
    store.evict(0, true).unwrap();
}

#[test]
fn an_eviction_killed_at_any_point_leaves_whole_images_and_no_leftovers() {
    let reg = Served::start();
    let s = scratch();
    many(&reg, &s.store, 40);
    let exe = std::env::current_exe().unwrap();
    let mut killed_midway = 0;
    let tmp = s.store.root().join("tmp");
    for delay_us in [0u64, 50, 200, 500, 1000, 2000, 4000, 8000, 16000, 64000] {
        let mut child = std::process::Command::new(&exe)
            .args(["--exact", "crash_child_evicts", "--test-threads=1"])
            .env("WHARF_CACHE_CRASH_STORE", s.store.root())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        // Killed `delay_us` after the eviction made its trash directory: between its first
        // rename and its last deletion.
        let started = std::time::Instant::now();
        while !dir_names(&tmp).iter().any(|n| n.starts_with("evict-"))
            && started.elapsed() < Duration::from_secs(10)
            && child.try_wait().unwrap().is_none()
        {
            std::thread::sleep(Duration::from_micros(20));
        }
        std::thread::sleep(Duration::from_micros(delay_us));
        let _ = child.kill();
        let _ = child.wait();
        assert_whole(&s.store);
        assert_many_whole(&s.store);
        let left = s.store.list().unwrap().len();
        if left > 0 && left < 40 {
            killed_midway += 1;
        }
        // Opening the store again clears what a dead eviction had on its way out.
        let reopened = ImageStore::open(s.store.root().to_path_buf()).unwrap();
        assert_whole(&reopened);
        s.assert_no_leftovers();
        if left == 0 {
            break;
        }
        // Back to 40 images for the next try.
        many(&reg, &s.store, 40);
    }
    eprintln!("evictions killed mid-way: {killed_midway}");
    // Whatever the kills hit, a full eviction afterwards leaves an empty, consistent cache.
    s.store.evict(0, true).unwrap().unwrap();
    assert!(s.store.list().unwrap().is_empty());
    assert!(dir_names(&s.store.root().join("layers")).is_empty());
    assert!(dir_names(&s.store.root().join("meta")).is_empty());
}
