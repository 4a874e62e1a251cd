//! The rendezvous environment: every job learns its nodes, its rank and a port of its own, and
//! starts with the node's defaults for the fabric (its own `--env` winning).

use std::collections::BTreeMap;
use std::time::Duration;

use crate::harness::*;

/// `KEY=VALUE` lines of a job's output.
fn vars(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn jobs_sharing_a_node_get_their_own_port_and_the_fabric_address() {
    if !can_run("jobs_sharing_a_node_get_their_own_port_and_the_fabric_address") {
        return;
    }
    let c = Cluster::start_with(
        "fabric_interface = \"lo\"\nenv = { NCCL_SOCKET_IFNAME = \"lo\", FI_PROVIDER = \"tcp\" }",
    );
    let alice = user("wharf-alice");
    let script = "for v in MASTER_ADDR MASTER_PORT WORLD_SIZE RANK LOCAL_RANK SLURM_JOB_NODELIST \
                  SLURM_NNODES SLURM_PROCID NCCL_SOCKET_IFNAME FI_PROVIDER; do \
                  eval echo $v=\\$$v; done; sleep 3";
    let submit = |extra: &[&str]| {
        let args = [&["submit", "--cpus", "1"][..], extra, &["--wrap", script]].concat();
        submitted_id(&c.wharf_as(&alice, &args))
    };
    let a = submit(&[]);
    let b = submit(&["--env", "FI_PROVIDER=efa"]);
    for id in [a, b] {
        let job = c.wait_done(id, Duration::from_secs(30));
        assert_eq!(job["state"], "COMPLETED", "{job}");
    }
    let out = |id: u64| {
        let path = c.home(&alice).join(format!("wharf-{id}.out"));
        vars(&std::fs::read_to_string(path).unwrap())
    };
    let (va, vb) = (out(a), out(b));
    let node = stdout(&c.wharf(&["nodes", "--json"]));
    let node: serde_json::Value = serde_json::from_str(&node).unwrap();
    let name = node["nodes"][0]["info"]["name"]
        .as_str()
        .unwrap()
        .to_string();
    for v in [&va, &vb] {
        assert_eq!(v["MASTER_ADDR"], "127.0.0.1", "{v:?}");
        assert_eq!(v["WORLD_SIZE"], "1");
        assert_eq!(v["RANK"], "0");
        assert_eq!(v["LOCAL_RANK"], "0");
        assert_eq!(v["SLURM_JOB_NODELIST"], name);
        assert_eq!(v["SLURM_NNODES"], "1");
        assert_eq!(v["NCCL_SOCKET_IFNAME"], "lo");
    }
    assert_eq!(va["FI_PROVIDER"], "tcp", "the node's default");
    assert_eq!(vb["FI_PROVIDER"], "efa", "the job's own --env wins");
    // They ran side by side (two CPUs, one each) and never share a port.
    assert!(va["MASTER_PORT"].parse::<u16>().unwrap() >= 29500);
    assert_ne!(va["MASTER_PORT"], vb["MASTER_PORT"], "{va:?} {vb:?}");
}

#[test]
fn a_bad_node_env_or_port_range_stops_the_daemon_naming_the_key() {
    if !can_run("a_bad_node_env_or_port_range_stops_the_daemon_naming_the_key") {
        return;
    }
    for (section, line, says) in [
        (
            "agent",
            "env = { \"1BAD\" = \"x\" }",
            "agent.env: name \"1BAD\"",
        ),
        (
            "scheduler",
            "rendezvous_ports = \"80-90\"",
            "scheduler.rendezvous_ports",
        ),
    ] {
        let dir = scratch("wharf-rdzv-");
        let cfg = dir.path().join("wharf.toml");
        std::fs::write(&cfg, format!("[{section}]\n{line}\n")).unwrap();
        let out = std::process::Command::new(wharf_bin())
            .args(["dev", "--config", cfg.to_str().unwrap(), "--data-dir"])
            .arg(dir.path().join("data"))
            .output()
            .unwrap();
        assert!(!out.status.success(), "{line} was accepted");
        assert!(stderr(&out).contains(says), "{line}: {}", stderr(&out));
    }
}
