//! Registry images end to end: a loopback `docker-registry` (started here, on a free port)
//! holds an image pushed by `skopeo`; a job naming it is pulled on demand by the agent and
//! runs as its user; a missing tag ends the job with the registry's reason.

use std::fs;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use sha2::{Digest, Sha256};

use crate::harness::*;
use crate::loopback::{tools, Loopback};

fn sha256(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

/// Writes an OCI layout at `layout` whose image `tag` stacks `layers` (directories, bottom
/// first, each archived with `tar`), with a config naming their diff_ids.
fn write_layout(layout: &Path, tag: &str, layers: &[&Path]) {
    let blobs = layout.join("blobs/sha256");
    fs::create_dir_all(&blobs).unwrap();
    let put = |bytes: &[u8]| {
        let digest = sha256(bytes);
        fs::write(blobs.join(digest.trim_start_matches("sha256:")), bytes).unwrap();
        (digest, bytes.len())
    };
    let mut descs = Vec::new();
    let mut diff_ids = Vec::new();
    for dir in layers {
        let out = Command::new("tar")
            .args(["--numeric-owner", "-C"])
            .arg(dir)
            .args(["-cf", "-", "."])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "tar: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let (digest, size) = put(&out.stdout);
        diff_ids.push(digest.clone());
        descs.push(serde_json::json!({
            "mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": digest, "size": size
        }));
    }
    let config = serde_json::json!({
        "architecture": if cfg!(target_arch = "aarch64") { "arm64" } else { "amd64" },
        "os": "linux",
        "rootfs": { "type": "layers", "diff_ids": diff_ids },
    });
    let (cd, cs) = put(&serde_json::to_vec(&config).unwrap());
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": { "mediaType": "application/vnd.oci.image.config.v1+json", "digest": cd, "size": cs },
        "layers": descs,
    });
    let (md, ms) = put(&serde_json::to_vec(&manifest).unwrap());
    let index = serde_json::json!({
        "schemaVersion": 2,
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": md, "size": ms,
            "annotations": { "org.opencontainers.image.ref.name": tag },
        }],
    });
    fs::write(
        layout.join("index.json"),
        serde_json::to_vec(&index).unwrap(),
    )
    .unwrap();
    fs::write(
        layout.join("oci-layout"),
        br#"{"imageLayoutVersion":"1.0.0"}"#,
    )
    .unwrap();
}

#[test]
fn a_job_naming_a_registry_image_is_pulled_and_runs_as_its_user() {
    let test = "a_job_naming_a_registry_image_is_pulled_and_runs_as_its_user";
    if !can_run(test) || !tools(test) {
        return;
    }
    let work = scratch("whreg-");
    let reg = Loopback::start_in(work.path(), false);
    let base = work.path().join("base");
    mkrootfs(&base, &["sh", "cat", "id"]);
    let top = work.path().join("top");
    fs::create_dir_all(top.join("etc")).unwrap();
    fs::write(top.join("etc/greeting"), "from the registry\n").unwrap();
    let layout = work.path().join("layout");
    write_layout(&layout, "v1", &[&base, &top]);
    reg.push(&layout, "v1", "test/app", None);
    let reference = reg.name("test/app:v1");

    let c = Cluster::start();
    let ann = user("whreg-ann");
    let out = c.run_sh(&ann, &["--image", &reference], "cat /etc/greeting; id -u");
    assert!(
        out.status.success(),
        "{}{}\n{}",
        stdout(&out),
        stderr(&out),
        c.log()
    );
    assert_eq!(
        stdout(&out).lines().collect::<Vec<_>>(),
        ["from the registry", ann.uid.to_string().as_str()]
    );
    // The node keeps it, under the reference's canonical name, for the next job.
    let store = c.dir.join("images");
    let out = c.wharf(&["image", "ls", "--store", store.to_str().unwrap()]);
    assert!(stdout(&out).contains(&reference), "{}", stdout(&out));

    // A tag the registry lacks: the job ends with the registry's reason.
    let missing = reg.name("test/app:nope");
    let out = c.wharf_as(&ann, &["submit", "--image", &missing, "--wrap", "true"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let job = c.wait_done(submitted_id(&out), Duration::from_secs(60));
    assert_eq!(job["state"], "FAILED", "{job}");
    assert!(job.to_string().contains("MANIFEST_UNKNOWN"), "{job}");

    // A bad reference is refused at submit, before it is queued.
    let out = c.wharf_as(
        &ann,
        &[
            "submit",
            "--image",
            "127.0.0.1:5000/Test/App",
            "--wrap",
            "true",
        ],
    );
    assert!(!out.status.success());
    assert!(stderr(&out).contains("lowercase"), "{}", stderr(&out));
}

#[test]
fn wharf_image_pull_shows_each_layer_and_fetches_shared_layers_once() {
    let test = "wharf_image_pull_shows_each_layer_and_fetches_shared_layers_once";
    if !can_run(test) || !tools(test) {
        return;
    }
    let work = scratch("whregpull-");
    let reg = Loopback::start_in(work.path(), false);
    let base = work.path().join("base");
    fs::create_dir_all(base.join("etc")).unwrap();
    fs::write(base.join("etc/base"), "b").unwrap();
    for (tag, file) in [("one", "a"), ("two", "b")] {
        let top = work.path().join(tag);
        fs::create_dir_all(&top).unwrap();
        fs::write(top.join(file), tag).unwrap();
        let layout = work.path().join(format!("layout-{tag}"));
        write_layout(&layout, tag, &[&base, &top]);
        reg.push(&layout, tag, "test/pull", None);
    }
    let store = work.path().join("store");
    let pull = |tag: &str| {
        Command::new(wharf_bin())
            .args([
                "image",
                "pull",
                &format!("docker://{}/test/pull:{tag}", reg.addr),
                "--store",
            ])
            .arg(&store)
            .output()
            .unwrap()
    };
    let out = pull("one");
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.contains("2 layers") && text.contains("Pulled"),
        "{text}"
    );
    assert_eq!(text.matches("fetched and unpacked").count(), 2, "{text}");
    let out = pull("two");
    let text = stdout(&out);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        text.contains("Layer 1") && text.contains("already here"),
        "{text}"
    );
    assert_eq!(text.matches("fetched and unpacked").count(), 1, "{text}");
    let out = Command::new(wharf_bin())
        .args(["image", "pull", "nvcr.io#Bad/Name"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(stderr(&out).contains("lowercase"), "{}", stderr(&out));
}
