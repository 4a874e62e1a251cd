//! `wharf show JOB`.

use anyhow::Result;
use wharf_api::resources::{format_duration, format_memory};
use wharf_api::JobRecord;
use wharf_client::{Client, Endpoint};

use crate::output;

/// Arguments.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Job id, or ARRAYID_TASKID for one task of an array.
    #[arg(value_parser = super::job_arg)]
    job: String,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

/// Runs the command.
pub async fn run(socket: &str, args: Args) -> Result<i32> {
    let client = Client::new(Endpoint::parse(socket), None);
    let j: JobRecord = client.get(&format!("/v1/jobs/{}", args.job)).await?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&j)?);
        return Ok(0);
    }
    let now = wharf_controller::now_ms();
    let mut rows: Vec<(&str, String)> = vec![
        (
            "Job",
            match j.array {
                Some(a) => format!("{} ({}, array task {})", j.id, j.name, a.label()),
                None => format!("{} ({})", j.id, j.name),
            },
        ),
        (
            "User",
            format!(
                "{} (uid {}, gid {})",
                j.owner.user, j.owner.uid, j.owner.gid
            ),
        ),
        ("State", j.state.to_string()),
    ];
    if let Some(r) = &j.reason {
        let label = if j.state == wharf_api::JobState::Pending {
            "Why pending"
        } else {
            "Reason"
        };
        rows.push((label, r.clone()));
    }
    if j.restarts > 0 {
        rows.push((
            "Requeued",
            format!(
                "{} time{} (the job sees WHARF_RESTART_COUNT={})",
                j.restarts,
                if j.restarts == 1 { "" } else { "s" },
                j.restarts
            ),
        ));
    }
    if let Some(stop) = &j.requeued_after {
        let words = stop.requeue_words();
        rows.push((
            "Last requeue",
            match &j.requeued_message {
                Some(m) => format!("{words}: {m}"),
                None => words,
            },
        ));
    }
    if let Some(at) = j.begin_time {
        rows.push(("Begin time", output::time(Some(at))));
    }
    if let Some(h) = j.hold {
        rows.push((
            "Held",
            match h {
                wharf_api::Hold::User => "by its owner (`wharf release` lets it start)",
                wharf_api::Hold::Admin => "by an admin (only an admin may release it)",
            }
            .into(),
        ));
    }
    let (expected, priority) = plan_lines(&j);
    rows.extend(expected);
    if let Some(d) = &j.dependency {
        rows.push(("Dependency", d.to_string()));
    }
    rows.extend(priority);
    // A job that asked for all of each node's memory has it only once it has its nodes.
    let whole = j.spec.as_ref().is_some_and(|s| s.memory_whole);
    let memory = if whole && j.allocs.is_empty() {
        "all of each node's".to_string()
    } else {
        format_memory(j.resources.memory)
    };
    rows.extend([
        (
            "Resources",
            format!(
                "{} CPUs, {memory} memory, {} GPUs",
                j.resources.cpus, j.resources.gpus
            ),
        ),
        ("Time limit", format_duration(j.time_limit)),
        ("Submitted", output::time(Some(j.submit_time))),
        ("Started", output::time(j.start_time)),
        ("Ended", output::time(j.end_time)),
        ("Elapsed", format_duration(j.elapsed_ms(now) / 1000)),
        ("Nodes", j.node_count().to_string()),
        (
            "Node list",
            if j.allocs.is_empty() {
                "-".into()
            } else {
                j.nodelist()
            },
        ),
    ]);
    let per_node = j.tasks_per_node();
    if let Some(s) = j.spec.as_ref().filter(|s| s.tasks() > 1) {
        let mut line = format!("{} ({per_node} per node", s.tasks());
        if let Some(g) = s.gpus_per_task {
            line.push_str(&format!(", {g} GPU{} each", if g == 1 { "" } else { "s" }));
        }
        line.push(')');
        rows.push(("Tasks", line));
    }
    // One line per node of a gang (or of a job with several tasks), with its tasks' ranks; a
    // one-task job's ids as before.
    let gang = j.allocs.len() > 1 || per_node > 1;
    for (rank, a) in j.allocs.iter().enumerate() {
        if gang {
            rows.push(("Rank", rank_line(rank, per_node, a)));
            continue;
        }
        if !a.cpu_ids.is_empty() {
            rows.push(("CPU ids", format!("{:?}", a.cpu_ids)));
        }
        if !a.gpu_ids.is_empty() {
            rows.push(("GPU ids", format!("{:?}", a.gpu_ids)));
        }
    }
    rows.extend(j.steps.iter().map(|st| ("Step", step_line(j.id, st))));
    if let Some(e) = &j.exit {
        rows.push((
            "Exit",
            format!(
                "{} (code:signal){}",
                e.code_signal(),
                if e.oom { ", OOM kill" } else { "" }
            ),
        ));
        if let Some(u) = &e.usage {
            rows.push(("Usage", usage_line(u)));
        }
    }
    match &j.spec {
        Some(s) => {
            let digest = j.exit.as_ref().and_then(|e| e.image_digest.as_deref());
            rows.push((
                "Image",
                match digest {
                    Some(d) => format!("{} ({d})", s.image),
                    None => s.image.clone(),
                },
            ));
            rows.extend(pull_lines(&j));
            // Where it was given none: the defaults, named at submit on clusters that have
            // partitions or accounts, and the cluster's default QoS.
            let or_default = |v: &Option<String>| v.clone().unwrap_or_else(|| "(default)".into());
            rows.push(("Partition", or_default(&s.partition)));
            rows.push(("Account", or_default(&s.account)));
            rows.push(("QoS", or_default(&s.qos)));
            rows.push(("Command", shell_words(&s.argv)));
            rows.push(("Workdir", s.workdir.clone()));
            rows.push(("Output", s.output_path(j.id, &j.file_place())));
            if let Some(e) = s.error_path(j.id, &j.file_place()) {
                rows.push(("Error", e));
            }
            if let Some(c) = &s.constraint {
                rows.push(("Constraint", c.to_string()));
            }
            if !s.nodelist.is_empty() {
                rows.push(("Nodelist", s.nodelist.to_string()));
            }
            if !s.exclude.is_empty() {
                rows.push(("Exclude", s.exclude.to_string()));
            }
            if s.exclusive {
                rows.push(("Exclusive", "yes (whole nodes)".into()));
            }
        }
        None => rows.push(("Details", "private to the job's owner".into())),
    }
    for (k, v) in rows {
        println!("{:>12}: {}", k, output::clean(&v));
    }
    Ok(0)
}

/// One step of job `id`: `12.0 sh: 4 task(s) on n[1-2], COMPLETED 0:0`, with how it
/// failed (the first failing task and node) for its owner.
fn step_line(id: u64, st: &wharf_api::step::StepRecord) -> String {
    let names: Vec<&str> = st.nodes.iter().map(|n| n.node.as_str()).collect();
    let mut line = format!(
        "{id}.{} {}: {} task(s) on {}, {}",
        st.id,
        st.name,
        st.ntasks(),
        wharf_api::hostlist::compress(&names),
        st.state()
    );
    if let Some(e) = &st.exit {
        line.push_str(&format!(" {}", e.code_signal()));
        if let Some(m) = &e.message {
            line.push_str(&format!(" ({m})"));
        }
    }
    line
}

/// A line of `wharf show`: its label and its text.
type Row = (&'static str, String);

/// While the job is PENDING, the last scheduling pass's plan for it: when it expects the job
/// to start, and its priority factor by factor. A job that left the queue shows neither, even
/// if its record (stored by an older controller) still carries them.
fn plan_lines(j: &JobRecord) -> (Option<Row>, Option<Row>) {
    if j.state != wharf_api::JobState::Pending {
        return (None, None);
    }
    let expected = j
        .expected_start
        .map(|at| ("Expected start", output::time(Some(at))));
    let priority = j.priority.as_ref().map(|p| {
        let factors = format!(
            "age {} + fair share {} + job size {} + width {} + partition {} + QoS {} - nice {}",
            p.age, p.fairshare, p.job_size, p.width, p.partition, p.qos, p.nice
        );
        let total = if p.fixed {
            format!("{} (fixed by an admin; computed: {factors})", p.total)
        } else {
            format!("{} = {factors}", p.total)
        };
        ("Priority", total)
    });
    (expected, priority)
}

/// While the job is STARTING, each node's pull of its image, as
/// `pulling IMAGE: 2.1 of 8.4 GB, 3 of 14 layers` (with the node's name when it has several).
fn pull_lines(j: &JobRecord) -> Vec<(&'static str, String)> {
    if j.state != wharf_api::JobState::Starting {
        return vec![];
    }
    j.pulling
        .iter()
        .map(|p| {
            let line = if j.allocs.len() > 1 {
                format!("{} on {}", p.describe(), p.node)
            } else {
                p.describe()
            };
            ("Image", line)
        })
        .collect()
}

/// A job's measured use in one line (`wharf eff` gives the detail).
fn usage_line(u: &wharf_api::usage::JobUsage) -> String {
    let mut parts = Vec::new();
    if let Some(ms) = u.cpu_time_ms {
        parts.push(format!("CPU time {}", format_duration(ms / 1000)));
    }
    if let Some(peak) = u.memory_peak {
        parts.push(format!("memory peak {}", format_memory(peak)));
    }
    if let Some(util) = u.gpu_util() {
        parts.push(format!("GPU utilization {util:.0}%"));
    }
    let energy: u64 = u.gpus.iter().filter_map(|g| g.energy_j).sum();
    if energy > 0 {
        parts.push(format!("GPU energy {energy} J"));
    }
    if parts.is_empty() {
        "not measured".into()
    } else {
        parts.join(", ")
    }
}

fn shell_words(argv: &[String]) -> String {
    if let Some(script) = wharf_api::job::script_of(argv) {
        let first = (script.text.lines())
            .find(|l| !l.starts_with('#') && !l.trim().is_empty())
            .unwrap_or("");
        let by = match script.interpreter {
            "/bin/sh" => String::new(),
            i => format!(", {i}"),
        };
        let args = match script.args {
            [] => String::new(),
            some => format!(", arguments: {}", quoted(some)),
        };
        let lines = script.text.lines().count();
        return format!("(script, {lines} lines{by}{args}) {first}");
    }
    quoted(argv)
}

/// `argv` as a shell would read it back: words with anything but plain characters quoted.
fn quoted(argv: &[String]) -> String {
    argv.iter()
        .map(|a| {
            if a.chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_./=:,".contains(c))
            {
                a.clone()
            } else {
                format!("'{}'", a.replace('\'', "'\\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// One node of a gang job: its rank (and its tasks' ranks when it runs several), its node,
/// ids and how it is doing.
fn rank_line(rank: usize, per_node: u32, a: &wharf_api::NodeAlloc) -> String {
    let state = match (&a.exit, a.start_time) {
        (Some(e), _) => match (e.final_state(), e.task) {
            (wharf_api::JobState::Completed, _) => "exited 0".to_string(),
            (s, Some(t)) if per_node > 1 => format!(
                "{s} ({}, task rank {})",
                e.code_signal(),
                rank as u64 * u64::from(per_node) + u64::from(t)
            ),
            (s, _) => format!("{s} ({})", e.code_signal()),
        },
        (None, Some(_)) => "running".into(),
        (None, None) => "starting".into(),
    };
    let tasks = if per_node > 1 {
        let first = rank as u64 * u64::from(per_node);
        format!(" (task ranks {first}-{})", first + u64::from(per_node) - 1)
    } else {
        String::new()
    };
    let mut line = format!(
        "{rank} on {}{tasks}: {state}; CPU ids {:?}",
        a.node, a.cpu_ids
    );
    if !a.gpu_ids.is_empty() {
        line.push_str(&format!(", GPU ids {:?}", a.gpu_ids));
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;
    use wharf_api::{JobState, NodeAlloc, Owner, PullProgress, Resources};

    #[test]
    fn a_starting_jobs_pulls_are_shown_one_line_per_node_escaped() {
        let owner = Owner {
            uid: 1000,
            gid: 1000,
            user: "ann".into(),
        };
        let mut j = JobRecord::pending(owner, "train".into(), Resources::default(), 60, 0);
        j.state = JobState::Starting;
        j.allocs = vec![NodeAlloc::new("n1", vec![], vec![])];
        let pull = |node: &str, image: &str| PullProgress {
            job: 1,
            node: node.into(),
            image: image.into(),
            layers_done: 3,
            layers: 14,
            bytes_done: 2_100_000_000,
            bytes: 8_400_000_000,
        };
        j.pulling = vec![pull("n1", "nvcr.io/nvidia/pytorch:24.05")];
        assert_eq!(
            pull_lines(&j),
            [(
                "Image",
                "pulling nvcr.io/nvidia/pytorch:24.05: 2.1 of 8.4 GB, 3 of 14 layers".to_string()
            )]
        );
        // A gang names each node; what came over the wire is printed escaped.
        j.allocs.push(NodeAlloc::new("n2", vec![], vec![]));
        j.pulling.push(pull("n2", "x\x1b[2J"));
        let lines = pull_lines(&j);
        assert!(lines[0].1.ends_with("3 of 14 layers on n1"), "{lines:?}");
        let shown = output::clean(&lines[1].1);
        assert!(
            !shown.contains('\x1b') && shown.starts_with("pulling x\\e[2J: "),
            "{shown}"
        );
        // Only while STARTING.
        j.state = JobState::Running;
        assert!(pull_lines(&j).is_empty());
    }

    /// A pending job shows the last pass's plan; an ended one none, though its record may
    /// carry it (before, a job cancelled while pending still showed both).
    #[test]
    fn only_a_pending_job_shows_its_expected_start_and_priority() {
        let owner = Owner {
            uid: 1000,
            gid: 1000,
            user: "ann".into(),
        };
        let mut j = JobRecord::pending(owner, "train".into(), Resources::default(), 60, 0);
        j.expected_start = Some(3_600_000);
        j.priority = Some(wharf_api::PriorityView {
            total: 12_000,
            age: 0,
            fairshare: 10_000,
            job_size: 2_000,
            width: 0,
            partition: 0,
            qos: 0,
            nice: 0,
            fixed: false,
        });
        let (expected, priority) = plan_lines(&j);
        assert_eq!(expected.unwrap().0, "Expected start");
        assert_eq!(
            priority.unwrap().1,
            "12000 = age 0 + fair share 10000 + job size 2000 + width 0 + partition 0 + QoS 0 - nice 0"
        );
        for state in [JobState::Cancelled, JobState::Running, JobState::Completed] {
            j.state = state;
            assert_eq!(plan_lines(&j), (None, None), "{state}");
        }
    }
}
