//! A step's output comes back to its caller (`wharf step`, `srun`): the tasks' lines from
//! every host, whole and in order within each rank, labelled with the rank when asked, the
//! bytes as written; the step's status; a flood of output arrives complete while the
//! controller and agents hold only their bounded buffers, survives the controller's restart,
//! and passes a controller whose request limit is under one push; and the binary answers as
//! `srun`.

use std::time::Duration;

use crate::harness::*;
use crate::netns::MultiHost;

/// Bytes each rank of the flood writes: lines of 100 bytes.
const FLOOD_LINES: u64 = 300_000;

#[test]
fn step_output_from_every_host_reaches_the_caller_labelled_in_order_and_bounded() {
    let test = "step_output_from_every_host_reaches_the_caller_labelled_in_order_and_bounded";
    let Some(bed) = MultiHost::start(test, 2, "") else {
        return;
    };
    let w = wharf_bin();
    let line = "x".repeat(99);
    // Rank 0 of the job calls every step; what comes back is the job's own output.
    let script = format!(
        "if [ \"$RANK\" = 0 ]; then \
           {w} step -l --ntasks-per-node 2 -- sh -c 'i=0; while [ $i -lt 200 ]; do \
             echo \"out $SLURM_PROCID $i\"; echo \"err $SLURM_PROCID $i\" >&2; i=$((i+1)); done'; \
             echo \"STEP0 $?\"; \
           {w} step -q -N 2 -- sh -c 'if [ $SLURM_PROCID = 1 ]; then echo \"rank 1 says bye\"; \
             sleep 2; exit 7; fi; printf \"rank 0 \\033[1mfine\\r\\n\"'; echo \"STEP1 $?\"; \
           t0=$(date +%s); \
           {{ {w} step -q -N 2 -- sh -c 'yes {line} | head -n {FLOOD_LINES}'; echo \"FLOOD_STATUS $?\" >&2; }} \
             | {{ sleep 8; echo FLOOD_BYTES $(wc -lc); }}; \
           echo \"FLOOD_SECS $(( $(date +%s) - t0 ))\"; \
           ln -s {w} /tmp/srun && /tmp/srun -Q -l -N 2 hostname | sed 's/^/SRUN /'; echo \"SRUN $?\"; \
         fi"
    );
    let before = bed.peak_memory_kib();
    let id = bed.submit(&["--nodes", "2", "--cpus", "2", "-t", "5m", "--wrap", &script]);
    let job = bed.wait_done(id, Duration::from_secs(300));
    let out = bed.output(id);
    let after = bed.peak_memory_kib();
    let tail = &out[out.len().saturating_sub(3000)..];
    assert_eq!(job["state"], "COMPLETED", "{job}\n{tail}\n{}", bed.logs());
    assert!(out.contains("STEP0 0\n"), "{tail}");
    // Status: the failing rank's, and its last words arrived before the end. (Rank 1 fails
    // after rank 0 has written its line: a failure stops the step's other tasks, and on a
    // loaded machine rank 0 may not have started yet when one that fails at once ends.)
    assert!(out.contains("STEP1 7\n"), "{tail}");
    assert!(out.contains("rank 1 says bye\n"), "{tail}");
    // Control characters pass as they were written (the tasks' own bytes).
    assert!(out.contains("rank 0 \x1b[1mfine\r\n"), "{tail}");

    // Four ranks, two per host: every line whole, labelled, and each rank's in order.
    let mut next = [[0u32; 4]; 2];
    for l in out
        .lines()
        .filter(|l| l.contains("out ") || l.contains("err "))
    {
        let whole = l.split_once(": ").and_then(|(label, rest)| {
            let rank: usize = label.parse().ok()?;
            let tag = usize::from(rest.starts_with("err "));
            Some((rank, tag, rest))
        });
        let Some((rank, tag, rest)) = whole.filter(|(r, _, _)| *r < 4) else {
            panic!("not a whole labelled line: {l:?}");
        };
        let want = format!("{} {rank} {}", ["out", "err"][tag], next[tag][rank]);
        assert_eq!(rest, want, "{l:?}");
        next[tag][rank] += 1;
    }
    assert_eq!(next, [[200; 4]; 2], "{tail}");

    // The flood: every byte of both ranks, though the caller did not read for a while.
    assert!(out.contains("FLOOD_STATUS 0\n"), "{tail}");
    let lines = 2 * FLOOD_LINES;
    assert!(
        out.contains(&format!("FLOOD_BYTES {lines} {}\n", lines * 100)),
        "{tail}"
    );
    eprintln!(
        "{}; peak memory (KiB) before: {before:?}, after: {after:?}",
        out.lines()
            .find(|l| l.starts_with("FLOOD_SECS"))
            .unwrap_or("")
    );
    for ((name, was), (_, now)) in before.iter().zip(&after) {
        // 60 MB went through: the controller holds at most a step's buffer of it, an agent
        // a push or a read at a time.
        assert!(
            now.saturating_sub(*was) < 48 << 10,
            "{name} grew from {was} KiB to {now} KiB"
        );
    }

    // The binary called as `srun`: a step on both hosts, labelled.
    assert!(out.contains("SRUN 0\n"), "{tail}");
    let mut srun: Vec<&str> = out
        .lines()
        .filter(|l| l.starts_with("SRUN ") && l.contains(": "))
        .collect();
    srun.sort();
    assert_eq!(srun, ["SRUN 0: node1", "SRUN 1: node2"], "{tail}");
}

/// Bytes the backlog test's task tries to write: well past the agent's backlog bound
/// (`BACKLOG_BYTES`, 256 MiB), in lines of 100 bytes.
const BACKLOG_TRY: u64 = 400_000_000;

#[test]
fn a_step_whose_caller_does_not_read_is_stopped_before_it_fills_the_nodes_disk() {
    let test = "a_step_whose_caller_does_not_read_is_stopped_before_it_fills_the_nodes_disk";
    let Some(bed) = MultiHost::start(test, 2, "") else {
        return;
    };
    let w = wharf_bin();
    let line = "x".repeat(99);
    // The caller reads nothing for 30 s while its task writes as fast as it can: what the
    // caller has not read waits in a root-owned file on the node's state disk, and past the
    // bound the task is stopped (without the bound it writes all of it, and the step ends 0).
    let script = format!(
        "if [ \"$RANK\" = 0 ]; then \
           {{ {w} step -q -N 1 -- sh -c 'yes {line} | head -c {BACKLOG_TRY}'; echo \"BACKLOG_STATUS $?\" >&2; }} \
             | {{ sleep 30; echo BACKLOG_BYTES $(wc -c); }}; \
         fi"
    );
    let id = bed.submit(&["--nodes", "2", "--cpus", "2", "-t", "5m", "--wrap", &script]);
    let job = bed.wait_done(id, Duration::from_secs(300));
    let out = bed.output(id);
    let tail = &out[out.len().saturating_sub(3000)..];
    assert_eq!(job["state"], "COMPLETED", "{job}\n{tail}\n{}", bed.logs());
    let status = out
        .lines()
        .find_map(|l| l.strip_prefix("BACKLOG_STATUS "))
        .unwrap_or_else(|| panic!("no status: {tail}"));
    assert_ne!(status, "0", "the task wrote on past the bound: {tail}");
    let bytes: u64 = out
        .lines()
        .find_map(|l| l.strip_prefix("BACKLOG_BYTES "))
        .and_then(|b| b.trim().parse().ok())
        .unwrap_or_else(|| panic!("no byte count: {tail}"));
    assert!(
        bytes < BACKLOG_TRY,
        "{bytes} bytes reached the caller: {tail}"
    );
}

/// Lines of 100 bytes each rank of the restart test writes: together well within the
/// controller's step buffer (8 MiB), well past what the pipes and sockets before the caller
/// hold.
const RESTART_LINES: u64 = 20_000;

#[test]
fn output_the_controller_held_for_a_caller_not_reading_survives_the_controllers_restart() {
    let test =
        "output_the_controller_held_for_a_caller_not_reading_survives_the_controllers_restart";
    let Some(mut bed) = MultiHost::start(test, 2, "") else {
        return;
    };
    let w = wharf_bin();
    let line = "x".repeat(99);
    // The caller does not read for a while: its tasks end and their output waits in the
    // controller's buffer (and in their files), the caller's pipe being full; meanwhile the
    // controller restarts and loses that buffer. Every byte must still reach the caller.
    let script = format!(
        "if [ \"$RANK\" = 0 ]; then \
           echo STEP_STARTS; \
           {{ {w} step -q -N 2 -- sh -c 'yes {line} | head -n {RESTART_LINES}'; echo \"RESTART_STATUS $?\" >&2; }} \
             | {{ sleep 30; echo RESTART_BYTES $(wc -lc); }}; \
         fi"
    );
    let id = bed.submit(&["--nodes", "2", "--cpus", "2", "-t", "5m", "--wrap", &script]);
    bed.wait_output(id, "STEP_STARTS");
    // Until the step's end is recorded (what was all its output's being taken), or long
    // enough for its tasks to have written everything and the controller to hold it.
    let ended = |j: &serde_json::Value| {
        j["steps"]
            .as_array()
            .and_then(|s| s.first())
            .is_some_and(|s| !s["exit"].is_null())
    };
    let waited = std::time::Instant::now();
    while !ended(&bed.job(id)) && waited.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(200));
    }
    bed.restart_controller();
    let job = bed.wait_done(id, Duration::from_secs(300));
    let out = bed.output(id);
    let tail = &out[out.len().saturating_sub(3000)..];
    assert_eq!(job["state"], "COMPLETED", "{job}\n{tail}\n{}", bed.logs());
    assert!(out.contains("RESTART_STATUS 0\n"), "{tail}\n{}", bed.logs());
    let lines = 2 * RESTART_LINES;
    assert!(
        out.contains(&format!("RESTART_BYTES {lines} {}\n", lines * 100)),
        "{tail}\n{}",
        bed.logs()
    );
}

/// Lines of 100 bytes the request limit test's task writes: far more than one push.
const LIMIT_LINES: u64 = 20_000;

#[test]
fn a_controller_whose_request_limit_is_under_one_push_still_gets_a_steps_output() {
    let test = "a_controller_whose_request_limit_is_under_one_push_still_gets_a_steps_output";
    // 64 KiB: room for the agents' registrations and polls, not for a push of 512 KiB.
    let limits = "[limits]\nmax_agent_request_size = \"64K\"";
    let Some(bed) = MultiHost::start(test, 1, limits) else {
        return;
    };
    let w = wharf_bin();
    let line = "x".repeat(99);
    let script = format!(
        "{{ {w} step -q -N 1 -- sh -c 'yes {line} | head -n {LIMIT_LINES}'; echo \"LIMIT_STATUS $?\" >&2; }} \
           | {{ echo LIMIT_BYTES $(wc -lc); }}"
    );
    let id = bed.submit(&["--nodes", "1", "--cpus", "1", "-t", "2m", "--wrap", &script]);
    let job = bed.wait_done(id, Duration::from_secs(180));
    let out = bed.output(id);
    let tail = &out[out.len().saturating_sub(3000)..];
    assert_eq!(job["state"], "COMPLETED", "{job}\n{tail}\n{}", bed.logs());
    let bytes: Vec<u64> = out
        .lines()
        .find_map(|l| l.strip_prefix("LIMIT_BYTES "))
        .unwrap_or_else(|| panic!("no byte count: {tail}\n{}", bed.logs()))
        .split_whitespace()
        .filter_map(|n| n.parse().ok())
        .collect();
    assert_eq!(bytes, [LIMIT_LINES, LIMIT_LINES * 100], "{tail}");
    assert!(out.contains("LIMIT_STATUS 0\n"), "{tail}");
}

#[test]
fn a_controller_that_refuses_even_the_smallest_push_fails_the_step_with_the_reason() {
    let test = "a_controller_that_refuses_even_the_smallest_push_fails_the_step_with_the_reason";
    // Room for the agents' registrations, polls and the step's start; not for 4 KiB of
    // output as base64.
    let limits = "[limits]\nmax_agent_request_size = \"5K\"";
    let Some(bed) = MultiHost::start(test, 1, limits) else {
        return;
    };
    let w = wharf_bin();
    let line = "x".repeat(99);
    let script = format!(
        "{w} step -N 1 -- sh -c 'yes {line} | head -n 1000; sleep 600'; echo \"TINY_STATUS $?\""
    );
    let id = bed.submit(&["--nodes", "1", "--cpus", "1", "-t", "2m", "--wrap", &script]);
    let job = bed.wait_done(id, Duration::from_secs(180));
    let out = bed.output(id);
    let tail = &out[out.len().saturating_sub(3000)..];
    // Not held until the job's time limit: the step ends at once, saying why.
    assert_eq!(job["state"], "COMPLETED", "{job}\n{tail}\n{}", bed.logs());
    assert!(
        out.contains("refuses its output from node node1 even 4096 bytes at a time"),
        "{tail}\n{}",
        bed.logs()
    );
    assert!(!out.contains("TINY_STATUS 0\n"), "{tail}");
}
