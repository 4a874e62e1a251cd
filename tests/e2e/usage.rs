//! Measured usage on real jobs: CPU time and memory peak from the job's cgroup, and the
//! efficiency `wharf eff` computes from them.

use std::time::Duration;

use serde_json::Value;

use crate::harness::*;

fn eff(c: &Cluster, who: &User, id: u64) -> Value {
    let out = c.wharf_as(who, &["eff", &id.to_string(), "--json"]);
    assert!(out.status.success(), "eff: {}", stderr(&out));
    serde_json::from_str(&stdout(&out)).unwrap()
}

#[test]
fn a_sleeping_job_uses_no_cpu_and_a_spinning_one_half_of_its_two() {
    if !can_run("a_sleeping_job_uses_no_cpu_and_a_spinning_one_half_of_its_two") {
        return;
    }
    let c = Cluster::start_with("sample_interval = \"1s\"");
    let alice = user("wharf-alice");
    let submit = |opts: &[&str]| submitted_id(&c.wharf_as(&alice, &[&["submit"], opts].concat()));
    let sleeper = submit(&["--cpus", "1", "--wrap", "sleep 3"]);
    let spinner = submit(&[
        "--cpus",
        "2",
        "--wrap",
        "timeout 3 sh -c 'while :; do :; done'; times",
    ]);
    // Holds about 200 MB in a shell variable for a moment.
    let hog = submit(&[
        "--cpus",
        "1",
        "--mem",
        "1G",
        "--wrap",
        "x=$(head -c 200000000 /dev/zero | tr '\\0' a); sleep 2; echo ${#x}",
    ]);
    for id in [sleeper, spinner, hog] {
        let job = c.wait_done(id, Duration::from_secs(60));
        assert_eq!(job["state"], "COMPLETED", "{job}");
    }

    let e = eff(&c, &alice, sleeper);
    let cpu = e["cpu_efficiency"]
        .as_f64()
        .unwrap_or_else(|| panic!("{e}"));
    assert!(cpu < 0.05, "a sleeping job used {cpu} of its CPU: {e}");
    assert!(
        e["usage"]["samples"].as_u64().unwrap() >= 1,
        "never sampled: {e}"
    );

    // The spinner's own count of its CPU time (the shell's `times`: children's user and
    // system time) is what the cgroup must have counted, and its efficiency is that over
    // two CPUs for its run: about 50% on an idle machine, less when others compete.
    let out = std::fs::read_to_string(c.home(&alice).join(format!("wharf-{spinner}.out"))).unwrap();
    let own_ms = children_cpu_ms(&out).unwrap_or_else(|| panic!("no times in {out:?}"));
    let e = eff(&c, &alice, spinner);
    let cpu_ms = e["usage"]["cpu_time_ms"]
        .as_u64()
        .unwrap_or_else(|| panic!("{e}"));
    assert!(
        cpu_ms.abs_diff(own_ms) <= own_ms / 10 + 100,
        "the job counted {own_ms} ms of CPU, the node {cpu_ms} ms: {e}"
    );
    assert!(own_ms >= 500, "the spinner barely ran ({own_ms} ms): {e}");
    let cpu = e["cpu_efficiency"].as_f64().unwrap();
    let elapsed = e["elapsed_ms"].as_u64().unwrap() as f64;
    let expected = cpu_ms as f64 / (elapsed * 2.0);
    assert!(
        (cpu - expected).abs() < 0.01 && cpu <= 0.55,
        "efficiency {cpu}: {e}"
    );

    let e = eff(&c, &alice, hog);
    let peak = e["usage"]["memory_peak"]
        .as_u64()
        .unwrap_or_else(|| panic!("{e}"));
    assert!(
        (190_000_000..=1 << 30).contains(&peak),
        "a job holding 200 MB peaked at {peak}: {e}"
    );
    let text = stdout(&c.wharf_as(&alice, &["eff", &hog.to_string()]));
    assert!(text.contains("Memory: peak"), "{text}");
    assert!(
        text.contains("Hint: its memory peaked at") || peak > 256 << 20,
        "{text}"
    );
    let show = stdout(&c.wharf_as(&alice, &["show", &spinner.to_string()]));
    assert!(show.contains("Usage: CPU time"), "{show}");

    // A job that never ran has nothing measured, and says so.
    let held = submit(&["--hold", "--wrap", "true"]);
    let text = stdout(&c.wharf_as(&alice, &["eff", &held.to_string()]));
    assert!(text.contains("No usage was recorded"), "{text}");
}

/// The children's user + system time from the output of the shell's `times` (its second
/// line: `0m2.99s 0m0.01s`), ms.
fn children_cpu_ms(out: &str) -> Option<u64> {
    let line = out
        .lines()
        .filter(|l| l.contains("m") && l.ends_with('s'))
        .nth(1)?;
    line.split_whitespace()
        .map(|t| {
            let (m, s) = t.trim_end_matches('s').split_once('m')?;
            Some(m.parse::<u64>().ok()? * 60_000 + (s.parse::<f64>().ok()? * 1000.0) as u64)
        })
        .sum()
}
