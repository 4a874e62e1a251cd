//! Exact GPU isolation, shown on fake GPUs: character devices with NVIDIA's numbers made with
//! mknod. Opening an allocated one reaches the (absent) driver: ENXIO, "No such device or
//! address". Opening any other is refused by the device cgroup or the nodev root: EPERM/EACCES.

use std::time::Duration;

use nix::sys::stat::{makedev, mknod, Mode, SFlag};

use crate::harness::*;

/// A scratch directory holding `count` fake GPUs (`nvidia0..`), nvidiactl and nvidia-uvm.
fn fake_dev(count: u32) -> tempfile::TempDir {
    fake_dev_with(&(0..count).collect::<Vec<u32>>())
}

/// A scratch directory holding fake GPUs with these device minors, nvidiactl and nvidia-uvm.
pub(crate) fn fake_dev_with(minors: &[u32]) -> tempfile::TempDir {
    let dev = scratch("wharf-fakedev-");
    let mut nodes: Vec<(String, u64, u64)> = minors
        .iter()
        .map(|&i| (format!("nvidia{i}"), 195, u64::from(i)))
        .collect();
    nodes.push(("nvidiactl".into(), 195, 255));
    nodes.push(("nvidia-uvm".into(), 240, 0));
    for (name, major, minor) in nodes {
        mknod(
            &dev.path().join(name),
            SFlag::S_IFCHR,
            Mode::from_bits_truncate(0o666),
            makedev(major, minor),
        )
        .unwrap();
    }
    dev
}

/// A one-node cluster whose node has fake GPUs with these minors, as `wharf nodes` shows.
pub(crate) fn gpu_cluster(minors: &[u32]) -> (tempfile::TempDir, Cluster) {
    let dev = fake_dev_with(minors);
    let c = Cluster::start_with(&format!("dev_root = \"{}\"", dev.path().display()));
    let nodes = stdout(&c.wharf(&["nodes"]));
    let n = minors.len();
    assert!(
        nodes.contains(&format!("0/{n}")),
        "node does not report {n} GPUs:\n{nodes}"
    );
    (dev, c)
}

/// The first line of `text` that starts with `prefix`.
fn line_of(text: &str, prefix: &str) -> String {
    text.lines()
        .find(|l| l.starts_with(prefix))
        .unwrap_or_else(|| panic!("no {prefix:?} in:\n{text}"))
        .to_string()
}

/// A node whose GPUs are numbered 0, 1 and 3 (2 fell off the bus, or was never there):
/// the scheduler hands out exactly those ids, a job given all three sees and opens exactly
/// those, and a job asking for a fourth is refused.
#[test]
fn a_node_with_gpus_0_1_and_3_gives_out_those_and_never_2() {
    if !can_run("a_node_with_gpus_0_1_and_3_gives_out_those_and_never_2") {
        return;
    }
    let (_dev, c) = gpu_cluster(&[0, 1, 3]);
    let alice = user("wharf-alice");
    let script = "echo visible $(ls /dev | grep 'nvidia[0-9]' | tr '\\n' ' '); \
         echo cuda=$CUDA_VISIBLE_DEVICES slurm=$SLURM_JOB_GPUS on_node=$SLURM_GPUS_ON_NODE; \
         for i in 0 1 2 3; do head -c1 /dev/nvidia$i 2>&1 | sed \"s/^/open $i: /\"; done";
    let out = c.run_sh(&alice, &["--gpus", "3"], script);
    let text = stdout(&out);
    let line = |prefix: &str| line_of(&text, prefix);
    assert_eq!(line("visible"), "visible nvidia0 nvidia1 nvidia3", "{text}");
    assert_eq!(line("cuda="), "cuda=0,1,2 slurm=0,1,3 on_node=3");
    for i in [0, 1, 3] {
        assert!(
            line(&format!("open {i}:")).contains("No such device or address"),
            "allocated GPU {i}:\n{text}"
        );
    }
    assert!(line("open 2:").contains("No such file"), "{text}");
    let four = c.wharf_as(&alice, &["submit", "--gpus", "4", "--wrap", "true"]);
    assert!(!four.status.success(), "a 4-GPU job was accepted");
    assert!(stderr(&four).contains("GPU"), "{}", stderr(&four));
}

#[test]
fn job_given_two_of_eight_gpus_sees_and_opens_exactly_those() {
    if !can_run("job_given_two_of_eight_gpus_sees_and_opens_exactly_those") {
        return;
    }
    let (dev, c) = gpu_cluster(&(0..8).collect::<Vec<u32>>());
    let alice = user("wharf-alice");

    // Hold GPUs 0 and 1 with a first job, so the job under test gets 2 and 3.
    let holder =
        submitted_id(&c.wharf_as(&alice, &["submit", "--gpus", "2", "--wrap", "sleep 60"]));
    c.wait_running(holder);
    let fakedev = dev.path().display().to_string();
    let script = format!(
        "echo visible $(ls /dev | grep nvidia | tr '\\n' ' '); \
         echo cuda=$CUDA_VISIBLE_DEVICES nvidia=$NVIDIA_VISIBLE_DEVICES; \
         for i in 0 1 2 3 4 5 6 7; do head -c1 /dev/nvidia$i 2>&1 | sed \"s/^/open $i: /\"; done; \
         mknod /tmp/gpu5 c 195 5 2>&1 | sed 's/^/mknod: /'; \
         head -c1 {fakedev}/nvidia5 2>&1 | sed 's/^/host path: /'; \
         head -c1 /proc/self/root/dev/nvidia6 2>&1 | sed 's/^/proc path: /'"
    );
    let out = c.run_sh(&alice, &["--gpus", "2"], &script);
    let text = stdout(&out);
    let line = |prefix: &str| line_of(&text, prefix);
    assert_eq!(
        line("visible"),
        "visible nvidia-uvm nvidia2 nvidia3 nvidiactl",
        "{text}"
    );
    assert_eq!(line("cuda="), "cuda=0,1 nvidia=2,3");
    for i in [2, 3] {
        assert!(
            line(&format!("open {i}:")).contains("No such device or address"),
            "allocated GPU {i}:\n{text}"
        );
    }
    for i in [0, 1, 4, 5, 6, 7] {
        assert!(
            line(&format!("open {i}:")).contains("No such file"),
            "GPU {i} is visible:\n{text}"
        );
    }
    assert!(line("mknod:").contains("Operation not permitted"), "{text}");
    let host = line("host path:");
    assert!(
        host.contains("Permission denied") || host.contains("Operation not permitted"),
        "{host}"
    );
    assert!(line("proc path:").contains("No such file"), "{text}");

    assert!(c.wharf(&["cancel", &holder.to_string()]).status.success());
    c.wait_done(holder, Duration::from_secs(15));
}

/// A node whose allocated GPU has no device node is at fault, not the job: the node is drained
/// with the reason, and the job goes back to the queue, never started (on this one-node
/// cluster it then waits).
#[test]
fn gpu_job_on_a_node_missing_its_device_drains_the_node_and_is_requeued() {
    if !can_run("gpu_job_on_a_node_missing_its_device_drains_the_node_and_is_requeued") {
        return;
    }
    let dev = fake_dev(2);
    let c = Cluster::start_with(&format!("dev_root = \"{}\"", dev.path().display()));
    // The device disappears after the node registered (driver unloaded, say).
    std::fs::remove_file(dev.path().join("nvidia0")).unwrap();
    let alice = user("wharf-alice");
    let id = submitted_id(&c.wharf_as(&alice, &["submit", "--gpus", "1", "--wrap", "true"]));
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let (node, job) = loop {
        let nodes: serde_json::Value =
            serde_json::from_slice(&c.wharf(&["nodes", "--json"]).stdout).unwrap();
        let node = nodes["nodes"][0].clone();
        let job = c.job(id);
        if node["state"] == "DRAIN" && job["restarts"] == 1 {
            break (node, job);
        }
        assert!(std::time::Instant::now() < deadline, "{node}\n{job}");
        std::thread::sleep(Duration::from_millis(100));
    };
    let reason = node["reason"].as_str().unwrap();
    assert!(
        reason.contains("(device)") && reason.contains("GPU 0 was allocated but"),
        "{node}"
    );
    assert_eq!(job["state"], "PENDING", "{job}");
    assert!(job["start_time"].is_null(), "{job}");
    assert!(c.wharf(&["cancel", &id.to_string()]).status.success());
}

#[test]
fn gpu_jobs_get_the_driver_files_of_the_nodes_cdi_spec_read_only() {
    if !can_run("gpu_jobs_get_the_driver_files_of_the_nodes_cdi_spec_read_only") {
        return;
    }
    let dev = fake_dev(2);
    // A fake driver: a library and a tool, described by a CDI spec as nvidia-ctk writes it.
    let driver = dev.path().join("driver");
    std::fs::create_dir_all(&driver).unwrap();
    std::fs::write(driver.join("libcuda.so.1"), "fake libcuda\n").unwrap();
    std::fs::write(driver.join("nvidia-smi"), "fake nvidia-smi\n").unwrap();
    let cdi = dev.path().join("cdi");
    std::fs::create_dir_all(&cdi).unwrap();
    let d = dev.path().display();
    let spec = format!(
        r#"{{"cdiVersion": "0.5.0", "kind": "nvidia.com/gpu",
            "devices": [
              {{"name": "0", "containerEdits": {{"deviceNodes": [{{"path": "/dev/nvidia0", "hostPath": "{d}/nvidia0"}}]}}}},
              {{"name": "1", "containerEdits": {{"deviceNodes": [{{"path": "/dev/nvidia1", "hostPath": "{d}/nvidia1"}}]}}}}
            ],
            "containerEdits": {{
              "env": ["NVIDIA_DRIVER_CAPABILITIES=compute,utility", "NVIDIA_VISIBLE_DEVICES=void"],
              "deviceNodes": [{{"path": "/dev/nvidiactl", "hostPath": "{d}/nvidiactl"}}],
              "mounts": [
                {{"hostPath": "{d}/driver/libcuda.so.1", "containerPath": "/usr/lib/x86_64-linux-gnu/libcuda.so.1", "options": ["ro", "nosuid", "nodev", "bind"]}},
                {{"hostPath": "{d}/driver/nvidia-smi", "containerPath": "/usr/bin/nvidia-smi", "options": ["ro", "nosuid", "nodev", "bind"]}}
              ]
            }}}}"#
    );
    std::fs::write(cdi.join("nvidia.json"), spec).unwrap();
    let c = Cluster::start_with(&format!(
        "dev_root = \"{d}\"\ncdi_dirs = [\"{}\"]",
        cdi.display()
    ));
    c.import_tiny();
    let alice = user("wharf-alice");
    let script = "cat /usr/lib/x86_64-linux-gnu/libcuda.so.1 /usr/bin/nvidia-smi; \
        (echo x > /usr/bin/nvidia-smi) 2>/dev/null || echo ro; \
        echo caps=$NVIDIA_DRIVER_CAPABILITIES visible=$NVIDIA_VISIBLE_DEVICES; echo $(ls /dev | grep nvidia)";
    let out = c.run_sh(&alice, &["--image", "tiny", "--gpus", "1"], script);
    assert_eq!(
        stdout(&out),
        "fake libcuda\nfake nvidia-smi\nro\ncaps=compute,utility visible=0\nnvidia-uvm nvidia0 nvidiactl\n",
        "{}",
        stderr(&out)
    );
    // A job without GPUs gets none of it.
    let out = c.run_sh(
        &alice,
        &["--image", "tiny"],
        "cat /usr/bin/nvidia-smi 2>/dev/null || echo absent",
    );
    assert_eq!(stdout(&out), "absent\n");
}

#[test]
fn without_a_cdi_spec_gpu_jobs_get_the_driver_files_found_on_the_node() {
    if !can_run("without_a_cdi_spec_gpu_jobs_get_the_driver_files_found_on_the_node") {
        return;
    }
    let dev = fake_dev(1);
    let (lib, bin) = (dev.path().join("lib"), dev.path().join("bin"));
    std::fs::create_dir_all(&lib).unwrap();
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::write(lib.join("libcuda.so.550.1"), "cuda\n").unwrap();
    std::fs::write(lib.join("libnvidia-ml.so.1"), "nvml\n").unwrap();
    std::fs::write(lib.join("libunrelated.so.1"), "no\n").unwrap();
    std::fs::write(bin.join("nvidia-smi"), "smi\n").unwrap();
    let c = Cluster::start_with(&format!(
        "dev_root = \"{0}\"\ncdi_dirs = []\ndriver_lib_dirs = [\"{1}\"]\ndriver_bin_dirs = [\"{2}\"]",
        dev.path().display(),
        lib.display(),
        bin.display()
    ));
    c.import_tiny();
    let alice = user("wharf-alice");
    let script = format!("cat {0}/libcuda.so.550.1 {0}/libnvidia-ml.so.1 {1}/nvidia-smi; ls {0}/libunrelated.so.1 2>/dev/null || echo only-driver-files", lib.display(), bin.display());
    let out = c.run_sh(&alice, &["--image", "tiny", "--gpus", "1"], &script);
    assert_eq!(
        stdout(&out),
        "cuda\nnvml\nsmi\nonly-driver-files\n",
        "{}",
        stderr(&out)
    );
}

#[test]
fn agent_probe_prints_the_node_it_would_register() {
    if !can_run("agent_probe_prints_the_node_it_would_register") {
        return;
    }
    let dev = fake_dev(3);
    let config = dev.path().join("wharf.toml");
    std::fs::write(
        &config,
        format!(
            "[agent]\nnode_name = \"probe-node\"\ndev_root = \"{}\"\n",
            dev.path().display()
        ),
    )
    .unwrap();
    // No controller is running: the probe reads only this machine.
    let out = std::process::Command::new(wharf_bin())
        .args(["agent", "--probe", "--json", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let info: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(info["name"], "probe-node");
    let indices: Vec<u64> = info["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["index"].as_u64().unwrap())
        .collect();
    assert_eq!(indices, [0, 1, 2]);
    assert!(info["cpus"].as_u64().unwrap() >= 1);
    let human = std::process::Command::new(wharf_bin())
        .args(["agent", "--probe", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    let text = stdout(&human);
    assert!(
        text.contains("gpus    3") && text.contains("/dev/nvidia2"),
        "{text}"
    );
    // --json belongs to --probe.
    let bad = std::process::Command::new(wharf_bin())
        .args(["agent", "--json"])
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2), "{}", stderr(&bad));
}

/// The device cgroup holds for every process in the job's cgroup, not only for what the
/// job's private `/dev` shows: a root process moved into it (with no user namespace, no
/// nodev mount and the node's device paths in reach) still cannot open a GPU the job was not
/// given (EPERM), while the job's own reaches the (absent) driver (ENXIO). This runs the code
/// path of the host's cgroup version: v1 here is `devices.deny`/`devices.allow`, v2 the eBPF
/// filter (which the runtime's unit tests also check on the unified hierarchy).
#[test]
fn device_cgroup_refuses_unallocated_gpus_to_root_inside_the_jobs_cgroup() {
    if !can_run("device_cgroup_refuses_unallocated_gpus_to_root_inside_the_jobs_cgroup") {
        return;
    }
    use std::io::Write;
    let dev = fake_dev(4);
    let c = Cluster::start_with(&format!("dev_root = \"{}\"", dev.path().display()));
    let alice = user("whlife-alice");
    let id = submitted_id(&c.wharf_as(&alice, &["submit", "--gpus", "1", "--wrap", "sleep 60"]));
    c.wait_running(id);
    let gpu = c.job(id)["allocs"][0]["gpu_ids"][0]
        .as_u64()
        .expect("gpu_ids");
    let other = (gpu + 1) % 4;
    // The job's task's own cgroup, a leaf under the job's.
    let cgroups =
        wharf_runtime::cgroup_dirs(&format!("/{0}/wharf-{id}/wharf-{id}", c.cgroup_parent));
    assert!(!cgroups.is_empty(), "job {id} has no cgroup");
    let script = format!(
        "read go; head -c1 {0}/nvidia{other} 2>&1; head -c1 {0}/nvidia{gpu} 2>&1",
        dev.path().display()
    );
    let mut helper = std::process::Command::new("sh")
        .args(["-c", &script])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let moved: Vec<_> = cgroups
        .iter()
        .map(|d| std::fs::write(d.join("cgroup.procs"), helper.id().to_string()))
        .collect();
    let _ = helper.stdin.take().unwrap().write_all(b"go\n");
    let out = helper.wait_with_output().unwrap();
    assert!(c.wharf(&["cancel", &id.to_string()]).status.success());
    c.wait_done(id, Duration::from_secs(15));
    for (dir, m) in cgroups.iter().zip(&moved) {
        assert!(m.is_ok(), "moving the helper into {}: {m:?}", dir.display());
    }
    let text = stdout(&out);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "{text}");
    assert!(
        lines[0].ends_with("Operation not permitted"),
        "GPU {other}, not the job's: {text}"
    );
    assert!(
        lines[1].ends_with("No such device or address"),
        "GPU {gpu}, the job's: {text}"
    );
}
