//! The binary called `sinfo` on a live cluster of four agents and partitions from the config:
//! Slurm's default listing, `-N`, `-p`, `-t`, `-h`, `-s`, `-R` after a drain, and `--json`;
//! and `squeue -u` with a user no one has.

use std::process::{Command, Output};

use serde_json::Value;

use crate::harness::*;

/// Runs this binary under `name` (a link in the cluster's directory) against `c`.
fn slurm(c: &TcpCluster, name: &str, args: &[&str]) -> Output {
    Command::new(slurm_link(c.dir.path(), name))
        .args(args)
        .env("WHARF_SOCKET", &c.socket)
        .current_dir(c.dir.path())
        .output()
        .unwrap()
}

/// `sinfo ARGS`' lines, each as its words; the command must succeed.
fn sinfo(c: &TcpCluster, args: &[&str]) -> Vec<Vec<String>> {
    let out = slurm(c, "sinfo", args);
    assert!(out.status.success(), "sinfo {args:?}: {}", stderr(&out));
    let words = |l: &str| l.split_whitespace().map(String::from).collect();
    stdout(&out).lines().map(words).collect()
}

fn words(lines: &[&str]) -> Vec<Vec<String>> {
    let each = lines
        .iter()
        .map(|l| l.split_whitespace().map(String::from).collect());
    each.collect()
}

#[test]
fn sinfo_lists_partitions_nodes_by_state_as_slurm_does() {
    if !can_run("sinfo_lists_partitions_nodes_by_state_as_slurm_does") {
        return;
    }
    // gpu09 is named and never registers; cpu1 registers and is in no partition.
    let mut c = TcpCluster::controller(
        "wharf-sinfo-",
        "node_timeout = \"10s\"\n\
         [[scheduler.partition]]\nname = \"gpu\"\ndefault = true\nmax_time = \"2h\"\n\
         nodes = [\"gpu[01-02]\", \"gpu04\", \"gpu09\"]\n\
         [[scheduler.partition]]\nname = \"short\"\nmax_time = \"30m\"\nnodes = [\"gpu01\"]\n",
    );
    let token = c.token();
    for name in ["gpu01", "gpu02", "gpu04", "cpu1"] {
        c.agent_with(name, &token, "");
    }
    c.wait_nodes_up(4, 30);
    let listed: Value = serde_json::from_slice(&c.wharf(&["nodes", "--json"]).stdout).unwrap();
    let cpus = listed["nodes"][0]["info"]["cpus"].as_u64().unwrap();

    // A job of one CPU on gpu04: mixed, or allocated on a one-CPU host.
    let id = submitted_id(&c.wharf(&[
        "submit",
        "-w",
        "gpu04",
        "-c",
        "1",
        "--mem",
        "16M",
        "-t",
        "2m",
        "--wrap",
        "sleep 120",
    ]));
    c.wait_running(id);
    let busy = if cpus > 1 { "mix" } else { "alloc" };
    let out = c.wharf(&["nodes", "--drain", "gpu02", "--reason", "bad fan"]);
    assert!(out.status.success(), "{}", stderr(&out));

    let all = sinfo(&c, &[]);
    let want = [
        "PARTITION AVAIL TIMELIMIT NODES STATE NODELIST".to_string(),
        "gpu* up 2:00:00 1 idle gpu01".to_string(),
        format!("gpu* up 2:00:00 1 {busy} gpu04"),
        "gpu* up 2:00:00 1 drain gpu02".to_string(),
        "gpu* up 2:00:00 1 unk* gpu09".to_string(),
        "short up 30:00 1 idle gpu01".to_string(),
    ];
    let want: Vec<&str> = want.iter().map(String::as_str).collect();
    assert_eq!(all, words(&want));
    // The header's columns line up as Slurm's do.
    let text = stdout(&slurm(&c, "sinfo", &[]));
    assert!(
        text.starts_with("PARTITION AVAIL  TIMELIMIT  NODES  STATE NODELIST\n"),
        "{text}"
    );

    // -N: a line per node and partition; cpu1, in none, with n/a.
    let by_node = sinfo(&c, &["-N"]);
    let want = [
        "NODELIST NODES PARTITION STATE".to_string(),
        "cpu1 1 n/a idle".to_string(),
        "gpu01 1 gpu* idle".to_string(),
        "gpu01 1 short idle".to_string(),
        "gpu02 1 gpu* drain".to_string(),
        format!("gpu04 1 gpu* {busy}"),
        "gpu09 1 gpu* unk*".to_string(),
    ];
    let want: Vec<&str> = want.iter().map(String::as_str).collect();
    assert_eq!(by_node, words(&want));

    // -p, -h, -t, -s.
    assert_eq!(
        sinfo(&c, &["-h", "-p", "short"]),
        words(&["short up 30:00 1 idle gpu01"])
    );
    assert_eq!(
        sinfo(&c, &["--noheader", "-t", "DRAIN,unk"]),
        words(&[
            "gpu* up 2:00:00 1 drain gpu02",
            "gpu* up 2:00:00 1 unk* gpu09"
        ])
    );
    assert_eq!(
        sinfo(&c, &["-s", "-p", "gpu"]),
        words(&[
            "PARTITION AVAIL TIMELIMIT NODES(A/I/O/T) NODELIST",
            "gpu* up 2:00:00 1/1/2/4 gpu[01-02,04,09]"
        ])
    );
    assert_eq!(
        sinfo(
            &c,
            &["-h", "-o", "%R|%a|%D|%T|%N", "-p", "gpu", "-t", "drain"]
        ),
        words(&["gpu|up|1|drained|gpu02"])
    );

    // -R: why nodes take no work, and who said so.
    let reasons = stdout(&slurm(&c, "sinfo", &["-R"]));
    let lines: Vec<&str> = reasons.lines().collect();
    assert_eq!(lines.len(), 3, "{reasons}");
    assert!(lines[0].starts_with("REASON "), "{reasons}");
    assert!(
        lines[1].starts_with("Never registered") && lines[1].ends_with(" gpu09"),
        "{reasons}"
    );
    let fan: Vec<&str> = lines[2].split_whitespace().collect();
    assert_eq!(
        (fan[0], fan[1], fan[2]),
        ("bad", "fan", "root"),
        "{reasons}"
    );
    assert!(fan[3].ends_with('Z') && fan[4] == "gpu02", "{reasons}");

    // --json: the same lines, with exact values.
    let out = slurm(&c, "sinfo", &["--json", "-p", "gpu"]);
    let json: Value = serde_json::from_slice(&out.stdout).unwrap();
    let lines = json["lines"].as_array().unwrap();
    assert_eq!(lines.len(), 4, "{json}");
    assert_eq!(lines[0]["partition"], "gpu", "{json}");
    assert_eq!(lines[0]["default"], true, "{json}");
    assert_eq!(lines[0]["max_time_s"], 7200, "{json}");
    assert_eq!(lines[2]["states"], serde_json::json!(["drained"]), "{json}");
    assert_eq!(lines[2]["nodes"], serde_json::json!(["gpu02"]), "{json}");
    let out = slurm(&c, "sinfo", &["-R", "--json"]);
    let json: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["lines"][1]["reason"], "bad fan", "{json}");
    assert_eq!(json["lines"][1]["user"], "root", "{json}");

    // Words that name nothing are refused, saying what there is.
    let out = slurm(&c, "sinfo", &["-p", "nope"]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("no partition \"nope\"; this cluster has: gpu, short"),
        "{}",
        stderr(&out)
    );
    let out = slurm(&c, "sinfo", &["-t", "sleepy"]);
    assert!(
        stderr(&out).contains("unknown node state \"sleepy\""),
        "{}",
        stderr(&out)
    );
    // --help stays --help: -h is --noheader.
    let help = stdout(&slurm(&c, "sinfo", &["--help"]));
    assert!(help.contains("--noheader"), "{help}");
    assert!(c.wharf(&["cancel", &id.to_string()]).status.success());
}

#[test]
fn squeue_refuses_a_user_no_one_has_and_takes_uids() {
    if !can_run("squeue_refuses_a_user_no_one_has_and_takes_uids") {
        return;
    }
    let c = TcpCluster::controller("wharf-squeue-user-", "");
    let out = slurm(&c, "squeue", &["-u", "root,no-such-user-wharf"]);
    assert!(!out.status.success(), "{}", stdout(&out));
    assert!(
        stderr(&out).contains("invalid user: \"no-such-user-wharf\""),
        "{}",
        stderr(&out)
    );
    let out = c.wharf(&["cancel", "-u", "no-such-user-wharf"]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("invalid user"), "{}", stderr(&out));
    // A uid, known or not, and a known name, list (no jobs here: the header only).
    for who in ["0", "root", "4294967000"] {
        let out = slurm(&c, "squeue", &["-u", who]);
        assert!(out.status.success(), "-u {who}: {}", stderr(&out));
        assert!(stdout(&out).starts_with("JOBID"), "{}", stdout(&out));
    }
}
