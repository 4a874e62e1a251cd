//! The `wharf-sim` binary: one table with every policy, JSON for machines, and errors that
//! name the line and change nothing.

use std::process::Command;

fn sim(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_wharf-sim"))
        .args(args)
        .env("RUST_BACKTRACE", "0")
        .output()
        .unwrap()
}

#[test]
fn json_has_every_policy_side_by_side() {
    let out = sim(&["gpu", "--jobs", "200", "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let cols = v["columns"].as_array().unwrap();
    let names: Vec<&str> = cols.iter().map(|c| c["policy"].as_str().unwrap()).collect();
    assert_eq!(names, ["fcfs", "easy", "wharf"]);
    for c in cols {
        let m = &c["metrics"];
        assert_eq!(m["jobs"], 200);
        for key in [
            "utilization",
            "mean_wait_s",
            "mean_bounded_slowdown",
            "max_wait_s",
            "jain_fairness",
        ] {
            assert!(m[key].is_number(), "{key}");
        }
    }
}

#[test]
fn table_names_the_metrics_and_the_ratio() {
    let trace = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/lublin_256_head.swf"
    );
    let out = sim(&["swf", trace, "--jobs", "100"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    for word in [
        "fcfs",
        "easy",
        "wharf",
        "wharf/easy",
        "utilization",
        "mean bounded slowdown",
        "max wait",
        "Jain fairness",
    ] {
        assert!(text.contains(word), "{word} missing in:\n{text}");
    }
}

#[test]
fn a_bad_trace_is_refused_naming_the_line() {
    let dir = std::env::temp_dir().join(format!("wharf-sim-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("bad.swf");
    std::fs::write(
        &path,
        "; MaxProcs: 8\n1 0 -1 10 2 -1 -1 2 -1 -1 1 -1 -1 -1 0 -1 -1 -1\n2 0 -1 10 2\n",
    )
    .unwrap();
    let out = sim(&["swf", path.to_str().unwrap()]);
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(!out.status.success());
    assert!(out.stdout.is_empty());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("line 3: expected 18"), "{err}");
}

#[test]
fn outcomes_are_written_per_policy_one_line_per_job() {
    let dir = std::env::temp_dir().join(format!("wharf-sim-outcomes-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let sub = dir.join("new");
    let out = sim(&[
        "gpu",
        "--jobs",
        "150",
        "--policy",
        "easy,wharf",
        "--outcomes",
        sub.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for policy in ["easy", "wharf"] {
        let text = std::fs::read_to_string(sub.join(format!("{policy}.csv"))).unwrap();
        let mut lines = text.lines();
        assert_eq!(
            lines.next(),
            Some("id,account,user,submit_ms,start_ms,end_ms,units,limit_ms")
        );
        let rows: Vec<Vec<&str>> = lines.map(|l| l.split(',').collect()).collect();
        assert_eq!(rows.len(), 150, "{policy}");
        for r in &rows {
            let n: Vec<u64> = [3, 4, 5, 7]
                .iter()
                .map(|&i| r[i].parse().unwrap())
                .collect();
            let (submit, start, end, limit) = (n[0], n[1], n[2], n[3]);
            assert!(
                submit <= start && start <= end && end - start <= limit,
                "{r:?}"
            );
            assert!(r[1].starts_with("acct"), "{r:?}");
        }
    }
    assert!(!sub.join("fcfs.csv").exists());
    // A folder that cannot be made is named, and nothing is replayed.
    let file = dir.join("file");
    std::fs::write(&file, "").unwrap();
    let out = sim(&[
        "gpu",
        "--jobs",
        "10",
        "--outcomes",
        file.join("x").to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--outcomes"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
