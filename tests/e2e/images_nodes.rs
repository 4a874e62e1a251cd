//! Images on nodes: twenty jobs asking at once for one new image (one download of each
//! blob), an admin's pre-pull (`wharf image pull REF --nodes ...`) through the controller to
//! each agent, two nodes sharing a layer cache (`[images] shared_cache`), and the Docker
//! backend pulling a registry image through the engine with the job's own credential, from
//! the site's mirrors first.

use std::fs;
use std::path::Path;
use std::time::Duration;

use crate::harness::*;
use crate::images_registry::{docker_login, slow_proxy, wharf_home, write_layout};
use crate::loopback::{tools, Loopback};

/// Pushes `REPO:v1` (a base of `sh`, `cat` and `id`, and `/etc/greeting` saying `greeting`) to
/// `reg`, with `creds` when the registry wants some.
fn push_app(reg: &Loopback, work: &Path, repo: &str, greeting: &str, creds: Option<&str>) {
    let base = work.join("base");
    if !base.exists() {
        mkrootfs(&base, &["sh", "cat", "id"]);
    }
    let top = work.join(format!("top-{}", repo.replace('/', "-")));
    fs::create_dir_all(top.join("etc")).unwrap();
    fs::write(top.join("etc/greeting"), greeting).unwrap();
    let layout = work.join(format!("layout-{}", repo.replace('/', "-")));
    write_layout(&layout, "v1", &[&base, &top]);
    reg.push(&layout, "v1", repo, creds);
}

/// The blob GETs the registry answered since `before`.
fn gets_since(
    reg: &Loopback,
    before: &std::collections::BTreeMap<String, usize>,
) -> std::collections::BTreeMap<String, usize> {
    let mut gets = reg.blob_gets();
    for (d, n) in before {
        if let Some(now) = gets.get_mut(d) {
            *now -= n;
        }
    }
    gets.retain(|_, n| *n > 0);
    gets
}

#[test]
fn an_admin_pre_pulls_on_named_nodes_and_the_second_takes_layers_from_the_shared_cache() {
    let test =
        "an_admin_pre_pulls_on_named_nodes_and_the_second_takes_layers_from_the_shared_cache";
    if !can_run(test) || !tools(test) {
        return;
    }
    let mut c = TcpCluster::controller("whprepull-", "node_timeout = \"10s\"\n");
    let d = c.dir.path().to_path_buf();
    let reg = Loopback::start_in(&d, false);
    push_app(&reg, &d, "test/app", "pre-pulled\n", None);
    let reference = reg.name("test/app:v1");
    let token = c.token();
    for name in ["n1", "n2"] {
        c.agent_with(
            name,
            &token,
            &format!(
                "image_store = \"{0}/images-{name}\"\n[images]\nshared_cache = \"{0}/shared\"\nshared_cache_quota = \"1G\"\n",
                d.display()
            ),
        );
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while c.nodes().matches("UP").count() < 2 {
        assert!(std::time::Instant::now() < deadline, "{}", c.logs());
        std::thread::sleep(Duration::from_millis(100));
    }
    // Not an admin: refused, and nothing is pulled.
    let pat = user("whprepull-pat");
    let out = as_user(
        &pat,
        Path::new("/"),
        wharf_bin(),
        &["image", "pull", &reference, "--nodes", "n1"],
        &c.socket,
    );
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("only an admin may pull images on nodes"),
        "{}",
        stderr(&out)
    );
    // A node that does not exist is named, with those that do.
    let out = c.wharf(&["image", "pull", &reference, "--nodes", "n1,gpu9"]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("no node \"gpu9\" (the nodes are: n1, n2)"),
        "{}",
        stderr(&out)
    );
    assert!(!d.join("images-n1/layers").exists() || entries(&d.join("images-n1/layers")) == 0);
    let before = reg.blob_gets();

    // n1 pulls, line by line; then n2, as JSON, downloading no layer: the shared cache has
    // what n1 unpacked.
    let out = c.wharf(&["image", "pull", &reference, "--nodes", "n1"]);
    let text = stdout(&out);
    assert!(out.status.success(), "{text}{}\n{}", stderr(&out), c.logs());
    assert!(text.contains("n1: pulled sha256:"), "{text}");
    assert!(
        text.contains(&format!("Pulled {reference} on 1 nodes")),
        "{text}"
    );
    assert_eq!(entries(&d.join("shared/layers")), 2);
    let out = c.wharf(&["image", "pull", &reference, "--nodes", "n2", "--json"]);
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["image"], reference.as_str(), "{doc}");
    assert_eq!(doc["nodes"][0]["node"], "n2", "{doc}");
    assert_eq!(doc["nodes"][0]["state"], "done", "{doc}");
    assert_eq!(doc["nodes"][0]["cached"], true, "{doc}");
    assert_eq!(doc["nodes"][0]["progress"]["layers"], 2, "{doc}");
    // Each layer was downloaded once, by n1; the config once per node.
    let gets = gets_since(&reg, &before);
    assert_eq!(gets.len(), 3, "{gets:?}");
    assert_eq!(gets.values().filter(|n| **n == 1).count(), 2, "{gets:?}");
    assert_eq!(gets.values().filter(|n| **n == 2).count(), 1, "{gets:?}");
    for node in ["n1", "n2"] {
        let out = c.wharf(&[
            "image",
            "ls",
            "--store",
            d.join(format!("images-{node}")).to_str().unwrap(),
        ]);
        assert!(
            stdout(&out).contains(&reference),
            "{node}: {}",
            stdout(&out)
        );
    }
    // The shared cache evicted by hand: `wharf image prune --shared`, down to its quota.
    let cfg = d.join("prune.toml");
    let cfg_arg = cfg.to_str().unwrap();
    let shared = format!("[images]\nshared_cache = \"{}/shared\"\n", d.display());
    fs::write(&cfg, &shared).unwrap();
    let prune = |args: &[&str]| {
        let mut all = vec!["image", "prune", "--shared", "--config", cfg_arg];
        all.extend_from_slice(args);
        c.wharf(&all)
    };
    let out = prune(&[]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("no [images] shared_cache_quota"),
        "{}",
        stderr(&out)
    );
    fs::write(&cfg, format!("{shared}shared_cache_quota = \"1K\"\n")).unwrap();
    let out = prune(&["--dry-run"]);
    assert!(out.status.success(), "{}", stderr(&out));
    // The base layer (megabytes) goes whatever the order; the top one (a few bytes) may go
    // first, or stay.
    let text = stdout(&out);
    assert!(
        text.contains("Would remove ") && text.contains("from the shared cache"),
        "{text}"
    );
    let out = prune(&["--dry-run", "--json"]);
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(doc["cache_bytes"].as_u64().unwrap() <= 1024, "{doc}");
    assert!(!doc["layers"].as_array().unwrap().is_empty(), "{doc}");
    assert_eq!(doc["dry_run"], true, "{doc}");
    assert_eq!(entries(&d.join("shared/layers")), 2);
    let out = prune(&["--all", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["layers"].as_array().unwrap().len(), 2, "{doc}");
    assert_eq!(doc["cache_bytes"], 0, "{doc}");
    assert_eq!(entries(&d.join("shared/layers")), 0);
    // The nodes' own stores keep their images.
    let out = c.wharf(&[
        "image",
        "ls",
        "--store",
        d.join("images-n2").to_str().unwrap(),
    ]);
    assert!(stdout(&out).contains(&reference), "{}", stdout(&out));
    // A tag the registry lacks fails on the node, with the registry's reason.
    let out = c.wharf(&["image", "pull", &reg.name("test/app:nope"), "--nodes", "n1"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stdout(&out).contains("n1: failed: pulling image")
            && stdout(&out).contains("MANIFEST_UNKNOWN"),
        "{}",
        stdout(&out)
    );
    assert!(
        stderr(&out).contains("1 of 1 nodes could not pull"),
        "{}",
        stderr(&out)
    );
}

fn entries(dir: &Path) -> usize {
    fs::read_dir(dir).map_or(0, |d| d.count())
}

/// Whether the Docker engine answers; else says why (and fails under `WHARF_TEST_STRICT=1`).
fn docker(test: &str) -> bool {
    if std::process::Command::new("docker")
        .arg("info")
        .output()
        .is_ok_and(|o| o.status.success())
    {
        return true;
    }
    let why = format!("{test}: needs a running Docker engine");
    assert!(
        std::env::var("WHARF_TEST_STRICT").as_deref() != Ok("1"),
        "{why}"
    );
    eprintln!("SKIPPED {why}");
    false
}

/// Removes an engine image when the test ends, passed or failed.
struct EngineImage(String);

impl Drop for EngineImage {
    fn drop(&mut self) {
        let _ = std::process::Command::new("docker")
            .args(["rmi", "-f", &self.0])
            .output();
    }
}

#[test]
fn a_docker_node_pulls_a_registry_image_through_the_engine_with_the_jobs_credential() {
    let test = "a_docker_node_pulls_a_registry_image_through_the_engine_with_the_jobs_credential";
    if !can_run(test) || !tools(test) || !docker(test) {
        return;
    }
    let ann_secret = "ann-engine-secret-51c2";
    let work = scratch("whdockreg-");
    let reg = Loopback::start_with_users(work.path(), &[("u", "p"), ("ann", ann_secret)]);
    push_app(
        &reg,
        work.path(),
        "team/private",
        "through the engine\n",
        Some("u:p"),
    );
    let reference = reg.name("team/private:v1");
    let _cleanup = EngineImage(reference.clone());

    let c = Cluster::start_with("backend = \"docker\"");
    let ann = user("whdock-ann");
    let bob = user("whdock-bob");
    docker_login(&c, &ann, &reg.addr, "ann", ann_secret);
    // Ann's own credential goes with her job; the engine pulls with it, and the job runs as
    // her. `docker://` is the same reference.
    for image in [reference.clone(), format!("docker://{reference}")] {
        let out = wharf_home(
            &c,
            &ann,
            &[
                "run",
                "--image",
                &image,
                "--",
                "/bin/sh",
                "-c",
                "cat /etc/greeting; id -u",
            ],
        );
        assert!(
            out.status.success(),
            "{}{}\n{}",
            stdout(&out),
            stderr(&out),
            c.log()
        );
        assert_eq!(
            stdout(&out),
            format!("through the engine\n{}\n", ann.uid),
            "{image}"
        );
    }
    // Bob has none: the engine has the image, but the registry is asked again with his (no)
    // credential, and refuses.
    let out = wharf_home(
        &c,
        &bob,
        &["submit", "--image", &reference, "--wrap", "true"],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let job = c.wait_done(submitted_id(&out), Duration::from_secs(120));
    assert_eq!(job["state"], "FAILED", "{job}");
    let text = job.to_string();
    assert!(
        text.contains("pulling image") && text.contains(&reference),
        "{job}"
    );
    assert!(
        text.contains("no basic auth credentials") || text.to_lowercase().contains("unauthorized"),
        "{job}"
    );
    // The job's own fault: failed at once, not retried as a node's.
    assert_eq!(job["exit"]["fault"]["code"], "image_denied", "{job}");
    assert_eq!(job["restarts"].as_u64().unwrap_or(0), 0, "{job}");
    // A tag the registry lacks: the engine's reason.
    let out = wharf_home(
        &c,
        &ann,
        &[
            "submit",
            "--image",
            &reg.name("team/private:nope"),
            "--wrap",
            "true",
        ],
    );
    let job = c.wait_done(submitted_id(&out), Duration::from_secs(120));
    assert_eq!(job["state"], "FAILED", "{job}");
    assert!(
        job.to_string().contains("not found") || job.to_string().contains("unknown"),
        "{job}"
    );

    // An admin's pre-pull on a Docker node goes through the engine too (a public image: the
    // node has no credential of its own here).
    let public = Loopback::start_in(work.path(), false);
    push_app(&public, work.path(), "test/public", "public\n", None);
    let reference = public.name("test/public:v1");
    let _cleanup_public = EngineImage(reference.clone());
    let nodes: serde_json::Value =
        serde_json::from_slice(&c.wharf(&["nodes", "--json"]).stdout).unwrap();
    let node = nodes["nodes"][0]["info"]["name"]
        .as_str()
        .unwrap()
        .to_string();
    let out = c.wharf(&["image", "pull", &reference, "--nodes", &node]);
    let text = stdout(&out);
    assert!(out.status.success(), "{text}{}\n{}", stderr(&out), c.log());
    assert!(text.contains(&format!("{node}: pulled sha256:")), "{text}");
    let inspect = std::process::Command::new("docker")
        .args(["image", "inspect", &reference])
        .output()
        .unwrap();
    assert!(inspect.status.success(), "the engine lacks {reference}");
}

/// Pushes `repo:tag` to `reg`: a base of `sh` and `cat`, and `/etc/greeting` saying
/// `greeting`, laid out under `work/name`.
fn push_tag(
    reg: &Loopback,
    work: &Path,
    name: &str,
    repo_tag: &str,
    greeting: &str,
    creds: Option<&str>,
) {
    let (repo, tag) = repo_tag.split_once(':').unwrap();
    let base = work.join("base");
    if !base.exists() {
        mkrootfs(&base, &["sh", "cat"]);
    }
    let top = work.join(format!("top-{name}"));
    fs::create_dir_all(top.join("etc")).unwrap();
    fs::write(top.join("etc/greeting"), greeting).unwrap();
    let layout = work.join(format!("layout-{name}"));
    write_layout(&layout, tag, &[&base, &top]);
    reg.push(&layout, tag, repo, creds);
}

#[test]
fn a_docker_node_pulls_from_the_mirrors_first_and_falls_back_to_the_registry() {
    let test = "a_docker_node_pulls_from_the_mirrors_first_and_falls_back_to_the_registry";
    if !can_run(test) || !tools(test) || !docker(test) {
        return;
    }
    let secret = "ann-mirror-secret-7d1e";
    let work = scratch("whdockmirror-");
    // The registry wants a credential; its mirror serves its own copy of v1 (other content,
    // to tell who served it) and lacks v2.
    let origin = Loopback::start_with_users(work.path(), &[("ann", secret)]);
    let mirror = Loopback::start_in(work.path(), false);
    let creds = format!("ann:{secret}");
    push_tag(
        &origin,
        work.path(),
        "o1",
        "team/app:v1",
        "registry v1\n",
        Some(&creds),
    );
    push_tag(
        &origin,
        work.path(),
        "o2",
        "team/app:v2",
        "registry v2\n",
        Some(&creds),
    );
    push_tag(
        &mirror,
        work.path(),
        "m1",
        "team/app:v1",
        "mirror v1\n",
        None,
    );
    let v1 = origin.name("team/app:v1");
    let v2 = origin.name("team/app:v2");
    let at_mirror = mirror.name("team/app:v1");
    let mut cleanup = vec![
        EngineImage(v1.clone()),
        EngineImage(v2.clone()),
        EngineImage(at_mirror.clone()),
    ];
    let c = Cluster::start_with(&format!(
        "backend = \"docker\"\n[images]\nmirrors = {{ \"{}\" = [\"http://127.0.0.1:1\", \"http://{}\"] }}\n",
        origin.addr, mirror.addr
    ));
    let ann = user("whdmir-ann");
    let bob = user("whdmir-bob");
    docker_login(&c, &ann, &origin.addr, "ann", secret);
    let run = |who: &User, image: &str| {
        let out = wharf_home(
            &c,
            who,
            &[
                "run",
                "--image",
                image,
                "--",
                "/bin/sh",
                "-c",
                "cat /etc/greeting",
            ],
        );
        assert!(
            out.status.success(),
            "{image}: {}{}\n{}",
            stdout(&out),
            stderr(&out),
            c.log()
        );
        stdout(&out)
    };
    let origin_gets = origin.blob_gets();
    // v1: the first mirror is down, the second serves it, under the registry's name; the
    // registry is not asked.
    assert_eq!(run(&ann, &v1), "mirror v1\n");
    assert_eq!(origin.blob_gets(), origin_gets, "the registry was asked");
    assert!(!mirror.blob_gets().is_empty());
    let inspect = |name: &str| {
        std::process::Command::new("docker")
            .args([
                "image",
                "inspect",
                "--format",
                "{{json .RepoDigests}}",
                name,
            ])
            .output()
            .unwrap()
    };
    assert!(inspect(&v1).status.success(), "the engine lacks {v1}");
    // Pinned by the digest the mirror serves (the registry has no such manifest): runs under
    // the mirror's name for it.
    let digests: Vec<String> = serde_json::from_slice(&inspect(&at_mirror).stdout).unwrap();
    let digest = digests
        .iter()
        .find_map(|d| d.strip_prefix(&format!("{}/team/app@", mirror.addr)))
        .unwrap_or_else(|| panic!("{digests:?}"))
        .to_string();
    let pinned = origin.name(&format!("team/app@{digest}"));
    cleanup.push(EngineImage(format!("{}/team/app@{digest}", mirror.addr)));
    assert_eq!(run(&ann, &pinned), "mirror v1\n");
    // v2: no mirror has it; the registry serves it with Ann's own credential.
    assert_eq!(run(&ann, &v2), "registry v2\n");
    // Bob has no credential: the mirrors lack v2, and the registry refuses him, although the
    // engine has the image. The mirrors' failures come after the registry's reason.
    let out = wharf_home(&c, &bob, &["submit", "--image", &v2, "--wrap", "true"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let job = c.wait_done(submitted_id(&out), Duration::from_secs(120));
    assert_eq!(job["state"], "FAILED", "{job}");
    assert_eq!(job["exit"]["fault"]["code"], "image_denied", "{job}");
    let text = job.to_string();
    assert!(text.contains(&format!("mirror {}", mirror.addr)), "{job}");
    // The mirror goes down: v1 comes from the registry now, with Ann's credential, and the
    // registry's content replaces the mirror's under the name.
    drop(mirror);
    assert_eq!(run(&ann, &v1), "registry v1\n");
    drop(cleanup);
}

#[test]
fn twenty_jobs_asking_at_once_for_one_new_image_cause_one_download() {
    let test = "twenty_jobs_asking_at_once_for_one_new_image_cause_one_download";
    if !can_run(test) || !tools(test) {
        return;
    }
    let work = scratch("whregmany-");
    let reg = Loopback::start_in(work.path(), false);
    let base = work.path().join("base");
    mkrootfs(&base, &["sh", "cat"]);
    let top = work.path().join("top");
    fs::create_dir_all(top.join("etc")).unwrap();
    fs::write(top.join("etc/greeting"), "one download\n").unwrap();
    let layout = work.path().join("layout");
    write_layout(&layout, "v1", &[&base, &top]);
    reg.push(&layout, "v1", "test/many", None);
    // Slow enough (about 1.3 MB/s per connection) that the jobs placed first are still
    // pulling when the next are placed.
    let slow = slow_proxy(&reg.addr, 32 << 10, Duration::from_millis(25));
    let reference = format!("{slow}/test/many:v1");
    let pushed = reg.blob_gets();

    let c = Cluster::start();
    if !c.has_cpus(test, 2) {
        return;
    }
    let ann = user("whreg-ann");
    let ids: Vec<u64> = std::thread::scope(|scope| {
        let submits: Vec<_> = (0..20)
            .map(|_| {
                let (c, ann, reference) = (&c, &ann, &reference);
                scope.spawn(move || {
                    let out = c.wharf_as(
                        ann,
                        &[
                            "submit",
                            "--image",
                            reference,
                            "--wrap",
                            "cat /etc/greeting",
                        ],
                    );
                    assert!(out.status.success(), "{}", stderr(&out));
                    submitted_id(&out)
                })
            })
            .collect();
        submits.into_iter().map(|s| s.join().unwrap()).collect()
    });
    for id in &ids {
        let job = c.wait_done(*id, Duration::from_secs(180));
        assert_eq!(job["state"], "COMPLETED", "{job}\n{}", c.log());
        let out = fs::read_to_string(c.home(&ann).join(format!("wharf-{id}.out"))).unwrap();
        assert_eq!(out, "one download\n", "job {id}");
    }
    // Each blob (the config and both layers) was asked for once, by whichever job pulled
    // first; the jobs placed while it pulled waited for it.
    let mut gets = reg.blob_gets();
    for (digest, n) in pushed {
        *gets.get_mut(&digest).unwrap() -= n;
    }
    gets.retain(|_, n| *n > 0);
    assert_eq!(gets.len(), 3, "the config and two layers: {gets:?}");
    assert!(gets.values().all(|n| *n == 1), "{gets:?}\n{}", c.log());
    // And more than one job did ask at once: each placed before the image was in the store
    // started a pull of its own.
    let pulls = c
        .log()
        .lines()
        .filter(|l| l.contains("pulling") && l.contains(&reference))
        .count();
    assert!(pulls >= 2, "{pulls} pulls started\n{}", c.log());
}
