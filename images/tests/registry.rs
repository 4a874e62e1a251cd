//! Pulls from a real registry on loopback: Debian's `docker-registry`, started by each test
//! on a free port, fed by `skopeo copy` from OCI layouts the tests write. Without those tools
//! the tests are skipped with the reason, and fail under `WHARF_TEST_STRICT=1`.

mod common;
#[path = "common/loopback.rs"]
mod loopback;

use std::fs;
use std::net::TcpListener;
use std::path::Path;

use common::served::{one_layer_image, read_request, respond, Blob};
use common::*;
use loopback::{tools, Loopback};
use wharf_images::registry::{Credentials, RegistryOptions};
use wharf_images::{ErrorKind, ImageRef, PullEvent};

fn pull(
    s: &Scratch,
    r: &ImageRef,
) -> (
    Result<wharf_images::ImageInfo, wharf_images::ImageError>,
    Vec<PullEvent>,
) {
    pull_with(s, r, &RegistryOptions::default())
}

fn pull_with(
    s: &Scratch,
    r: &ImageRef,
    opts: &RegistryOptions,
) -> (
    Result<wharf_images::ImageInfo, wharf_images::ImageError>,
    Vec<PullEvent>,
) {
    let mut events = Vec::new();
    let res = s.store.pull(r, opts, &mut |e| events.push(e));
    (res, events)
}

fn fetched(events: &[PullEvent]) -> Vec<bool> {
    events
        .iter()
        .filter_map(|e| match e {
            PullEvent::Layer { fetched, .. } => Some(*fetched),
            _ => None,
        })
        .collect()
}

/// The byte counts a pull reported: they never go down, and the last is every fetched
/// layer's size (the layers already there downloaded nothing).
fn assert_bytes_add_up(events: &[PullEvent]) {
    let counts: Vec<u64> = events
        .iter()
        .filter_map(|e| match e {
            PullEvent::Bytes { fetched } => Some(*fetched),
            _ => None,
        })
        .collect();
    assert!(counts.windows(2).all(|w| w[0] <= w[1]), "{counts:?}");
    let fetched: u64 = events
        .iter()
        .filter_map(|e| match e {
            PullEvent::Layer {
                size,
                fetched: true,
                ..
            } => Some(*size),
            _ => None,
        })
        .sum();
    assert_eq!(counts.last().copied().unwrap_or(0), fetched, "{counts:?}");
}

fn entries(dir: &Path) -> usize {
    fs::read_dir(dir).map_or(0, |d| d.count())
}

/// The start of most tests here: the tools (else `None`, the test skipped), a loopback
/// registry (`htpasswd`: it wants user `u`, password `p`), a scratch store, an OCI layout.
fn setup(test: &str, htpasswd: bool) -> Option<(Loopback, Scratch, Layout)> {
    if !tools(test) {
        return None;
    }
    let reg = Loopback::start(htpasswd);
    let s = scratch();
    let layout = Layout::new(s.work.join("layout"));
    Some((reg, s, layout))
}

/// A base layer most images here share.
fn base_layer() -> Vec<u8> {
    gzip(
        &Tar::new()
            .dir("etc")
            .file("etc/keep", b"kept")
            .file("etc/gone", b"removed above")
            .dir("opt/d")
            .file("opt/d/old", b"hidden by the opaque directory")
            .bytes(),
    )
}

#[test]
fn a_multi_layer_image_is_pulled_with_whiteouts_applied_and_layers_shared() {
    let Some((reg, s, layout)) = setup(
        "a_multi_layer_image_is_pulled_with_whiteouts_applied_and_layers_shared",
        false,
    ) else {
        return;
    };
    let upper = Tar::new()
        .file("etc/.wh.gone", b"")
        .file("opt/d/.wh..wh..opq", b"")
        .file("opt/d/new", b"new")
        .bytes();
    let top = zstd(&Tar::new().file("bin/tool", b"#!/bin/sh\n").bytes());
    let m = layout.manifest(&[
        (LAYER_GZIP, base_layer()),
        (LAYER_TAR, upper),
        (LAYER_ZSTD, top),
    ]);
    let other = layout.manifest(&[
        (LAYER_GZIP, base_layer()),
        (LAYER_TAR, Tar::new().file("etc/other", b"o").bytes()),
    ]);
    layout.index(vec![tagged(m, "v1"), tagged(other, "v2")]);
    reg.push(&layout.dir, "v1", "test/img", None);
    reg.push(&layout.dir, "v2", "test/img", None);

    let r = reg.reference("test/img:v1");
    let (info, events) = pull(&s, &r);
    let info = info.unwrap();
    assert_eq!(info.name, r.to_string());
    assert_eq!(info.source, "registry");
    assert_eq!(info.layers.len(), 3);
    assert_eq!(fetched(&events), [true, true, true]);
    assert_bytes_add_up(&events);
    let root = &info.rootfs;
    assert_eq!(fs::read(root.join("etc/keep")).unwrap(), b"kept");
    assert!(!root.join("etc/gone").exists(), "the whiteout removed it");
    assert_eq!(fs::read(root.join("opt/d/new")).unwrap(), b"new");
    assert!(
        !root.join("opt/d/old").exists(),
        "the opaque directory hid it"
    );
    assert!(root.join("bin/tool").is_file());
    assert!(find_named(root, ".wh.gone").is_empty() && find_named(root, ".wh..wh..opq").is_empty());
    assert_eq!(s.store.get(&r.to_string()).unwrap(), info);
    assert_eq!(s.store.pulled(&r), Some(info.clone()));

    // The second image fetches only its own layer; the base's directory is shared.
    let (info2, events) = pull(&s, &reg.reference("test/img:v2"));
    let info2 = info2.unwrap();
    assert_eq!(fetched(&events), [false, true]);
    assert_bytes_add_up(&events);
    assert_eq!(info2.layers[0], info.layers[0]);
    assert_eq!(entries(&s.store.root().join("layers")), 4);
    assert!(
        info2.rootfs.join("etc/gone").is_file(),
        "no whiteout in this image"
    );
    // Pulling again unpacks nothing and builds no second root.
    let (again, events) = pull(&s, &r);
    assert_eq!(again.unwrap().rootfs, info.rootfs);
    assert_eq!(fetched(&events), [false, false, false]);
    assert_eq!(entries(&s.store.root().join("roots")), 2);
    s.assert_no_leftovers();
}

#[test]
fn a_blob_that_does_not_match_its_digest_is_refused_and_nothing_is_kept() {
    let Some((reg, s, layout)) = setup(
        "a_blob_that_does_not_match_its_digest_is_refused_and_nothing_is_kept",
        false,
    ) else {
        return;
    };
    // gzip, which skopeo pushes as it is (it would compress a plain tar layer).
    let layer = gzip(&Tar::new().file("data", &[b'a'; 4096]).bytes());
    let m = layout.manifest(&[(LAYER_GZIP, layer.clone())]);
    layout.index(vec![tagged(m, "v1")]);
    reg.push(&layout.dir, "v1", "test/bad", None);
    // The registry serves what its storage holds: change one byte in the middle.
    let hex = sha256(&layer).trim_start_matches("sha256:").to_string();
    let data = reg
        .storage
        .join("docker/registry/v2/blobs/sha256")
        .join(&hex[..2])
        .join(&hex)
        .join("data");
    let mut bytes = fs::read(&data).unwrap();
    let at = bytes.len() / 2;
    bytes[at] ^= 0x55;
    fs::write(&data, bytes).unwrap();

    let (res, _) = pull(&s, &reg.reference("test/bad:v1"));
    let err = res.unwrap_err();
    assert_eq!(err.kind, ErrorKind::InvalidInput, "{err}");
    assert!(err.message.contains("does not match its digest"), "{err}");
    assert_eq!(entries(&s.store.root().join("layers")), 0);
    assert_eq!(entries(&s.store.root().join("roots")), 0);
    assert!(s.store.list().unwrap().is_empty());
    s.assert_no_leftovers();
}

#[test]
fn a_multi_platform_index_is_resolved_to_this_node() {
    let Some((reg, s, layout)) = setup("a_multi_platform_index_is_resolved_to_this_node", false)
    else {
        return;
    };
    let arch = if cfg!(target_arch = "aarch64") {
        "arm64"
    } else {
        "amd64"
    };
    let other_arch = if arch == "amd64" { "arm64" } else { "amd64" };
    let image = |text: &str| {
        layout.manifest(&[(
            LAYER_GZIP,
            gzip(&Tar::new().file("arch", text.as_bytes()).bytes()),
        )])
    };
    let mine = for_platform(image(arch), "linux", arch);
    let other = for_platform(image(other_arch), "linux", other_arch);
    let index = layout.nested_index(vec![other, mine]);
    layout.index(vec![tagged(index, "multi")]);
    reg.push(&layout.dir, "multi", "test/multi", None);

    let (info, _) = pull(&s, &reg.reference("test/multi:multi"));
    let info = info.unwrap();
    assert_eq!(fs::read_to_string(info.rootfs.join("arch")).unwrap(), arch);
    // Named by the platform's manifest, which a digest reference then finds again.
    let by_digest: ImageRef = format!("{}/test/multi@{}", reg.addr, info.digest)
        .parse()
        .unwrap();
    let (again, _) = pull(&s, &by_digest);
    assert_eq!(again.unwrap().rootfs, info.rootfs);
}

#[test]
fn registry_errors_are_named_and_basic_credentials_are_sent() {
    let Some((reg, s, layout)) = setup(
        "registry_errors_are_named_and_basic_credentials_are_sent",
        true,
    ) else {
        return;
    };
    let m = layout.manifest(&[(LAYER_GZIP, base_layer())]);
    layout.index(vec![tagged(m, "v1")]);
    reg.push(&layout.dir, "v1", "team/private", Some("u:p"));
    let r = reg.reference("team/private:v1");

    let (res, _) = pull(&s, &r);
    let err = res.unwrap_err();
    assert_eq!(err.kind, ErrorKind::Refused, "{err}");
    assert!(err.message.contains("requires credentials"), "{err}");
    let with = |password: &str| RegistryOptions {
        credentials: [(
            reg.addr.clone(),
            Credentials {
                username: "u".into(),
                password: password.into(),
            },
        )]
        .into(),
        ..Default::default()
    };
    let (res, _) = pull_with(&s, &r, &with("wrong"));
    let err = res.unwrap_err();
    assert_eq!(err.kind, ErrorKind::Refused, "{err}");
    assert!(err.message.contains("HTTP 401"), "{err}");
    let (res, _) = pull_with(&s, &r, &with("p"));
    assert!(res.unwrap().rootfs.join("etc/keep").is_file());

    let (res, _) = pull_with(&s, &reg.reference("team/private:nope"), &with("p"));
    let err = res.unwrap_err();
    assert_eq!(err.kind, ErrorKind::NotFound, "{err}");
    assert!(
        err.message.contains("MANIFEST_UNKNOWN"),
        "the registry's reason: {err}"
    );
    let (res, _) = pull(&s, &"127.0.0.1:1/x/y:z".parse().unwrap());
    let err = res.unwrap_err();
    assert_eq!(err.kind, ErrorKind::Unreachable, "{err}");
    assert!(err.message.contains("cannot reach the registry"), "{err}");
}

#[test]
fn concurrent_pulls_of_one_image_download_each_layer_once() {
    let Some((reg, s, layout)) = setup(
        "concurrent_pulls_of_one_image_download_each_layer_once",
        false,
    ) else {
        return;
    };
    let big = |seed: u8| {
        let data: Vec<u8> = (0..(1u32 << 20))
            .map(|i| (i as u8).wrapping_mul(seed))
            .collect();
        gzip(&Tar::new().file(&format!("f{seed}"), &data).bytes())
    };
    let m = layout.manifest(&[(LAYER_GZIP, big(3)), (LAYER_GZIP, big(7))]);
    layout.index(vec![tagged(m, "v1")]);
    reg.push(&layout.dir, "v1", "test/shared", None);
    let r = reg.reference("test/shared:v1");

    let pushed = reg.blob_gets();
    let results: Vec<_> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..20)
            .map(|_| {
                let (store, r) = (s.store.clone(), r.clone());
                scope.spawn(move || {
                    let mut events = Vec::new();
                    let info = store.pull(&r, &RegistryOptions::default(), &mut |e| events.push(e));
                    (info.unwrap(), fetched(&events))
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    // The pull that came first fetched both layers; those that waited for it were served
    // its image and report no layer of their own.
    for layer in 0..2 {
        let downloads = results
            .iter()
            .filter(|(_, f)| f.get(layer) == Some(&true))
            .count();
        assert_eq!(
            downloads,
            1,
            "layer {} fetched by {downloads} pulls",
            layer + 1
        );
    }
    // One download of each blob at the registry (the config's too), counted by its log.
    let mut gets = reg.blob_gets();
    for (digest, n) in pushed {
        *gets.get_mut(&digest).unwrap() -= n;
    }
    gets.retain(|_, n| *n > 0);
    assert_eq!(gets.len(), 3, "the config and two layers: {gets:?}");
    assert!(gets.values().all(|n| *n == 1), "{gets:?}");
    let roots: std::collections::BTreeSet<_> =
        results.iter().map(|(i, _)| i.rootfs.clone()).collect();
    assert_eq!(roots.len(), 1);
    assert_eq!(entries(&s.store.root().join("roots")), 1);
    s.assert_no_leftovers();
}

#[test]
fn a_hostile_layer_from_a_registry_writes_nothing_outside_and_leaves_nothing() {
    let Some((reg, s, layout)) = setup(
        "a_hostile_layer_from_a_registry_writes_nothing_outside_and_leaves_nothing",
        false,
    ) else {
        return;
    };
    let outside = s.outside.join("escaped");
    let hostile = Tar::new()
        .symlink("link", s.outside.to_str().unwrap())
        .file("link/escaped", b"through the symlink")
        .raw(tar::EntryType::Regular, b"../../escaped", b"", b"up", 0o644)
        .bytes();
    let m = layout.manifest(&[(LAYER_GZIP, base_layer()), (LAYER_GZIP, gzip(&hostile))]);
    layout.index(vec![tagged(m, "v1")]);
    reg.push(&layout.dir, "v1", "test/hostile", None);

    let (res, events) = pull(&s, &reg.reference("test/hostile:v1"));
    let err = res.unwrap_err();
    assert_eq!(err.kind, ErrorKind::InvalidInput, "{err}");
    assert!(
        err.message.contains("layer 2") && err.message.contains("link/escaped"),
        "{err}"
    );
    assert!(!outside.exists());
    s.assert_outside_untouched();
    // The good base layer stays for the next image; nothing of the hostile one, no root.
    assert_eq!(fetched(&events), [true]);
    assert_eq!(entries(&s.store.root().join("layers")), 1);
    assert_eq!(entries(&s.store.root().join("roots")), 0);
    assert!(s.store.list().unwrap().is_empty());
    s.assert_no_leftovers();
}

#[test]
fn zstd_layers_pushed_by_skopeo_are_pulled_and_verified() {
    let Some((reg, s, layout)) = setup(
        "zstd_layers_pushed_by_skopeo_are_pulled_and_verified",
        false,
    ) else {
        return;
    };
    let data: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
    let lower = Tar::new().dir("etc").file("etc/lower", b"below").bytes();
    let upper = Tar::new()
        .file("etc/.wh.lower", b"")
        .file("data", &data)
        .bytes();
    let m = layout.manifest(&[(LAYER_TAR, lower), (LAYER_TAR, upper)]);
    layout.index(vec![tagged(m, "v1")]);
    reg.push_with(
        &layout.dir,
        "v1",
        "test/zstd",
        None,
        &["--dest-compress", "--dest-compress-format", "zstd"],
    );

    let r = reg.reference("test/zstd:v1");
    // What the registry holds: zstd layers, which the config's diff_ids name uncompressed.
    let manifest = wharf_images::registry::Registry::new(&r, &RegistryOptions::default())
        .manifest("v1", 1 << 20)
        .unwrap();
    let doc: serde_json::Value = serde_json::from_slice(&manifest.bytes).unwrap();
    let types: Vec<&str> = doc["layers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["mediaType"].as_str().unwrap())
        .collect();
    assert_eq!(types, [LAYER_ZSTD, LAYER_ZSTD], "{doc}");
    let (info, events) = pull(&s, &r);
    let info = info.unwrap();
    assert_eq!(fetched(&events), [true, true]);
    assert_eq!(fs::read(info.rootfs.join("data")).unwrap(), data);
    assert!(!info.rootfs.join("etc/lower").exists(), "whited out");
    assert_eq!(
        info.layers,
        doc["layers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| l["digest"].as_str().unwrap().to_string())
            .collect::<Vec<_>>()
    );
    s.assert_no_leftovers();

    // The same layer, one byte changed in the registry's storage: refused, nothing kept.
    let hex = info.layers[1].trim_start_matches("sha256:").to_string();
    let blob = reg
        .storage
        .join("docker/registry/v2/blobs/sha256")
        .join(&hex[..2])
        .join(&hex)
        .join("data");
    let mut bytes = fs::read(&blob).unwrap();
    let at = bytes.len() / 2;
    bytes[at] ^= 0x55;
    fs::write(&blob, bytes).unwrap();
    let s2 = scratch();
    let (res, _) = pull(&s2, &r);
    let err = res.unwrap_err();
    assert_eq!(err.kind, ErrorKind::InvalidInput, "{err}");
    assert!(err.message.contains("layer 2"), "{err}");
    assert!(s2.store.list().unwrap().is_empty());
    assert_eq!(entries(&s2.store.root().join("roots")), 0);
    assert_eq!(
        entries(&s2.store.root().join("layers")),
        1,
        "the good lower layer"
    );
    s2.assert_no_leftovers();
}

#[test]
fn a_manifest_of_ten_thousand_layers_is_refused_at_once_and_nothing_is_kept() {
    let reg = common::served::Served::start();
    let layer = gzip(&Tar::new().file("f", b"x").bytes());
    let desc = reg.blob("test/many", LAYER_GZIP, &layer);
    let diff = diff_id(LAYER_GZIP, &layer);
    let config = common::served::config_json(&vec![diff; 10_000], serde_json::json!({}));
    let config = reg.blob("test/many", common::served::CONFIG, &config);
    let manifest = common::served::manifest_json(config, vec![desc; 10_000]);
    assert!(manifest.len() > 1 << 20);
    reg.manifest("test/many", "v1", manifest);
    let s = scratch();
    let started = std::time::Instant::now();
    let (res, events) = pull(&s, &reg.reference("test/many:v1"));
    let err = res.unwrap_err();
    assert!(started.elapsed() < std::time::Duration::from_secs(5));
    assert_eq!(err.kind, ErrorKind::InvalidInput, "{err}");
    assert!(
        err.message.contains("10000 layers") && err.message.contains("the limit is 128"),
        "{err}"
    );
    assert!(events.is_empty(), "{events:?}");
    // Refused on the manifest alone: no blob was asked for.
    assert_eq!(
        reg.blob_requests.load(std::sync::atomic::Ordering::SeqCst),
        0
    );
    assert!(s.store.list().unwrap().is_empty());
    for dir in ["layers", "roots", "meta"] {
        assert_eq!(entries(&s.store.root().join(dir)), 0, "{dir}");
    }
    s.assert_no_leftovers();
}

/// A registry of one image that breaks off the first download of its layer half way, and
/// answers range requests; counts the layer's requests.
fn flaky_registry(
    manifest: Vec<u8>,
    config: Blob,
    layer: Blob,
) -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use std::io::BufReader;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let layer_requests = std::sync::Arc::new(AtomicUsize::new(0));
    let count = layer_requests.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { return };
            let (path, headers) = read_request(&mut BufReader::new(conn.try_clone().unwrap()));
            let range = headers.iter().find_map(|h| {
                let v = h.strip_prefix("range: bytes=")?;
                v.trim().trim_end_matches('-').parse::<usize>().ok()
            });
            let send =
                |conn: &mut std::net::TcpStream,
                 status: &str,
                 extra: &str,
                 body: &[u8],
                 cut: usize| respond(conn, status, extra, body, cut).unwrap();
            if path.ends_with("/manifests/v1") {
                let ct = "Content-Type: application/vnd.oci.image.manifest.v1+json\r\n";
                send(&mut conn, "200 OK", ct, &manifest, usize::MAX);
            } else if path.ends_with(&config.0) {
                send(&mut conn, "200 OK", "", &config.1, usize::MAX);
            } else if path.ends_with(&layer.0) {
                let n = count.fetch_add(1, Ordering::SeqCst);
                match range {
                    Some(from) => {
                        let cr = format!(
                            "Content-Range: bytes {from}-{}/{}\r\n",
                            layer.1.len() - 1,
                            layer.1.len()
                        );
                        send(
                            &mut conn,
                            "206 Partial Content",
                            &cr,
                            &layer.1[from..],
                            usize::MAX,
                        );
                    }
                    // The first try breaks off half way.
                    None if n == 0 => send(&mut conn, "200 OK", "", &layer.1, layer.1.len() / 2),
                    None => send(&mut conn, "200 OK", "", &layer.1, usize::MAX),
                }
            } else {
                send(&mut conn, "404 Not Found", "", b"{}", usize::MAX);
            }
            let _ = conn.shutdown(std::net::Shutdown::Both);
        }
    });
    (addr, layer_requests)
}

#[test]
fn a_download_broken_off_mid_layer_is_resumed_from_the_last_byte() {
    let layer_tar = {
        let data: Vec<u8> = (0..(4u32 << 20))
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        Tar::new().file("big", &data).bytes()
    };
    let (manifest, config, layer) = one_layer_image(&layer_tar);
    let (addr, requests) = flaky_registry(manifest, config, layer);
    let s = scratch();
    let r: ImageRef = format!("{addr}/test/drop:v1").parse().unwrap();
    let (res, _) = pull(&s, &r);
    let info = res.unwrap();
    assert_eq!(fs::read(info.rootfs.join("big")).unwrap().len(), 4 << 20);
    assert_eq!(
        requests.load(std::sync::atomic::Ordering::SeqCst),
        2,
        "one resume"
    );
    s.assert_no_leftovers();
}

#[test]
fn an_anonymous_bearer_token_is_fetched_from_the_realm_the_registry_names() {
    use std::io::BufReader;
    let layer_tar = Tar::new().file("hello", b"token").bytes();
    let (manifest, (c, config), (l, layer)) = one_layer_image(&layer_tar);
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let realm = format!("http://{addr}/token");
    let token_query = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let seen = token_query.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { return };
            let (path, headers) = read_request(&mut BufReader::new(conn.try_clone().unwrap()));
            let bearer = headers.iter().any(|h| h == "authorization: bearer t0k");
            let (status, extra, body): (&str, String, Vec<u8>) = if path.starts_with("/token?") {
                *seen.lock().unwrap() = path.clone();
                ("200 OK", String::new(), br#"{"token":"t0k"}"#.to_vec())
            } else if !bearer {
                let challenge = format!(
                    "WWW-Authenticate: Bearer realm=\"{realm}\",service=\"loop\",scope=\"repository:test/tok:pull\"\r\n"
                );
                ("401 Unauthorized", challenge, b"{}".to_vec())
            } else if path.ends_with("/manifests/v1") {
                (
                    "200 OK",
                    "Content-Type: application/vnd.oci.image.manifest.v1+json\r\n".into(),
                    manifest.clone(),
                )
            } else if path.ends_with(&c) {
                ("200 OK", String::new(), config.clone())
            } else if path.ends_with(&l) {
                ("200 OK", String::new(), layer.clone())
            } else {
                ("404 Not Found", String::new(), b"{}".to_vec())
            };
            let _ = respond(&mut conn, status, &extra, &body, usize::MAX);
        }
    });
    let s = scratch();
    let (res, _) = pull(&s, &format!("{addr}/test/tok:v1").parse().unwrap());
    let info = res.unwrap();
    assert_eq!(fs::read(info.rootfs.join("hello")).unwrap(), b"token");
    let query = token_query.lock().unwrap().clone();
    assert!(
        query.contains("scope=repository%3Atest%2Ftok%3Apull") && query.contains("service=loop"),
        "{query}"
    );
}

fn creds(username: &str, password: &str) -> Credentials {
    Credentials {
        username: username.into(),
        password: password.into(),
    }
}

#[test]
fn a_pull_that_needed_credentials_is_private_and_access_is_proven_by_digest() {
    let Some((reg, s, layout)) = setup(
        "a_pull_that_needed_credentials_is_private_and_access_is_proven_by_digest",
        true,
    ) else {
        return;
    };
    let m = layout.manifest(&[(LAYER_GZIP, base_layer())]);
    let digest = m["digest"].as_str().unwrap().to_string();
    layout.index(vec![tagged(m, "v1")]);
    reg.push(&layout.dir, "v1", "team/private", Some("u:p"));
    let r = reg.reference("team/private:v1");
    let user = |password: &str| RegistryOptions {
        user: Some(creds("u", password)),
        ..Default::default()
    };
    let (res, _) = pull_with(&s, &r, &user("p"));
    let info = res.unwrap();
    assert!(info.private, "credentials were needed");
    assert_eq!(info.digest, digest);
    assert!(s.store.get(&r.to_string()).unwrap().private);

    // Access is proven by the manifest's digest, with the credential given.
    wharf_images::check_access(&r, &digest, &user("p")).unwrap();
    for opts in [RegistryOptions::default(), user("wrong")] {
        let e = wharf_images::check_access(&r, &digest, &opts).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Refused, "{e}");
    }
    // The site's credential proves it too, but a user's own credential is used in its place.
    let site = RegistryOptions {
        credentials: [(reg.addr.clone(), creds("u", "p"))].into(),
        ..Default::default()
    };
    wharf_images::check_access(&r, &digest, &site).unwrap();
    let both = RegistryOptions {
        user: Some(creds("u", "wrong")),
        ..site.clone()
    };
    assert!(wharf_images::check_access(&r, &digest, &both).is_err());
    // Another digest is not this one.
    let other = format!("sha256:{}", "0".repeat(64));
    let e = wharf_images::check_access(&r, &other, &user("p")).unwrap_err();
    assert_eq!(e.kind, ErrorKind::NotFound, "{e}");

    // What an anonymous pull got is not private.
    let public = Loopback::start(false);
    public.push(&layout.dir, "v1", "team/public", None);
    let (res, _) = pull(&s, &public.reference("team/public:v1"));
    assert!(!res.unwrap().private);
}

/// Writes a one-layer image whose `/etc/who` says `who`, tagged with each of `tags`, as the
/// layout at `dir`; returns its manifest digest.
fn who_image(dir: &Path, who: &str, tags: &[&str]) -> String {
    let layout = Layout::new(dir.to_path_buf());
    let m = layout.manifest(&[(
        LAYER_GZIP,
        gzip(
            &Tar::new()
                .dir("etc")
                .file("etc/who", who.as_bytes())
                .bytes(),
        ),
    )]);
    let digest = m["digest"].as_str().unwrap().to_string();
    layout.index(tags.iter().map(|t| tagged(m.clone(), t)).collect());
    digest
}

#[test]
fn mirrors_are_tried_in_order_with_the_registry_last_and_digests_still_decide() {
    let test = "mirrors_are_tried_in_order_with_the_registry_last_and_digests_still_decide";
    if !tools(test) {
        return;
    }
    let s = scratch();
    let upstream = Loopback::start(false);
    let mirror = Loopback::start(false);
    let up_layout = s.work.join("up");
    let up_digest = who_image(&up_layout, "upstream", &["v1", "only-up"]);
    let mirror_layout = s.work.join("mirror");
    who_image(&mirror_layout, "mirror", &["v1", "only-mirror"]);
    for tag in ["v1", "only-up"] {
        upstream.push(&up_layout, tag, "test/app", None);
    }
    for tag in ["v1", "only-mirror"] {
        mirror.push(&mirror_layout, tag, "test/app", None);
    }
    // A mirror that is down first, then one that answers.
    let opts = RegistryOptions {
        mirrors: [(
            upstream.addr.clone(),
            vec![
                "http://127.0.0.1:1".into(),
                format!("http://{}", mirror.addr),
            ],
        )]
        .into(),
        ..Default::default()
    };
    let who = |r: &str, opts: &RegistryOptions| {
        let (res, _) = pull_with(&s, &r.parse().unwrap(), opts);
        res.map(|info| fs::read_to_string(info.rootfs.join("etc/who")).unwrap())
    };
    let name = |tag: &str| upstream.name(&format!("test/app{tag}"));

    // Served by the mirror although the registry lacks it (without mirrors: not found).
    let e = who(&name(":only-mirror"), &RegistryOptions::default()).unwrap_err();
    assert_eq!(e.kind, ErrorKind::NotFound, "{e}");
    assert_eq!(who(&name(":only-mirror"), &opts).unwrap(), "mirror");
    // The mirror lacks it: the registry serves it.
    assert_eq!(who(&name(":only-up"), &opts).unwrap(), "upstream");
    // A tag is what the first source that has it says it is ...
    assert_eq!(who(&name(":v1"), &opts).unwrap(), "mirror");
    // ... but a digest is the content: the mirror has no such manifest, so the registry
    // serves it.
    let pinned = name(&format!("@{up_digest}"));
    assert_eq!(who(&pinned, &opts).unwrap(), "upstream");
    // Every source down or missing it: the registry's own error, with the mirrors'.
    let e = who(&name(":nope"), &opts).unwrap_err();
    assert_eq!(e.kind, ErrorKind::NotFound, "{e}");
    assert!(e.message.contains("mirror 127.0.0.1:1"), "{e}");

    // A mirror that wants credentials gets the site's for its own host, never the user's.
    let locked = Loopback::start(true);
    locked.push(&mirror_layout, "only-mirror", "test/locked", Some("u:p"));
    let via_locked =
        |credentials: std::collections::BTreeMap<String, Credentials>| RegistryOptions {
            mirrors: [(upstream.addr.clone(), vec![locked.addr.clone()])].into(),
            user: Some(creds("u", "p")),
            credentials,
            ..Default::default()
        };
    let r = upstream.name("test/locked:only-mirror");
    let e = who(&r, &via_locked(Default::default())).unwrap_err();
    assert!(
        e.message.contains(&format!("mirror {}", locked.addr))
            && e.message.contains("requires credentials"),
        "{e}"
    );
    let site = [(locked.addr.clone(), creds("u", "p"))].into();
    let (res, _) = pull_with(&s, &r.parse().unwrap(), &via_locked(site));
    let info = res.unwrap();
    assert_eq!(
        fs::read_to_string(info.rootfs.join("etc/who")).unwrap(),
        "mirror"
    );
    assert!(info.private, "the mirror wanted credentials");

    // Written wrong: refused, naming the mirror.
    let bad = RegistryOptions {
        mirrors: [(upstream.addr.clone(), vec!["ftp://x".into()])].into(),
        ..Default::default()
    };
    let e = who(&name(":v1"), &bad).unwrap_err();
    assert!(e.message.contains("ftp://x"), "{e}");
}
