//! A step's standard input (`wharf step -i`, srun's `--input`): the caller's input reaches
//! task 0 by default, every task with `all`, one task by rank, none with `none`, its end
//! included; a task that does not read holds its caller back by a bounded amount. And
//! `-c` gives each task of a step its own CPUs.

use std::time::{Duration, Instant};

use crate::harness::*;
use crate::netns::MultiHost;

/// The words after `tag` on the first line of `text` that starts with it.
fn after<'a>(text: &'a str, tag: &str) -> &'a str {
    text.lines()
        .find_map(|l| l.strip_prefix(tag))
        .unwrap_or_else(|| panic!("no {tag:?} line in:\n{text}"))
        .trim()
}

/// Blocks of 64 KiB the bound test's writer gets into `wharf step` while its task sleeps.
const BLOCK: u64 = 64 << 10;

#[test]
fn a_steps_input_reaches_the_tasks_asked_for_and_a_task_that_does_not_read_holds_it_back() {
    let test =
        "a_steps_input_reaches_the_tasks_asked_for_and_a_task_that_does_not_read_holds_it_back";
    if !can_run(test) {
        return;
    }
    let c = Cluster::start();
    if !c.has_cpus(test, 2) {
        return;
    }
    let alice = user("wharf-alice");
    let home = c.home(&alice);
    let w = wharf_bin();
    let count = "sh -c 'echo \"$SLURM_PROCID $(wc -l)\"'";
    let script = format!(
        "printf 'a\\nb\\n' | {w} step -q -n 2 -- {count} | sed 's/^/DEFAULT /'; \
         printf 'a\\nb\\n' | {w} step -q -n 2 --input all -- {count} | sed 's/^/ALL /'; \
         printf 'a\\nb\\n' | {w} step -q -n 2 --input none -- {count} | sed 's/^/NONE /'; \
         printf 'x\\n' | {w} step -q -n 2 -i 1 -- sh -c 'echo \"$SLURM_PROCID [$(cat)]\"' | sed 's/^/ONE /'; \
         printf 'abc' | {w} step -q -n 1 -- sh -c 'head -c 1; echo' | sed 's/^/HEAD /'; \
         {{ i=0; while head -c {BLOCK} /dev/zero; do i=$((i+1)); echo $i > /tmp/fed; done; }} \
           | {w} step -q -n 1 -- sh -c 'sleep 6; echo SLEPT'; echo \"BOUND $?\"; \
         echo \"FED $(cat /tmp/fed)\"; \
         {w} step -q -n 1 -c 1 -- sh -c 'echo \"CPT $SLURM_CPUS_PER_TASK $(nproc)\"'; \
         {w} step -q -n 1 -- sh -c 'echo \"WHOLE $SLURM_CPUS_PER_TASK $(nproc)\"'"
    );
    let id = submitted_id(&c.wharf_as(
        &alice,
        &[
            "submit",
            "--cpus-per-task",
            "2",
            "--mem",
            "256M",
            "-t",
            "3m",
            "--wrap",
            &script,
        ],
    ));
    let job = c.wait_done(id, Duration::from_secs(150));
    let out = home.join(format!("wharf-{id}.out"));
    let text = std::fs::read_to_string(&out).unwrap();
    assert_eq!(job["state"], "COMPLETED", "{job}\n{text}\n{}", c.log());
    let lines = |tag: &str| {
        let mut got: Vec<&str> = text.lines().filter_map(|l| l.strip_prefix(tag)).collect();
        got.sort();
        got
    };
    // srun's default: rank 0 reads the input to its end; rank 1 reads /dev/null.
    assert_eq!(lines("DEFAULT "), ["0 2", "1 0"], "{text}");
    assert_eq!(lines("ALL "), ["0 2", "1 2"], "{text}");
    assert_eq!(lines("NONE "), ["0 0", "1 0"], "{text}");
    assert_eq!(lines("ONE "), ["0 []", "1 [x]"], "{text}");
    // A task that stops reading (`head -c 1`) neither hangs nor fails the step.
    assert_eq!(lines("HEAD "), ["a"], "{text}");
    // The writer was held back while the task slept: what it got in is what the pipes,
    // sockets and the controller's buffer (1 MiB) hold, not 6 s of /dev/zero.
    assert_eq!(after(&text, "BOUND"), "0", "{text}");
    assert!(text.contains("SLEPT\n"), "{text}");
    let fed: u64 = after(&text, "FED").parse().unwrap();
    assert!(fed > 0, "{text}");
    assert!(
        fed * BLOCK < 12 << 20,
        "{} MiB went in while nothing read it",
        (fed * BLOCK) >> 20
    );
    // -c 1: the task has one of the job's two CPUs, and says so; without it, both.
    assert_eq!(after(&text, "CPT"), "1 1", "{text}");
    assert_eq!(after(&text, "WHOLE"), "2 2", "{text}");
}

#[test]
fn a_steps_input_reaches_its_tasks_on_another_host_with_its_end() {
    let test = "a_steps_input_reaches_its_tasks_on_another_host_with_its_end";
    let Some(bed) = MultiHost::start(test, 2, "") else {
        return;
    };
    let w = wharf_bin();
    // Rank 0 of the job (on node1) calls the steps; rank 1 of each step is on node2.
    let script = format!(
        "if [ \"$RANK\" = 0 ]; then \
           printf 'a\\nb\\n' | {w} step -q -N 2 -i all -- sh -c 'echo \"ALL $SLURM_PROCID $(hostname) $(wc -l)\"'; \
           printf 'a\\nb\\nc\\n' | {w} step -q -N 2 -i 1 -- sh -c 'echo \"ONE $SLURM_PROCID $(wc -l)\"'; \
         fi"
    );
    let id = bed.submit(&["--nodes", "2", "--cpus", "1", "-t", "3m", "--wrap", &script]);
    let job = bed.wait_done(id, Duration::from_secs(150));
    let out = bed.output(id);
    assert_eq!(job["state"], "COMPLETED", "{job}\n{out}\n{}", bed.logs());
    let mut got: Vec<&str> = out
        .lines()
        .filter(|l| l.starts_with("ALL ") || l.starts_with("ONE "))
        .collect();
    got.sort();
    assert_eq!(
        got,
        ["ALL 0 node1 2", "ALL 1 node2 2", "ONE 0 0", "ONE 1 3"],
        "{out}"
    );
}

/// Lines of `seq` the restart test sends (1,638,895 bytes): more than its task's pipe (1 MiB)
/// and one pull hold, so that the rest waits in the controller's buffer when the controller
/// restarts.
const RESTART_SEQ: u64 = 250_000;

/// Runs a 2-node job whose rank 0 pipes `seq 1 SEQ` into `wharf step -q -N 2 -i INPUT --
/// sh -c TASKS`, calls `restart` once `before_restart` returns (given the bed and the job),
/// and checks that the job and its step ended well; the job's output and the digest of what
/// was sent.
fn input_through_a_restart(
    test: &str,
    seq: u64,
    input: &str,
    tasks: &str,
    before_restart: impl FnOnce(&MultiHost, u64),
    restart: impl FnOnce(&mut MultiHost),
) -> Option<(String, String)> {
    let mut bed = MultiHost::start(test, 2, "")?;
    let w = wharf_bin();
    let script = format!(
        "if [ \"$RANK\" = 0 ]; then \
           echo STEP_STARTS; \
           echo \"WANT $(seq 1 {seq} | md5sum | cut -c1-32)\"; \
           seq 1 {seq} | {w} step -q -N 2 -i {input} -- sh -c '{tasks}'; \
           echo \"STEP_STATUS $?\"; \
         fi"
    );
    let id = bed.submit(&["--nodes", "2", "--cpus", "1", "-t", "5m", "--wrap", &script]);
    bed.wait_output(id, "STEP_STARTS");
    before_restart(&bed, id);
    restart(&mut bed);
    let job = bed.wait_done(id, Duration::from_secs(240));
    let out = bed.output(id);
    assert_eq!(job["state"], "COMPLETED", "{job}\n{out}\n{}", bed.logs());
    assert!(out.contains("STEP_STATUS 0\n"), "{out}\n{}", bed.logs());
    let want = after(&out, "WANT ").to_string();
    Some((out, want))
}

/// The step-0 task directories job `id` has on host `node` (`node1`, ...).
fn step_tasks(bed: &MultiHost, node: &str, id: u64) -> Vec<wharf_runtime::JobDir> {
    let jobs = bed.dir.path().join(format!("agent-{node}/jobs"));
    let prefix = format!("{id}.s0.");
    let tasks = std::fs::read_dir(jobs).into_iter().flatten().flatten();
    tasks
        .filter(|t| t.file_name().to_string_lossy().starts_with(&prefix))
        .map(|t| wharf_runtime::JobDir::new(t.path()))
        .collect()
}

/// Waits (60 s at most) until `done`, failing with `what` and the bed's logs.
fn wait_until(bed: &MultiHost, what: &str, done: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !done() {
        assert!(Instant::now() < deadline, "{what}\n{}", bed.logs());
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Waits until rank 1's agent (node2) has written a whole pipe (1 MiB) into its task's
/// input, which reads none yet: the pipe is full, and what comes next waits before it.
fn wait_pipe_full(bed: &MultiHost, id: u64) {
    wait_until(bed, "rank 1's pipe never filled", || {
        step_tasks(bed, "node2", id).iter().any(|t| {
            std::fs::read_to_string(t.stdin_written())
                .ok()
                .and_then(|w| w.trim().parse::<u64>().ok())
                .is_some_and(|w| w >= 1 << 20)
        })
    });
}

#[test]
fn input_the_controller_held_for_a_task_not_reading_survives_the_controllers_restart() {
    // Rank 1 of the step (on node2) takes the input and reads none of it for a while: its
    // pipe fills, the rest waits in the controller's buffer, and the controller restarts,
    // losing that buffer. Every byte must still reach the task, once and in order.
    let Some((out, want)) = input_through_a_restart(
        "input_the_controller_held_for_a_task_not_reading_survives_the_controllers_restart",
        RESTART_SEQ,
        "1",
        r#"sleep 20; echo "IN $SLURM_PROCID $(md5sum | cut -c1-32)""#,
        // The pipe full, and a moment for the controller's buffer to take the rest (the
        // caller pushes as fast as it may).
        |bed, id| {
            wait_pipe_full(bed, id);
            std::thread::sleep(Duration::from_secs(1));
        },
        MultiHost::restart_controller,
    ) else {
        return;
    };
    // /dev/null's digest for rank 0, which takes no input.
    assert!(
        out.contains("IN 0 d41d8cd98f00b204e9800998ecf8427e\n"),
        "{out}"
    );
    assert!(out.contains(&format!("IN 1 {want}\n")), "{out}");
}

/// The agent of rank 1's node restarts while rank 1 reads none of its input: its pipe is
/// full, more waits in the agent and the controller. The shim's own writer keeps the pipe
/// open meanwhile, and the new agent goes on from the count the old one left, so rank 1
/// reads every byte once and in order. On the old code the task read its input's end as the
/// agent died, and its digest was of the first megabyte or so.
#[test]
fn a_restart_of_the_tasks_agent_loses_none_of_its_input() {
    let Some((out, want)) = input_through_a_restart(
        "a_restart_of_the_tasks_agent_loses_none_of_its_input",
        RESTART_SEQ,
        "1",
        r#"sleep 15; echo "IN $SLURM_PROCID $(md5sum | cut -c1-32)""#,
        wait_pipe_full,
        |bed| bed.restart_agent(1),
    ) else {
        return;
    };
    assert!(out.contains(&format!("IN 1 {want}\n")), "{out}");
}

/// Lines of input for [`a_task_that_closed_its_input_before_the_restart_holds_nothing_back`]:
/// about 4.8 MB, several times the pipe and the controller's buffer together.
const CLOSED_SEQ: u64 = 700_000;

/// Rank 0 closes its input at once; rank 1 reads none for a while, so the pipe and the
/// controller's buffer fill; the controller restarts meanwhile. Rank 0's node tells the new
/// controller at its first poll that rank 0 takes no input, so nothing is kept for it, and
/// rank 1 gets every byte. On the old code the restarted controller waited for rank 0 for
/// good: its buffer stayed full once rank 1 had read 1 MiB of it, and the step never ended.
#[test]
fn a_task_that_closed_its_input_before_the_restart_holds_nothing_back() {
    let Some((out, want)) = input_through_a_restart(
        "a_task_that_closed_its_input_before_the_restart_holds_nothing_back",
        CLOSED_SEQ,
        "all",
        r#"if [ "$SLURM_PROCID" = 0 ]; then
             head -c 1 >/dev/null; exec </dev/null; echo CLOSED; sleep 25;
           else sleep 20; echo "IN 1 $(md5sum | cut -c1-32)"; fi"#,
        |bed, id| {
            // Rank 0's close reaches the controller before it restarts: its agent marks
            // the task.
            wait_until(bed, "rank 0's input never closed", || {
                ["node1", "node2"].iter().any(|n| {
                    let tasks = step_tasks(bed, n, id);
                    tasks.iter().any(|t| t.stdin_closed().exists())
                })
            });
            // And the buffer fills behind rank 1, which reads nothing for 20 s.
            wait_pipe_full(bed, id);
        },
        MultiHost::restart_controller,
    ) else {
        return;
    };
    assert!(out.contains("CLOSED\n"), "{out}");
    assert!(out.contains(&format!("IN 1 {want}\n")), "{out}");
}
