//! Registry images end to end: a loopback `docker-registry` (started here, on a free port)
//! holds an image pushed by `skopeo`; a job naming it is pulled on demand by the agent and
//! runs as its user; a missing tag ends the job with the registry's reason. A private image
//! (a registry that wants credentials) is pulled with its user's own credential, sent with the
//! submit, and served from the node's cache to another user only when his own credential
//! proves access.

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
pub(crate) fn write_layout(layout: &Path, tag: &str, layers: &[&Path]) {
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
    mkrootfs(&base, &["sh", "cat", "id", "sleep"]);
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

    // While a job runs on it, the image is in use: pinned by the agent and the job's shim,
    // so `rm` refuses it, naming why; once the job is over it goes.
    let out = c.wharf_as(
        &ann,
        &["submit", "--image", &reference, "--wrap", "sleep 60"],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let id = submitted_id(&out);
    c.wait_running(id);
    let store_arg = store.to_str().unwrap();
    let ls = c.wharf(&["image", "ls", "--json", "--store", store_arg]);
    let images: serde_json::Value = serde_json::from_slice(&ls.stdout).unwrap();
    assert_eq!(images[0]["name"], reference.as_str(), "{images}");
    assert_eq!(images[0]["in_use"], true, "{images}");
    let out = c.wharf(&["image", "rm", &reference, "--store", store_arg]);
    assert!(
        !out.status.success() && stderr(&out).contains("in use by a running job"),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
    let out = c.wharf(&["image", "prune", "--all", "--store", store_arg]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("Kept 1 in use"), "{}", stdout(&out));
    let out = c.wharf_as(&ann, &["cancel", &id.to_string()]);
    assert!(out.status.success(), "{}", stderr(&out));
    c.wait_done(id, Duration::from_secs(60));
    // Its record names the image and the manifest digest it ran.
    let digest = images[0]["digest"].as_str().unwrap();
    assert!(digest.starts_with("sha256:"), "{images}");
    let out = c.wharf_as(
        &ann,
        &[
            "acct",
            "-j",
            &id.to_string(),
            "-o",
            "Image,ImageDigest",
            "-n",
            "-p",
        ],
    );
    assert_eq!(
        stdout(&out).trim(),
        format!("{reference}|{digest}|"),
        "{}",
        stderr(&out)
    );
    let shown = stdout(&c.wharf_as(&ann, &["show", &id.to_string()]));
    assert!(
        shown.contains(&format!("{reference} ({digest})")),
        "{shown}"
    );
    // The agent lets its pin go when it sees the job over.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let out = c.wharf(&["image", "rm", &reference, "--store", store_arg]);
        if out.status.success() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline && stderr(&out).contains("in use"),
            "{}",
            stderr(&out)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let ls = c.wharf(&["image", "ls", "--json", "--store", store_arg]);
    assert_eq!(stdout(&ls).trim(), "[]");
    for dir in ["roots", "layers", "meta"] {
        assert_eq!(fs::read_dir(store.join(dir)).unwrap().count(), 0, "{dir}");
    }

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

    // The two images share their base layer; `inspect` and `ls` say so.
    let image = |args: &[&str]| {
        let out = Command::new(wharf_bin())
            .arg("image")
            .args(args)
            .arg("--store")
            .arg(&store)
            .output()
            .unwrap();
        assert!(out.status.success(), "{args:?}: {}", stderr(&out));
        out
    };
    let one = format!("{}/test/pull:one", reg.addr);
    let two = format!("{}/test/pull:two", reg.addr);
    let doc: serde_json::Value =
        serde_json::from_slice(&image(&["inspect", &one, "--json"]).stdout).unwrap();
    let layers = doc["layers"].as_array().unwrap();
    assert_eq!(layers.len(), 2, "{doc}");
    assert_eq!(layers[0]["images"], serde_json::json!([one, two]), "{doc}");
    assert_eq!(layers[1]["images"], serde_json::json!([one]), "{doc}");
    assert_eq!(layers[0]["size"], 1, "{doc}");
    assert_eq!(doc["image"]["in_use"], false, "{doc}");
    let text = stdout(&image(&["inspect", &one]));
    assert!(text.contains("LAYER") && text.contains("Shared"), "{text}");
    let ls: serde_json::Value = serde_json::from_slice(&image(&["ls", "--json"]).stdout).unwrap();
    assert_eq!(ls[0]["shared_size"], 1, "{ls}");
    assert_eq!(ls[0]["disk_size"], 1 + 3, "{ls}");
    let text = stdout(&image(&["ls"]));
    assert!(text.contains("SHARED") && text.contains("IN USE"), "{text}");
    // Down to a quota of 5 bytes, as a pull would: `one` (4 bytes with the base) and `two`
    // (3 more) do not fit; `one`, least recently used, would go with its own layer.
    let cfg = work.path().join("wharf.toml");
    fs::write(&cfg, "[images]\ncache_quota = \"5B\"\n").unwrap();
    let cfg = cfg.to_str().unwrap();
    let dry: serde_json::Value = serde_json::from_slice(
        &image(&[
            "prune",
            "--to-quota",
            "--dry-run",
            "--json",
            "--config",
            cfg,
        ])
        .stdout,
    )
    .unwrap();
    assert_eq!(dry["images"], serde_json::json!([one]), "{dry}");
    assert_eq!(dry["layers"].as_array().unwrap().len(), 1, "{dry}");
    assert_eq!(dry["cache_bytes"], 4, "{dry}");
    // Removing one keeps the shared layer; pruning everything, dry first, removes the rest.
    image(&["rm", &one]);
    let dry: serde_json::Value =
        serde_json::from_slice(&image(&["prune", "--all", "--dry-run", "--json"]).stdout).unwrap();
    assert_eq!(dry["images"], serde_json::json!([two]), "{dry}");
    assert_eq!(dry["layers"].as_array().unwrap().len(), 2, "{dry}");
    assert_eq!(dry["dry_run"], true, "{dry}");
    assert_eq!(fs::read_dir(store.join("layers")).unwrap().count(), 2);
    let text = stdout(&image(&["prune", "--all"]));
    assert!(
        text.contains("Removed 1 images, 1 roots, 2 layers"),
        "{text}"
    );
    assert_eq!(fs::read_dir(store.join("layers")).unwrap().count(), 0);
    let out = Command::new(wharf_bin())
        .args(["image", "pull", "nvcr.io#Bad/Name"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(stderr(&out).contains("lowercase"), "{}", stderr(&out));
}

/// Runs the CLI as `who` from their directory, which is also their `HOME` (where
/// `.docker/config.json` is looked for), with no other auth file in the environment.
pub(crate) fn wharf_home(c: &Cluster, who: &User, args: &[&str]) -> std::process::Output {
    let home = c.home(who);
    setpriv(who)
        .arg(wharf_bin())
        .args(args)
        .env("WHARF_SOCKET", &c.socket)
        .env("HOME", &home)
        .env_remove("REGISTRY_AUTH_FILE")
        .env_remove("XDG_RUNTIME_DIR")
        .current_dir(&home)
        .output()
        .unwrap()
}

/// What `wharf run --image REFERENCE -- cat /etc/greeting` prints as `user`; the run must
/// succeed.
fn cat_greeting(c: &Cluster, user: &User, reference: &str) -> String {
    let out = wharf_home(
        c,
        user,
        &[
            "run",
            "--image",
            reference,
            "--",
            "/bin/cat",
            "/etc/greeting",
        ],
    );
    assert!(
        out.status.success(),
        "{}{}\n{}",
        stdout(&out),
        stderr(&out),
        c.log()
    );
    stdout(&out)
}

/// Writes `who`'s `~/.docker/config.json` with `user:password` for `registry` (as `docker
/// login` does), theirs and 0600.
pub(crate) fn docker_login(c: &Cluster, who: &User, registry: &str, user: &str, password: &str) {
    use base64::Engine;
    let dir = c.home(who).join(".docker");
    fs::create_dir_all(&dir).unwrap();
    let auth = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
    let file = dir.join("config.json");
    fs::write(
        &file,
        serde_json::json!({ "auths": { registry: { "auth": auth } } }).to_string(),
    )
    .unwrap();
    for p in [&dir, &file] {
        nix::unistd::chown(p, Some(who.uid.into()), Some(who.gid.into())).unwrap();
    }
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(&file, fs::Permissions::from_mode(0o600)).unwrap();
}

/// Every file under `dir` (recursively) whose bytes hold `needle`.
fn files_holding(dir: &Path, needle: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            let Ok(meta) = fs::symlink_metadata(&p) else {
                continue;
            };
            if meta.is_dir() {
                stack.push(p);
            } else if meta.is_file() {
                let bytes = fs::read(&p).unwrap_or_default();
                if bytes.windows(needle.len()).any(|w| w == needle.as_bytes()) {
                    out.push(p.display().to_string());
                }
            }
        }
    }
    out
}

#[test]
fn a_private_image_in_the_cache_is_served_only_to_users_whose_credentials_prove_access() {
    let test =
        "a_private_image_in_the_cache_is_served_only_to_users_whose_credentials_prove_access";
    if !can_run(test) || !tools(test) {
        return;
    }
    let ann_secret = "ann-registry-secret-7f3a91";
    let bob_secret = "bob-registry-secret-c04e22";
    let work = scratch("whpriv-");
    let reg = Loopback::start_with_users(
        work.path(),
        &[("u", "p"), ("ann", ann_secret), ("bob", bob_secret)],
    );
    let base = work.path().join("base");
    mkrootfs(&base, &["sh", "cat"]);
    let top = work.path().join("top");
    fs::create_dir_all(top.join("etc")).unwrap();
    fs::write(top.join("etc/greeting"), "private content\n").unwrap();
    let layout = work.path().join("layout");
    write_layout(&layout, "v1", &[&base, &top]);
    reg.push(&layout, "v1", "team/private", Some("u:p"));
    let reference = reg.name("team/private:v1");

    let c = Cluster::start();
    let ann = user("whpriv-ann");
    let bob = user("whpriv-bob");
    docker_login(&c, &ann, &reg.addr, "ann", ann_secret);

    // Ann's credential goes with her submit: a 0600 root file per job, in no listing, and
    // deleted when the job ends (here: cancelled while held).
    let out = wharf_home(
        &c,
        &ann,
        &["submit", "--hold", "--image", &reference, "--wrap", "true"],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let held = submitted_id(&out);
    let file = c
        .dir
        .join("controller/registry-auth")
        .join(held.to_string());
    let meta = fs::metadata(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    use std::os::unix::fs::MetadataExt;
    assert_eq!((meta.mode() & 0o7777, meta.uid()), (0o600, 0));
    for args in [
        vec!["show", &*held.to_string(), "--json"],
        vec!["queue", "--json"],
        vec!["queue", "--all", "--json"],
    ] {
        let out = wharf_home(&c, &ann, &args);
        assert!(out.status.success(), "{args:?}: {}", stderr(&out));
        assert!(!stdout(&out).contains(ann_secret), "{args:?}");
        assert!(
            stdout(&out).contains("team/private") || args[0] == "queue",
            "{args:?}"
        );
    }
    let out = wharf_home(&c, &ann, &["cancel", &held.to_string()]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(!file.exists(), "deleted when the job was cancelled");

    // Ann pulls it with her credential and runs it.
    assert_eq!(cat_greeting(&c, &ann, &reference), "private content\n");
    let store = c.dir.join("images");
    let out = c.wharf(&["image", "ls", "--store", store.to_str().unwrap()]);
    assert!(
        stdout(&out).contains(&reference),
        "cached: {}",
        stdout(&out)
    );

    // Bob, without a credential, then with a wrong one: refused although it is cached.
    let refused = |c: &Cluster| {
        let out = wharf_home(
            c,
            &bob,
            &[
                "submit",
                "--image",
                &reference,
                "--wrap",
                "cat /etc/greeting",
            ],
        );
        assert!(out.status.success(), "{}", stderr(&out));
        let id = submitted_id(&out);
        let job = c.wait_done(id, Duration::from_secs(60));
        assert_eq!(job["state"], "FAILED", "{job}");
        assert!(
            job.to_string().contains("access denied to private image"),
            "{job}"
        );
        let output = c.home(&bob).join(format!("wharf-{id}.out"));
        let text = fs::read_to_string(&output).unwrap_or_default();
        assert!(!text.contains("private content"), "{text}");
    };
    refused(&c);
    docker_login(&c, &bob, &reg.addr, "bob", "not-his-password");
    refused(&c);

    // Bob with his own valid credential: served from the cache.
    docker_login(&c, &bob, &reg.addr, "bob", bob_secret);
    assert_eq!(cat_greeting(&c, &bob, &reference), "private content\n");

    // No credential is left on disk, nor in the daemons' log.
    for secret in [ann_secret, bob_secret] {
        let held = files_holding(&c.dir.join("controller"), secret);
        assert!(held.is_empty(), "{held:?}");
        let held = files_holding(&c.dir.join("agent"), secret);
        assert!(held.is_empty(), "{held:?}");
        assert!(!c.log().contains(secret));
    }
    assert_eq!(
        fs::read_dir(c.dir.join("controller/registry-auth"))
            .unwrap()
            .count(),
        0
    );
}

/// A TCP proxy on 127.0.0.1 in front of `upstream` that passes requests on as they come and
/// answers at most `chunk` bytes per `every` per connection: a registry slow enough for a
/// pull to be watched. Returns its `127.0.0.1:port`; it serves until the test process ends.
pub(crate) fn slow_proxy(upstream: &str, chunk: usize, every: Duration) -> String {
    use std::io::{Read, Write};
    use std::net::{Shutdown, TcpListener, TcpStream};
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let upstream = upstream.to_string();
    std::thread::spawn(move || {
        for client in listener.incoming().flatten() {
            let Ok(server) = TcpStream::connect(&upstream) else {
                continue;
            };
            let (mut to_server, mut from_client) =
                (server.try_clone().unwrap(), client.try_clone().unwrap());
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut from_client, &mut to_server);
                let _ = to_server.shutdown(Shutdown::Write);
            });
            let (mut from_server, mut to_client) = (server, client);
            std::thread::spawn(move || {
                let mut buf = vec![0u8; chunk];
                loop {
                    match from_server.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => {
                            if to_client.write_all(&buf[..n]).is_err() {
                                break;
                            }
                        }
                    }
                    std::thread::sleep(every);
                }
                let _ = to_client.shutdown(Shutdown::Write);
            });
        }
    });
    addr
}

#[test]
fn a_starting_jobs_image_pull_progress_is_shown_until_it_runs() {
    let test = "a_starting_jobs_image_pull_progress_is_shown_until_it_runs";
    if !can_run(test) || !tools(test) {
        return;
    }
    let work = scratch("whregprog-");
    let reg = Loopback::start_in(work.path(), false);
    let base = work.path().join("base");
    mkrootfs(&base, &["sh", "cat", "wc"]);
    // Five more layers of 512 KiB each that nothing can shrink.
    let mut layers = vec![base.clone()];
    let mut random = fs::File::open("/dev/urandom").unwrap();
    for i in 0..5 {
        let dir = work.path().join(format!("layer{i}"));
        fs::create_dir_all(dir.join("data")).unwrap();
        let mut bytes = vec![0u8; 512 << 10];
        std::io::Read::read_exact(&mut random, &mut bytes).unwrap();
        fs::write(dir.join(format!("data/{i}")), bytes).unwrap();
        layers.push(dir);
    }
    let layout = work.path().join("layout");
    let refs: Vec<&Path> = layers.iter().map(|p| p.as_path()).collect();
    write_layout(&layout, "v1", &refs);
    reg.push(&layout, "v1", "test/big", None);
    // About 640 kB/s per connection: the pull takes seconds.
    let slow = slow_proxy(&reg.addr, 16 << 10, Duration::from_millis(25));
    let reference = format!("{slow}/test/big:v1");

    let c = Cluster::start();
    let pat = user("whreg-pat");
    let out = c.wharf_as(
        &pat,
        &[
            "submit",
            "--image",
            &reference,
            "--wrap",
            "cat /data/4 | wc -c",
        ],
    );
    let id = submitted_id(&out);
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    let mut seen = Vec::new();
    let mut lines = Vec::new();
    loop {
        let job = c.job(id);
        let state = job["state"].as_str().unwrap_or_default().to_string();
        if state != "PENDING" && state != "STARTING" {
            break;
        }
        if let Some(p) = job["pulling"].as_array().and_then(|p| p.first()) {
            assert_eq!(p["node"], job["allocs"][0]["node"], "{job}");
            seen.push(p.clone());
            let human = stdout(&c.wharf(&["show", &id.to_string()]));
            if let Some(line) = human.lines().find(|l| l.contains("pulling")) {
                lines.push(line.trim().to_string());
            }
        }
        assert!(
            std::time::Instant::now() < deadline,
            "job {id} still {state}: {job}\n{}",
            c.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let job = c.wait_done(id, Duration::from_secs(60));
    assert_eq!(job["state"], "COMPLETED", "{job}\n{}", c.log());
    assert!(job.get("pulling").is_none(), "{job}");
    // Seen while STARTING: the image, its 6 layers and their bytes (at least the random
    // data's, however the push compressed them), some not there yet.
    let partial = seen.iter().find(|p| {
        p["layers"] == 6
            && p["bytes"].as_u64().unwrap() >= 5 * (512 << 10)
            && p["layers_done"].as_u64().unwrap() < 6
            && p["bytes_done"].as_u64() < p["bytes"].as_u64()
    });
    assert!(
        partial.is_some_and(|p| p["image"] == reference.as_str()),
        "no progress seen while the job was pulled: {seen:?}\n{}",
        c.log()
    );
    let shown = lines.iter().find(|l| l.contains(" of 6 layers"));
    assert!(
        shown.is_some_and(
            |l| l.starts_with(&format!("Image: pulling {reference}: ")) && l.contains(" MB, ")
        ),
        "{lines:?}"
    );
    // The progress moved, in reports at most about one a second.
    let counts: std::collections::BTreeSet<u64> = seen
        .iter()
        .map(|p| p["layers_done"].as_u64().unwrap())
        .collect();
    assert!(counts.len() >= 2, "{seen:?}");
    let out = fs::read_to_string(c.home(&pat).join(format!("wharf-{id}.out"))).unwrap();
    assert_eq!(out.trim(), (512 << 10).to_string());
}
