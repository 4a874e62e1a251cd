//! Separate hosts (network namespaces on a private bridge, see `netns.rs`): jobs run at their
//! host's own address, a gang job's ranks all-reduce over TCP from the rendezvous environment
//! alone, and a host lost mid-job costs the job a requeue (or ends it NODE_FAIL) while nothing
//! of it runs on the host after it rejoins.

use std::collections::BTreeSet;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::harness::*;
use crate::netns::{Fabric, MultiHost, CONTROLLER_ADDR};

/// The example programs, as jobs and the tests run them.
fn example(name: &str) -> String {
    format!("{}/examples/{name}", env!("CARGO_MANIFEST_DIR"))
}

/// Example `name` where jobs can read it: every job gets a private `/tmp`, so a checkout
/// under `/tmp` is out of their sight; a copy in the bed's own directory is not.
fn example_for_jobs(bed: &MultiHost, name: &str) -> String {
    let to = bed.dir.path().join(name);
    std::fs::copy(example(name), &to).expect("copy the example program for the jobs");
    to.display().to_string()
}

/// What a job's `PATH` is (the agent sets it): `python3` is looked up there.
const JOB_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Element `i` of the all-reduced vector is `(i+1)·W(W+1)/2 + (W-1)W(2W-1)/6`; the printed sum
/// adds them up over `len` elements.
fn allreduce_sum(world: u64, len: u64) -> u64 {
    len * (len + 1) / 2 * world * (world + 1) / 2 + len * (world - 1) * world * (2 * world - 1) / 6
}

/// The `allreduce ok` lines in `text`: rank → (world, sum, address).
fn ok_lines(text: &str) -> std::collections::BTreeMap<u64, (u64, u64, String)> {
    text.lines()
        .filter_map(|l| l.strip_prefix("allreduce ok "))
        .filter_map(|l| {
            let field = |k: &str| {
                l.split_whitespace()
                    .find_map(|w| w.strip_prefix(&format!("{k}=")))
                    .map(str::to_string)
            };
            Some((
                field("rank")?.parse().ok()?,
                (
                    field("world")?.parse().ok()?,
                    field("sum")?.parse().ok()?,
                    field("addr").unwrap_or_default(),
                ),
            ))
        })
        .collect()
}

/// Asserts that every rank of `world` printed its success line with the right sum (for
/// vectors of `len` elements); returns the addresses the ranks were reached at, by rank.
fn assert_all_ranks_ok(text: &str, world: u64, len: u64) -> Vec<String> {
    let ok = ok_lines(text);
    let ranks: Vec<u64> = ok.keys().copied().collect();
    assert_eq!(
        ranks,
        (0..world).collect::<Vec<_>>(),
        "not every rank succeeded:\n{text}"
    );
    let want = allreduce_sum(world, len);
    for (rank, (w, sum, _)) in &ok {
        assert_eq!(*w, world, "rank {rank}: {text}");
        assert_eq!(*sum, want, "rank {rank}: {text}");
    }
    ok.into_values().map(|(_, _, a)| a).collect()
}

/// Starts rank `rank` of `world` of the all-reduce example by `cmd` (`python3`, here or on a
/// host), meeting at `master:port`, with `args` after the program; its output is captured.
fn allreduce_rank(
    mut cmd: Command,
    master: &str,
    port: &str,
    rank: &str,
    world: &str,
    args: &[&str],
) -> std::process::Child {
    cmd.arg(example("allreduce.py"))
        .args(args)
        .envs([
            ("MASTER_ADDR", master),
            ("MASTER_PORT", port),
            ("RANK", rank),
            ("WORLD_SIZE", world),
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3")
}

/// Waits for every rank, asserting each succeeded; returns their stdout, in order.
fn wait_all(ranks: Vec<std::process::Child>) -> String {
    let mut all = String::new();
    for r in ranks {
        let out = r.wait_with_output().unwrap();
        all.push_str(&stdout(&out));
        assert!(out.status.success(), "{all}{}", stderr(&out));
    }
    all
}

/// A free loopback port.
fn free_port() -> String {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
        .to_string()
}

#[test]
fn allreduce_program_sums_across_local_ranks() {
    // The program alone, on loopback: no root needed. Rank 0 starts last, so the others
    // must wait for it.
    let port = free_port();
    let start = |rank: u64| {
        let args = ["--length", "1001", "--timeout", "60"];
        allreduce_rank(
            Command::new("python3"),
            "127.0.0.1",
            &port,
            &rank.to_string(),
            "3",
            &args,
        )
    };
    let mut ranks: Vec<_> = [2, 1].into_iter().map(start).collect();
    std::thread::sleep(Duration::from_millis(500));
    ranks.push(start(0));
    let all = wait_all(ranks);
    assert_all_ranks_ok(&all, 3, 1001);

    // Ranks that disagree on the world fail, and rank 0 says how.
    let port = free_port();
    let run = |rank: &str, world: &str| {
        allreduce_rank(
            Command::new("python3"),
            "127.0.0.1",
            &port,
            rank,
            world,
            &["--timeout", "30"],
        )
    };
    let (zero, one) = (run("0", "2"), run("1", "3"));
    let (zero, one) = (
        zero.wait_with_output().unwrap(),
        one.wait_with_output().unwrap(),
    );
    assert_eq!(zero.status.code(), Some(2), "{}", stderr(&zero));
    assert!(
        stderr(&zero).contains("rank 1 says WORLD_SIZE=3, rank 0 has 2"),
        "{}",
        stderr(&zero)
    );
    assert_eq!(one.status.code(), Some(2), "{}", stderr(&one));
    assert!(!stdout(&zero).contains("allreduce ok") && !stdout(&one).contains("allreduce ok"));

    // Alone, a rank reduces with itself; a rank outside the world is refused, saying so.
    let alone = allreduce_rank(
        Command::new("python3"),
        "127.0.0.1",
        "1",
        "0",
        "1",
        &["--length", "10"],
    )
    .wait_with_output()
    .unwrap();
    assert_all_ranks_ok(&stdout(&alone), 1, 10);
    let outside = allreduce_rank(Command::new("python3"), "127.0.0.1", "1", "3", "3", &[])
        .wait_with_output()
        .unwrap();
    assert_eq!(outside.status.code(), Some(2));
    assert!(
        stderr(&outside).contains("RANK=3 is not within WORLD_SIZE=3"),
        "{}",
        stderr(&outside)
    );
}

#[test]
fn allreduce_program_sums_across_three_hosts_without_wharf() {
    let Some(fabric) =
        Fabric::for_test("allreduce_program_sums_across_three_hosts_without_wharf", 3)
    else {
        return;
    };
    let master = Fabric::addr(0);
    let start = |rank: usize| {
        let cmd = fabric.hosts[rank].command("python3");
        allreduce_rank(
            cmd,
            &master,
            "29500",
            &rank.to_string(),
            "3",
            &["--timeout", "60"],
        )
    };
    let mut ranks: Vec<_> = [1, 2].into_iter().map(start).collect();
    std::thread::sleep(Duration::from_millis(500));
    ranks.insert(0, start(0));
    let all = wait_all(ranks);
    let addrs = assert_all_ranks_ok(&all, 3, 100_000);
    // Each rank was reached at its own host's address: three hosts, not one.
    assert_eq!(addrs, (0..3).map(Fabric::addr).collect::<Vec<_>>());

    // A host cannot reach another's loopback, only its fabric address: the namespaces are
    // real hosts to each other.
    let probe = fabric.hosts[1]
        .command("python3")
        .args([
            "-c",
            "import socket,sys; s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM); \
             s.connect((sys.argv[1], 9)); print(s.getsockname()[0])",
            CONTROLLER_ADDR,
        ])
        .output()
        .unwrap();
    assert_eq!(stdout(&probe).trim(), Fabric::addr(1), "{}", stderr(&probe));
}

#[test]
fn three_hosts_each_run_a_job_at_their_own_address() {
    let Some(bed) = MultiHost::start("three_hosts_each_run_a_job_at_their_own_address", 3, "")
    else {
        return;
    };
    // The job prints the rendezvous address it was given and the address its host really
    // talks from (the source of a route to the controller).
    let script = format!(
        "echo MASTER_ADDR=$MASTER_ADDR; echo RANK=$RANK WORLD_SIZE=$WORLD_SIZE; \
         python3 -c 'import socket; s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM); \
         s.connect((\"{CONTROLLER_ADDR}\", 9)); print(\"SOURCE=\" + s.getsockname()[0])'"
    );
    let ids: Vec<u64> = (0..3)
        .map(|i| {
            bed.submit(&[
                "--cpus",
                "1",
                "--nodelist",
                &MultiHost::node(i),
                "--wrap",
                &script,
            ])
        })
        .collect();
    for (i, id) in ids.into_iter().enumerate() {
        let job = bed.wait_done(id, Duration::from_secs(120));
        assert_eq!(job["state"], "COMPLETED", "{job}\n{}", bed.logs());
        assert_eq!(job_nodes(&job), [MultiHost::node(i)], "{job}");
        let out = bed.output(id);
        let addr = Fabric::addr(i);
        assert!(
            out.contains(&format!("MASTER_ADDR={addr}\n")),
            "job {id} on {}: {out}",
            MultiHost::node(i)
        );
        assert!(out.contains(&format!("SOURCE={addr}\n")), "job {id}: {out}");
        assert!(out.contains("RANK=0 WORLD_SIZE=1\n"), "job {id}: {out}");
    }
}

/// Submits a gang job of `nodes` nodes that runs `program` (an `examples/` file) with
/// python3 after printing its rendezvous; waits until it ends; returns its output.
fn gang_run(bed: &MultiHost, nodes: u32, program: &str) -> String {
    gang_run_with(bed, nodes, program, &[])
}

/// [`gang_run`] with further `wharf submit` options.
fn gang_run_with(bed: &MultiHost, nodes: u32, program: &str, more: &[&str]) -> String {
    let script = format!(
        "echo \"rank $RANK of $WORLD_SIZE nodelist=$SLURM_JOB_NODELIST \
         master=$MASTER_ADDR:$MASTER_PORT\"; echo \"rank $RANK hostfile \
         $(tr '\\n' , < \"$WHARF_HOSTFILE\")\"; exec python3 {} --timeout 120",
        example_for_jobs(bed, program)
    );
    let nodes = nodes.to_string();
    let args = [
        &["--nodes", &nodes, "--cpus", "1"][..],
        more,
        &["--wrap", &script],
    ]
    .concat();
    let id = bed.submit(&args);
    let job = bed.wait_done(id, Duration::from_secs(240));
    let out = bed.output(id);
    assert_eq!(
        job["state"],
        "COMPLETED",
        "{job}\noutput:\n{out}\n{}",
        bed.logs()
    );
    eprintln!("job {id}'s output:\n{out}");
    out
}

#[test]
fn a_gang_job_all_reduces_across_three_hosts() {
    let Some(bed) = MultiHost::start("a_gang_job_all_reduces_across_three_hosts", 3, "") else {
        return;
    };
    let out = gang_run(&bed, 3, "allreduce.py");
    let addrs = assert_all_ranks_ok(&out, 3, 100_000);
    // One rank per host, each at its host's address; rank 0's is MASTER_ADDR.
    let distinct: BTreeSet<&String> = addrs.iter().collect();
    let hosts: BTreeSet<String> = (0..3).map(Fabric::addr).collect();
    assert_eq!(
        distinct.into_iter().cloned().collect::<BTreeSet<_>>(),
        hosts,
        "{out}"
    );
    for rank in 0..3 {
        assert!(
            out.contains(&format!(
                "rank {rank} of 3 nodelist=node[1-3] master={}:",
                addrs[0]
            )),
            "rank {rank}'s rendezvous:\n{out}"
        );
        // Every rank's hostfile: each host's fabric address, in rank order.
        let hostfile: String = addrs.iter().map(|a| format!("{a} slots=1,")).collect();
        assert!(
            out.contains(&format!("rank {rank} hostfile {hostfile}\n")),
            "rank {rank}'s hostfile, {hostfile:?}:\n{out}"
        );
    }
}

#[test]
fn two_tasks_on_each_of_two_hosts_all_reduce_as_four_ranks() {
    let Some(bed) = MultiHost::start(
        "two_tasks_on_each_of_two_hosts_all_reduce_as_four_ranks",
        2,
        "",
    ) else {
        return;
    };
    let out = gang_run_with(&bed, 2, "allreduce.py", &["--ntasks-per-node", "2"]);
    let addrs = assert_all_ranks_ok(&out, 4, 100_000);
    // Ranks 0 and 1 on the first host, 2 and 3 on the second, node by node.
    assert_eq!(addrs[0], addrs[1], "{out}");
    assert_eq!(addrs[2], addrs[3], "{out}");
    assert_ne!(addrs[0], addrs[2], "{out}");
    let hostfile: String = [&addrs[0], &addrs[2]]
        .iter()
        .map(|a| format!("{a} slots=2,"))
        .collect();
    for rank in 0..4 {
        assert!(
            out.contains(&format!(
                "rank {rank} of 4 nodelist=node[1-2] master={}:",
                addrs[0]
            )),
            "rank {rank}'s rendezvous:\n{out}"
        );
        assert!(
            out.contains(&format!("rank {rank} hostfile {hostfile}\n")),
            "rank {rank}'s hostfile, {hostfile:?}:\n{out}"
        );
    }
}

/// Whether jobs' python3 (on the jobs' `PATH`) has torch; prints why not when it has not,
/// and panics instead under WHARF_TEST_STRICT=1 (`tests/run.sh` installs it).
fn jobs_have_torch() -> bool {
    let ok = Command::new("python3")
        .args(["-c", "import torch.distributed"])
        .env("PATH", JOB_PATH)
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        let why = format!(
            "the torch.distributed all-reduce: python3 on {JOB_PATH} has no torch \
             (Debian: apt-get install python3-torch)"
        );
        if std::env::var("WHARF_TEST_STRICT").as_deref() == Ok("1") {
            panic!("{why}");
        }
        eprintln!("SKIPPED {why}");
    }
    ok
}

#[test]
fn a_gang_job_all_reduces_with_torch_gloo_across_three_hosts() {
    if !jobs_have_torch() {
        return;
    }
    let Some(bed) = MultiHost::start(
        "a_gang_job_all_reduces_with_torch_gloo_across_three_hosts",
        3,
        "",
    ) else {
        return;
    };
    let out = gang_run(&bed, 3, "allreduce_torch.py");
    assert_all_ranks_ok(&out, 3, 100_000);
    assert!(out.contains("backend=gloo"), "{out}");
}

/// The nodes job `job` holds, in rank order (`allocs`, or the `node` of a one-node record).
fn job_nodes(job: &serde_json::Value) -> Vec<String> {
    match job["allocs"].as_array() {
        Some(allocs) => allocs
            .iter()
            .filter_map(|a| a["node"].as_str().map(str::to_string))
            .collect(),
        None => job["node"]
            .as_str()
            .map(str::to_string)
            .into_iter()
            .collect(),
    }
}

/// The hosts (indices) whose agents' cgroups hold processes now.
fn busy_hosts(bed: &MultiHost, n: usize) -> Vec<usize> {
    (0..n).filter(|&i| !bed.job_pids(i).is_empty()).collect()
}

/// Waits until job `id` runs processes on `want` hosts; returns them.
fn wait_busy(bed: &MultiHost, n: usize, id: u64, want: usize) -> Vec<usize> {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let busy = busy_hosts(bed, n);
        if busy.len() == want && bed.job(id)["state"] == "RUNNING" {
            return busy;
        }
        assert!(
            Instant::now() < deadline,
            "job {id} never ran on {want} hosts (busy: {busy:?}): {}\n{}",
            bed.job(id),
            bed.logs()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Waits until nothing runs in host `i`'s jobs' cgroups.
fn wait_idle(bed: &MultiHost, i: usize, why: &str) {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let left = bed.job_pids(i);
        if left.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{why}: processes {left:?} still run on {}\n{}",
            MultiHost::node(i),
            bed.logs()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// A job that holds on (until killed) in its first run and prints `done` in any later one.
const FIRST_RUN_HANGS: &str =
    "echo \"run $SLURM_RESTART_COUNT at $MASTER_ADDR\"; [ \"$SLURM_RESTART_COUNT\" = 0 ] && sleep 600; echo done";

#[test]
fn an_unplugged_host_loses_its_job_to_another_and_kills_it_when_it_returns() {
    let Some(bed) = MultiHost::start(
        "an_unplugged_host_loses_its_job_to_another_and_kills_it_when_it_returns",
        3,
        "",
    ) else {
        return;
    };
    let id = bed.submit(&["--cpus", "1", "--wrap", FIRST_RUN_HANGS]);
    let lost = wait_busy(&bed, 3, id, 1)[0];
    assert_eq!(job_nodes(&bed.job(id)), [MultiHost::node(lost)]);
    // Cut off, the host keeps running the job; the controller stops hearing it.
    bed.fabric.unplug(lost);
    bed.wait_nodes(&[MultiHost::node(lost)], "DOWN", Duration::from_secs(60));
    let job = bed.wait_job(id, "requeued", Duration::from_secs(60), |j| {
        j["restarts"].as_u64() >= Some(1)
    });
    assert!(!job_nodes(&job).contains(&MultiHost::node(lost)), "{job}");
    assert!(
        !bed.job_pids(lost).is_empty(),
        "the unplugged host should still be running its copy until it hears otherwise"
    );
    // Back on the network, the host is told its copy is no longer the job's, and kills it.
    bed.fabric.plug(lost);
    bed.wait_nodes(&[MultiHost::node(lost)], "UP", Duration::from_secs(60));
    wait_idle(&bed, lost, "after the host rejoined");
    let done = bed.wait_done(id, Duration::from_secs(120));
    assert_eq!(done["state"], "COMPLETED", "{done}\n{}", bed.logs());
    assert_eq!(job_nodes(&done).len(), 1, "{done}");
    assert!(!job_nodes(&done).contains(&MultiHost::node(lost)), "{done}");
    assert!(bed.output(id).contains("done\n"), "{}", bed.output(id));
    // It stays idle: nothing comes back.
    std::thread::sleep(Duration::from_secs(3));
    assert!(bed.job_pids(lost).is_empty(), "{}", bed.logs());
}

#[test]
fn a_no_requeue_job_on_a_crashed_host_ends_node_fail() {
    let Some(mut bed) =
        MultiHost::start("a_no_requeue_job_on_a_crashed_host_ends_node_fail", 3, "")
    else {
        return;
    };
    let id = bed.submit(&["--cpus", "1", "--no-requeue", "--wrap", FIRST_RUN_HANGS]);
    let lost = wait_busy(&bed, 3, id, 1)[0];
    bed.crash(lost);
    let job = bed.wait_done(id, Duration::from_secs(90));
    assert_eq!(job["state"], "NODE_FAIL", "{job}\n{}", bed.logs());
    assert_eq!(bed.node_states()[&MultiHost::node(lost)], "DOWN");
    // The host comes back, takes work again, and nothing of the old job runs there.
    bed.start_agent(lost);
    bed.wait_nodes(&[MultiHost::node(lost)], "UP", Duration::from_secs(60));
    wait_idle(&bed, lost, "after the host came back");
    let again = bed.submit(&[
        "--cpus",
        "1",
        "--nodelist",
        &MultiHost::node(lost),
        "--wrap",
        "echo back",
    ]);
    let job = bed.wait_done(again, Duration::from_secs(90));
    assert_eq!(job["state"], "COMPLETED", "{job}");
    assert_eq!(bed.output(again), "back\n");
    assert_eq!(bed.job(id)["state"], "NODE_FAIL");
}

#[test]
fn a_gang_job_losing_a_host_is_requeued_whole_or_ends_node_fail() {
    let Some(mut bed) = MultiHost::start(
        "a_gang_job_losing_a_host_is_requeued_whole_or_ends_node_fail",
        4,
        "",
    ) else {
        return;
    };
    let script = format!(
        "{FIRST_RUN_HANGS}; exec python3 {} --timeout 120",
        example_for_jobs(&bed, "allreduce.py")
    );
    // Requeue (the default): a host crashes mid-job; the job starts again, whole, on the
    // three hosts left, and all-reduces there.
    let id = bed.submit(&["--nodes", "3", "--cpus", "1", "--wrap", &script]);
    let busy = wait_busy(&bed, 4, id, 3);
    let lost = busy[1];
    bed.crash(lost);
    let done = bed.wait_done(id, Duration::from_secs(300));
    let out = bed.output(id);
    assert_eq!(done["state"], "COMPLETED", "{done}\n{out}\n{}", bed.logs());
    assert!(done["restarts"].as_u64() >= Some(1), "{done}");
    let nodes = job_nodes(&done);
    assert_eq!(nodes.len(), 3, "{done}");
    assert!(!nodes.contains(&MultiHost::node(lost)), "{done}");
    let addrs = assert_all_ranks_ok(&out, 3, 100_000);
    assert!(
        !addrs.contains(&Fabric::addr(lost)),
        "the rerun used the lost host {}: {out}",
        Fabric::addr(lost)
    );
    // No rank of the first run was left behind on the hosts that stayed up.
    for i in (0..4).filter(|&i| i != lost) {
        wait_idle(&bed, i, "after the job completed");
    }
    bed.start_agent(lost);
    bed.wait_nodes(&[MultiHost::node(lost)], "UP", Duration::from_secs(60));
    wait_idle(&bed, lost, "after the host came back");

    // Without requeue the job ends NODE_FAIL when a host drops off the network, and its
    // ranks on the other hosts are stopped. The unplugged host runs its rank on, unheard,
    // until it is back and told the job is over.
    let id = bed.submit(&[
        "--nodes",
        "3",
        "--cpus",
        "1",
        "--no-requeue",
        "--wrap",
        &script,
    ]);
    let busy = wait_busy(&bed, 4, id, 3);
    let lost = busy[0];
    bed.fabric.unplug(lost);
    let job = bed.wait_done(id, Duration::from_secs(120));
    assert_eq!(job["state"], "NODE_FAIL", "{job}\n{}", bed.logs());
    assert!(
        job["reason"]
            .as_str()
            .is_some_and(|r| r.contains(&MultiHost::node(lost))),
        "the reason names the lost node: {job}"
    );
    for &i in busy.iter().filter(|&&i| i != lost) {
        wait_idle(&bed, i, "after the job ended NODE_FAIL");
    }
    assert!(
        !bed.job_pids(lost).is_empty(),
        "the unplugged host should still be running its rank until it hears otherwise"
    );
    bed.fabric.plug(lost);
    bed.wait_nodes(&[MultiHost::node(lost)], "UP", Duration::from_secs(60));
    wait_idle(&bed, lost, "after the host rejoined");
    std::thread::sleep(Duration::from_secs(3));
    assert!(bed.job_pids(lost).is_empty(), "{}", bed.logs());
}

#[test]
fn steps_from_rank_0_run_on_every_host_or_some_with_their_own_ranks() {
    let test = "steps_from_rank_0_run_on_every_host_or_some_with_their_own_ranks";
    let Some(bed) = MultiHost::start(test, 3, "") else {
        return;
    };
    let program = example_for_jobs(&bed, "allreduce.py");
    let w = wharf_bin();
    // The batch command runs once (`--once`, as an sbatch script runs), on rank 0; the other
    // nodes run nothing and stay the job's until it ends.
    let script = format!(
        "echo \"BATCH rank $RANK of $SLURM_NTASKS world ${{WORLD_SIZE:-none}}\"; \
         {w} step --ntasks-per-node 2 -- python3 {program} --timeout 120; echo \"STEP0 $?\"; \
         {w} step --nodelist node[2-3] -- sh -c 'echo \"two rank $RANK of $WORLD_SIZE \
           node_rank $NODE_RANK master $MASTER_ADDR nodes $SLURM_STEP_NODELIST \
           procid $SLURM_PROCID step $SLURM_STEP_ID job $SLURM_JOB_NODELIST \
           of $SLURM_JOB_NUM_NODES\"'; echo \"STEP1 $?\"; \
         {w} step -N 1 -- sh -c 'exit 5'; echo \"STEP2 $?\"; sleep 8"
    );
    let id = bed.submit(&[
        "--nodes", "3", "--cpus", "2", "-t", "3m", "--once", "--wrap", &script,
    ]);
    // Between steps the other hosts still hold the job (what a raised time limit or the
    // host's loss reaches), and let go once the script has ended.
    let deadline = Instant::now() + Duration::from_secs(200);
    while !bed.output(id).contains("STEP2 ") {
        assert!(
            Instant::now() < deadline,
            "{}\n{}",
            bed.output(id),
            bed.logs()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    for i in 1..3 {
        assert!(
            !bed.job_pids(i).is_empty(),
            "{} holds nothing",
            MultiHost::node(i)
        );
    }
    let job = bed.wait_done(id, Duration::from_secs(240));
    for i in 0..3 {
        wait_idle(&bed, i, "after the script ended");
    }
    let out = bed.output(id);
    assert_eq!(job["state"], "COMPLETED", "{job}\n{out}\n{}", bed.logs());
    eprintln!("job {id}'s output:\n{out}");
    assert!(
        out.contains("STEP0 0\n") && out.contains("STEP1 0\n"),
        "{out}"
    );
    assert!(out.contains("STEP2 5\n"), "{out}");
    // The batch command ran once, as rank 0 of the job's three.
    assert_eq!(out.matches("BATCH rank").count(), 1, "{out}");
    assert!(out.contains("BATCH rank 0 of 3 world none\n"), "{out}");
    // Step 0: six ranks, two on each host, node by node.
    let addrs = assert_all_ranks_ok(&out, 6, 100_000);
    for (r, a) in addrs.iter().enumerate() {
        assert_eq!(*a, Fabric::addr(r / 2), "rank {r}: {out}");
    }
    // Step 1 on nodes 2 and 3 only: its own ranks, with node 2 as its master; the job's
    // node list is still the job's.
    for r in 0..2 {
        assert!(
            out.contains(&format!(
                "two rank {r} of 2 node_rank {r} master {} nodes node[2-3] procid {r} step 1 \
                 job node[1-3] of 3\n",
                Fabric::addr(1)
            )),
            "step 1 rank {r}:\n{out}"
        );
    }
    let steps = job["steps"].as_array().expect("steps recorded");
    let shape: Vec<(u64, usize, u64, i64)> = steps
        .iter()
        .map(|s| {
            (
                s["id"].as_u64().unwrap(),
                s["nodes"].as_array().unwrap().len(),
                s["tasks_per_node"].as_u64().unwrap(),
                s["exit"]["code"].as_i64().unwrap(),
            )
        })
        .collect();
    assert_eq!(shape, [(0, 3, 2, 0), (1, 2, 1, 0), (2, 1, 1, 5)], "{job}");
}
