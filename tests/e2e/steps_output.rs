//! A step's output comes back to its caller (`wharf step`, `srun`): the tasks' lines from
//! every host, whole and in order within each rank, labelled with the rank when asked, the
//! bytes as written; the step's status; a flood of output arrives complete while the
//! controller and agents hold only their bounded buffers; and the binary answers as `srun`.

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
    let d = bed.dir.path().display().to_string();
    let line = "x".repeat(99);
    // Rank 0 of the job calls every step; the caller's files are in the bed's directory.
    let script = format!(
        "cd {d}; if [ \"$RANK\" = 0 ]; then \
           {w} step -l --ntasks-per-node 2 -- sh -c 'i=0; while [ $i -lt 200 ]; do \
             echo \"out $SLURM_PROCID $i\"; echo \"err $SLURM_PROCID $i\" >&2; i=$((i+1)); done' \
             > labelled.out 2> labelled.err; echo \"STEP0 $?\"; \
           {w} step -q -N 2 -- sh -c 'if [ $SLURM_PROCID = 1 ]; then echo \"rank 1 says bye\"; \
             exit 7; fi; printf \"rank 0 \\033[1mfine\\r\\n\"' > failing.out; echo \"STEP1 $?\"; \
           {{ {w} step -q -N 2 -- sh -c 'yes {line} | head -n {FLOOD_LINES}'; echo $? > flood.status; }} \
             | {{ sleep 8; wc -c > flood.count; }}; \
           ln -s {w} /tmp/srun && /tmp/srun -Q -l -N 2 hostname > srun.out; echo \"SRUN $?\"; \
         fi"
    );
    let before = bed.peak_memory_kib();
    let id = bed.submit(&["--nodes", "2", "--cpus", "2", "-t", "5m", "--wrap", &script]);
    let job = bed.wait_done(id, Duration::from_secs(300));
    let out = bed.output(id);
    let after = bed.peak_memory_kib();
    let read = |name: &str| {
        std::fs::read(bed.dir.path().join(name))
            .unwrap_or_else(|e| panic!("{name}: {e}\n{out}\n{}", bed.logs()))
    };
    assert_eq!(job["state"], "COMPLETED", "{job}\n{out}\n{}", bed.logs());
    assert!(out.contains("STEP0 0\n"), "{out}");
    // Status: the failing rank's, and its last words arrived before the end.
    assert!(out.contains("STEP1 7\n"), "{out}");
    let failing = read("failing.out");
    let failing = String::from_utf8_lossy(&failing);
    assert!(failing.contains("rank 1 says bye\n"), "{failing:?}");
    // Control characters pass as they were written (the tasks' own bytes).
    assert!(failing.contains("rank 0 \x1b[1mfine\r\n"), "{failing:?}");

    // Four ranks, two per host: every line whole, labelled, and each rank's in order.
    for (file, tag) in [("labelled.out", "out"), ("labelled.err", "err")] {
        let text = String::from_utf8(read(file)).unwrap();
        let mut next = [0u32; 4];
        for l in text.lines() {
            let (label, rest) = l
                .split_once(": ")
                .unwrap_or_else(|| panic!("unlabelled line {l:?} in {file}:\n{text}"));
            let rank: usize = label.parse().unwrap();
            let want = format!("{tag} {rank} {}", next[rank]);
            assert_eq!(rest, want, "{file}:\n{text}");
            next[rank] += 1;
        }
        assert_eq!(next, [200; 4], "{file}:\n{text}");
    }

    // The flood: every byte of both ranks, though the caller did not read for a while.
    let count = String::from_utf8(read("flood.count")).unwrap();
    assert_eq!(
        count.trim().parse::<u64>().unwrap(),
        2 * FLOOD_LINES * 100,
        "{out}"
    );
    assert_eq!(String::from_utf8(read("flood.status")).unwrap().trim(), "0");
    eprintln!("peak memory (KiB) before: {before:?}, after: {after:?}");
    for ((name, was), (_, now)) in before.iter().zip(&after) {
        // 60 MB went through: the controller holds at most a step's buffer of it, an agent
        // a push or a read at a time.
        assert!(
            now.saturating_sub(*was) < 48 << 10,
            "{name} grew from {was} KiB to {now} KiB"
        );
    }

    // The binary called as `srun`: a step on both hosts, labelled.
    assert!(out.contains("SRUN 0\n"), "{out}");
    let srun = String::from_utf8(read("srun.out")).unwrap();
    let mut lines: Vec<&str> = srun.lines().collect();
    lines.sort();
    assert_eq!(lines, ["0: node1", "1: node2"], "{srun}");
}
