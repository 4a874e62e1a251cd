//! `wharf acct`: job records (Slurm's `sacct`), with chosen columns, `--parsable` and `--json`.

use anyhow::Result;
use wharf_api::resources::{format_duration, format_memory};
use wharf_api::wire::{AcctQuery, JobList};
use wharf_api::JobRecord;
use wharf_client::{Client, Endpoint};

use crate::output;

/// Arguments.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Only these jobs, comma-separated: ID (a job, or every task of an array) or
    /// ARRAYID_TASKID (one task of an array).
    #[arg(short = 'j', long)]
    jobs: Option<String>,
    /// Only these users' jobs (admins; others see only their own).
    #[arg(short = 'u', long)]
    user: Option<String>,
    /// Every user's jobs (admins).
    #[arg(short = 'a', long)]
    allusers: bool,
    /// Only jobs charged to these accounts.
    #[arg(short = 'A', long)]
    account: Option<String>,
    /// Only jobs of these partitions.
    #[arg(short = 'r', long)]
    partition: Option<String>,
    /// Only jobs in these states: COMPLETED,FAILED,CANCELLED,TIMEOUT,OUT_OF_MEMORY,...;
    /// REQUEUED (RQ): the runs that ended in a requeue.
    #[arg(short = 's', long)]
    state: Option<String>,
    /// Window start: 2026-11-01, 2026-11-01T08:00 (your time zone), 2026-11-01T08:00Z (UTC),
    /// today (its start, your time zone), or now-7days, now-3600 (seconds without a unit, as
    /// sacct) (default: today 00:00 UTC).
    #[arg(short = 'S', long)]
    starttime: Option<String>,
    /// Window end, as --starttime (default: now).
    #[arg(short = 'E', long)]
    endtime: Option<String>,
    /// Columns, comma-separated (see the list in `wharf acct --help-format`).
    #[arg(short = 'o', long, default_value = DEFAULT_FORMAT)]
    format: String,
    /// List the columns --format takes.
    #[arg(long)]
    help_format: bool,
    /// Fields separated by `|`, one line per job, a `|` after each (as sacct -p).
    #[arg(short = 'p', long)]
    parsable: bool,
    /// As --parsable, without the `|` after the last field (as sacct -P).
    #[arg(short = 'P', long, conflicts_with = "parsable")]
    parsable2: bool,
    /// The separator of --parsable and --parsable2 fields (default `|`).
    #[arg(long, value_name = "TEXT")]
    delimiter: Option<String>,
    /// No header line.
    #[arg(short = 'n', long)]
    noheader: bool,
    /// Print JSON (the full records).
    #[arg(long)]
    json: bool,
    /// Every run of a requeued job (its earlier runs shown as REQUEUED), not only its last.
    #[arg(short = 'D', long)]
    duplicates: bool,
    /// A row for each job's steps after the job's own, as sacct shows them: `ID.batch` for
    /// the batch command, `ID.0`, `ID.1`, ... for the steps it started with `wharf step`.
    #[arg(long)]
    steps: bool,
    /// Only the jobs' own lines, no steps (sacct -X; the default without --steps).
    #[arg(short = 'X', long, conflicts_with = "steps")]
    allocations: bool,
}

const DEFAULT_FORMAT: &str = "JobID,JobName,Partition,Account,AllocCPUS,AllocGPUS,State,ExitCode";

/// Columns `--format` takes, with what each shows.
const COLUMNS: [(&str, &str); 30] = [
    ("JobID", "job id (ARRAYID_TASK for array tasks)"),
    ("JobIDRaw", "job id, an array task's own"),
    ("JobName", "name"),
    ("User", "owner"),
    ("Account", "account charged"),
    ("Partition", "partition"),
    ("QOS", "QoS"),
    ("State", "state, in Slurm's names"),
    ("ExitCode", "exit code:signal"),
    ("Submit", "submit time (UTC)"),
    ("Start", "start time"),
    ("End", "end time"),
    ("Elapsed", "run time"),
    ("ElapsedRaw", "run time, seconds"),
    ("Timelimit", "time limit"),
    (
        "TimelimitRaw",
        "time limit, minutes (a part of one counts whole)",
    ),
    ("NNodes", "nodes"),
    ("NTasks", "tasks (of the job, or of a step)"),
    ("AllocCPUS", "CPUs held (all nodes)"),
    ("ReqMem", "memory asked for"),
    ("AllocGPUS", "GPUs held (all nodes)"),
    ("NodeList", "nodes, as a host list (gpu[01-04])"),
    ("CPUTime", "CPUs held × run time"),
    ("CPUTimeRAW", "CPUs held × run time, seconds"),
    ("TotalCPU", "CPU time used (measured)"),
    ("MaxRSS", "memory peak (measured)"),
    ("GPUUtil", "mean GPU utilization (measured)"),
    ("Restarts", "times requeued"),
    ("Image", "image as the job named it"),
    (
        "ImageDigest",
        "digest of the image it ran (images of the node's store)",
    ),
];

/// Runs the command.
pub async fn run(socket: &str, args: Args) -> Result<i32> {
    if args.help_format {
        for (name, what) in COLUMNS {
            println!("{name:<12} {what}");
        }
        println!("(NAME%N shows at most N characters of a column, as sacct's --format does)");
        return Ok(0);
    }
    let (columns, widths): (Vec<&str>, Vec<Option<usize>>) =
        parse_format(&args.format)?.into_iter().unzip();
    let now = wharf_controller::now_ms();
    let q = AcctQuery {
        jobs: args.jobs,
        users: (args.user.as_deref()).map(|u| {
            u.split(',')
                .map(super::user_name)
                .collect::<Vec<_>>()
                .join(",")
        }),
        all_users: args.allusers,
        accounts: args.account,
        partitions: args.partition,
        states: args.state,
        since: args
            .starttime
            .as_deref()
            .map(|t| window_time("--starttime", t, now))
            .transpose()?,
        until: args
            .endtime
            .as_deref()
            .map(|t| window_time("--endtime", t, now))
            .transpose()?,
        duplicates: args.duplicates,
    };
    let client = Client::new(Endpoint::parse(socket), None);
    let query = serde_urlencoded::to_string(&q)?;
    let list: JobList = client.get(&format!("/v1/acct?{query}")).await?;
    // A run that ended in a requeue (an earlier run, with --duplicates or REQUEUED): an ended
    // one that the controller says stopped for one, or one another run of its job follows.
    let requeued = |i: usize| {
        let j = &list.jobs[i];
        (j.state.is_terminal() && j.stop.as_ref().is_some_and(wharf_api::Stop::requeues))
            || list.jobs.get(i + 1).is_some_and(|n| n.id == j.id)
    };
    if args.json {
        // The same state as the table's.
        let mut rows = serde_json::to_value(&list.jobs)?;
        if let Some(rows) = rows.as_array_mut() {
            for (i, row) in rows.iter_mut().enumerate() {
                if requeued(i) {
                    row["state"] = "REQUEUED".into();
                }
            }
        }
        println!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(0);
    }
    let mut rows: Vec<Vec<String>> = Vec::new();
    for (i, j) in list.jobs.iter().enumerate() {
        let requeued = requeued(i);
        let row = |batch: bool| -> Vec<String> {
            columns
                .iter()
                .map(|c| match *c {
                    "State" if requeued => "REQUEUED".to_string(),
                    "JobID" | "JobIDRaw" if batch => format!("{}.batch", cell(j, c, now)),
                    "JobName" if batch => "batch".to_string(),
                    // A script run once is one task, as sbatch's batch step.
                    "NTasks" if batch && j.runs_once() => "1".to_string(),
                    // The job's own line counts its steps' use too; its batch line does not.
                    "TotalCPU" | "MaxRSS" if !batch => usage_cell(j, c),
                    _ => cell(j, c, now),
                })
                .collect()
        };
        rows.push(row(false));
        if args.steps && j.start_time.is_some() {
            rows.push(row(true));
            for s in &j.steps {
                rows.push(columns.iter().map(|c| step_cell(j, s, c, now)).collect());
            }
        }
    }
    if args.parsable || args.parsable2 {
        let sep = args.delimiter.as_deref().unwrap_or("|");
        if sep.is_empty() {
            anyhow::bail!("--delimiter: give the text between fields (one character or more)");
        }
        let mut out = String::new();
        let header: Vec<String> = columns.iter().map(|c| c.to_string()).collect();
        for row in (!args.noheader).then_some(&header).into_iter().chain(&rows) {
            let fields: Vec<String> = (row.iter())
                .map(|v| output::clean(v).replace(sep, &format!("\\{sep}")))
                .collect();
            out.push_str(&fields.join(sep));
            if args.parsable {
                out.push_str(sep);
            }
            out.push('\n');
        }
        print!("{out}");
    } else {
        let mut t = match args.noheader {
            true => output::Table::default(),
            false => output::table(&columns),
        };
        for mut row in rows {
            for (v, w) in row.iter_mut().zip(&widths) {
                if let Some(w) = *w {
                    *v = cut(v, w);
                }
            }
            t.add_row(row);
        }
        output::print_table(&t);
    }
    Ok(0)
}

/// The columns of a `--format` list, each with the width `NAME%N` gives it.
fn parse_format(format: &str) -> Result<Vec<(&'static str, Option<usize>)>> {
    (format.split(',').map(str::trim))
        .filter(|c| !c.is_empty())
        .map(|c| {
            let (name, width) = match c.split_once('%') {
                Some((name, w)) => {
                    let w = w.parse::<usize>().ok().filter(|&w| (1..=1000).contains(&w));
                    let w = w.ok_or_else(|| {
                        anyhow::anyhow!("--format: {c:?}: the width after % is 1 to 1000")
                    })?;
                    (name, Some(w))
                }
                None => (c, None),
            };
            let found = COLUMNS.iter().find(|(n, _)| n.eq_ignore_ascii_case(name));
            let (name, _) = found.ok_or_else(|| {
                anyhow::anyhow!(
                    "--format: unknown column {name:?}; `wharf acct --help-format` lists them"
                )
            })?;
            Ok((*name, width))
        })
        .collect()
}

/// `text` in at most `width` characters: cut, with `+` as the last, when longer (sacct's).
fn cut(text: &str, width: usize) -> String {
    if text.chars().count() <= width {
        return text.to_string();
    }
    let mut out: String = text.chars().take(width - 1).collect();
    out.push('+');
    out
}

/// A window bound: an absolute time (as `--begin` takes) or `now-DURATION`, ms.
pub fn window_time(flag: &str, text: &str, now: u64) -> Result<u64> {
    let t = text.trim();
    // As sacct (and --begin now+N): seconds unless a unit follows.
    if let Some(ago) = t.strip_prefix("now-") {
        let secs = wharf_api::forms::now_offset(ago)
            .map_err(|e| anyhow::anyhow!("{flag}: {t:?}: {}", e.replace("now±", "now-")))?;
        return Ok(now.saturating_sub(secs.saturating_mul(1000)));
    }
    if t.eq_ignore_ascii_case("now") {
        return Ok(now);
    }
    if t.eq_ignore_ascii_case("today") || t.eq_ignore_ascii_case("midnight") {
        return Ok(crate::localtime::start_of_today().saturating_mul(1000));
    }
    let at = wharf_api::forms::parse_begin(t)
        .ok()
        .filter(|b| matches!(b, wharf_api::Begin::At(_) | wharf_api::Begin::Local(_)))
        .map(crate::localtime::localize);
    match at {
        Some(Ok(wharf_api::Begin::At(secs))) => Ok(secs.saturating_mul(1000)),
        Some(Err(e)) => Err(e.context(format!("{flag}: {t:?}"))),
        _ => anyhow::bail!(
            "{flag}: {t:?}: write 2026-11-01, 2026-11-01T08:00 (your time zone), \
             2026-11-01T08:00Z (UTC), today, now or now-7days (seconds without a unit)"
        ),
    }
}

/// The job's TotalCPU or MaxRSS with its steps' (see [`JobRecord::usage_with_steps`]).
fn usage_cell(j: &JobRecord, column: &str) -> String {
    measured(j.usage_with_steps().as_ref(), column)
}

/// Column `column` (TotalCPU or MaxRSS) of what `usage` says was used; empty when nothing
/// was measured.
fn measured(usage: Option<&wharf_api::usage::JobUsage>, column: &str) -> String {
    let v = match column {
        "TotalCPU" => usage
            .and_then(|u| u.cpu_time_ms)
            .map(|ms| format_duration(ms / 1000)),
        _ => usage.and_then(|u| u.memory_peak).map(format_memory),
    };
    v.unwrap_or_default()
}

/// CPUTime (or, as seconds, CPUTimeRAW): `cpus` held for `elapsed` ms.
fn cpu_time(elapsed: Option<u64>, cpus: u64, column: &str) -> String {
    let secs = elapsed.map(|ms| ms.saturating_mul(cpus) / 1000);
    match (secs, column) {
        (Some(s), "CPUTimeRAW") => s.to_string(),
        (Some(s), _) => format_duration(s),
        (None, _) => String::new(),
    }
}

/// One column of one job.
fn cell(j: &JobRecord, column: &str, now: u64) -> String {
    let spec = j.spec.as_ref();
    let usage = j.exit.as_ref().and_then(|e| e.usage.as_ref());
    let elapsed = j
        .start_time
        .map(|s| j.end_time.unwrap_or(now).saturating_sub(s));
    let opt = |v: Option<String>| v.unwrap_or_default();
    match column {
        "JobID" => j.label(),
        "JobIDRaw" => j.id.to_string(),
        "JobName" => j.name.clone(),
        "User" => j.owner.user.clone(),
        "Account" => opt(spec.and_then(|s| s.account.clone())),
        "Partition" => opt(spec.and_then(|s| s.partition.clone())),
        "QOS" => opt(spec.and_then(|s| s.qos.clone())),
        "State" => j.state.as_str().to_string(),
        // As sacct: 0:0 until there is an exit, and for a job that never ran.
        "ExitCode" => j
            .exit
            .as_ref()
            .map_or_else(|| "0:0".into(), |e| e.code_signal()),
        "Submit" => output::time(Some(j.submit_time)),
        "Start" => output::time(j.start_time),
        "End" => output::time(j.end_time),
        "Elapsed" => opt(elapsed.map(|ms| format_duration(ms / 1000))),
        "ElapsedRaw" => opt(elapsed.map(|ms| (ms / 1000).to_string())),
        "Timelimit" => format_duration(j.time_limit),
        "TimelimitRaw" => j.time_limit.div_ceil(60).to_string(),
        "NNodes" => j.node_count().to_string(),
        "NTasks" => opt(spec.map(|s| s.tasks().to_string())),
        "AllocCPUS" => (j.resources.cpus * j.node_count()).to_string(),
        "ReqMem" => format_memory(j.resources.memory),
        "AllocGPUS" => (j.resources.gpus * j.node_count()).to_string(),
        "NodeList" => j.nodelist(),
        "CPUTime" | "CPUTimeRAW" => {
            let cpus = u64::from(j.resources.cpus * j.node_count());
            cpu_time(elapsed, cpus, column)
        }
        "TotalCPU" | "MaxRSS" => measured(usage, column),
        "GPUUtil" => opt(usage.and_then(|u| u.gpu_util()).map(|p| format!("{p:.0}%"))),
        "Restarts" => j.restarts.to_string(),
        "Image" => opt(spec.map(|s| s.image.clone())),
        "ImageDigest" => opt(j.exit.as_ref().and_then(|e| e.image_digest.clone())),
        _ => String::new(),
    }
}

/// One column of step `s` of job `j`: what the step itself has (its times, nodes, tasks,
/// state), the job's where they are the same (user, account, partition), blank otherwise.
fn step_cell(j: &JobRecord, s: &wharf_api::step::StepRecord, column: &str, now: u64) -> String {
    let elapsed = s
        .start_time
        .map(|t| s.end_time.unwrap_or(now).saturating_sub(t));
    let names: Vec<&str> = s.nodes.iter().map(|n| n.node.as_str()).collect();
    // Its tasks' own CPUs and GPUs where it asked for them per task, else the job's on its
    // nodes, which its tasks share.
    let per_task = |each: Option<u32>, per_node: u32| {
        each.map_or(per_node.saturating_mul(names.len() as u32), |n| {
            n.saturating_mul(s.ntasks())
        })
    };
    let cpus = per_task(s.cpus_per_task, j.resources.cpus);
    // GPUs it held of its own on each node, where it held some (`srun --gres` and the like).
    let gpus = match s.gpus_per_node {
        Some(_) => s.nodes.iter().map(|n| n.gpu_ids.len() as u32).sum(),
        None => per_task(s.gpus_per_task, j.resources.gpus),
    };
    let opt = |v: Option<String>| v.unwrap_or_default();
    match column {
        "JobID" | "JobIDRaw" => format!("{}.{}", cell(j, column, now), s.id),
        "JobName" => s.name.clone(),
        "User" | "Account" | "Partition" | "QOS" | "Image" => cell(j, column, now),
        "State" => s.state().as_str().to_string(),
        "ExitCode" => s
            .exit
            .as_ref()
            .map_or_else(|| "0:0".into(), |e| e.code_signal()),
        "Submit" => output::time(Some(s.submit_time)),
        "Start" => output::time(s.start_time),
        "End" => output::time(s.end_time),
        "Elapsed" => opt(elapsed.map(|ms| format_duration(ms / 1000))),
        "ElapsedRaw" => opt(elapsed.map(|ms| (ms / 1000).to_string())),
        "Timelimit" => format_duration(s.time_limit),
        "TimelimitRaw" => s.time_limit.div_ceil(60).to_string(),
        "NNodes" => names.len().to_string(),
        "NTasks" => s.ntasks().to_string(),
        "AllocCPUS" => cpus.to_string(),
        "AllocGPUS" => gpus.to_string(),
        // Its own ceiling on its first node (`srun --mem`), else the job's.
        "ReqMem" => format_memory(
            (s.nodes.first())
                .and_then(|n| n.memory)
                .unwrap_or(j.resources.memory),
        ),
        "NodeList" => wharf_api::hostlist::compress(&names),
        "CPUTime" | "CPUTimeRAW" => cpu_time(elapsed, u64::from(cpus), column),
        // What its tasks used (CPU time summed, the highest memory peak), as sacct's.
        "TotalCPU" | "MaxRSS" => measured(s.exit.as_ref().and_then(|e| e.usage.as_ref()), column),
        _ => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use wharf_api::step::{StepNode, StepRecord};
    use wharf_api::{JobRecord, JobState, Owner, Resources};

    #[test]
    fn a_steps_cpus_are_its_tasks_own_and_an_exit_not_yet_known_reads_0_0() {
        let owner = Owner {
            uid: 1000,
            gid: 1000,
            user: "ann".into(),
        };
        let four = Resources {
            cpus: 4,
            memory: 1 << 30,
            gpus: 2,
        };
        let mut job = JobRecord::pending(owner, "j".into(), four, 60, 0);
        job.state = JobState::Cancelled;
        // Cancelled while it waited: no exit, 0:0 as sacct prints it.
        assert_eq!(super::cell(&job, "ExitCode", 0), "0:0");
        // An array's task: JobID as users name it, JobIDRaw its own id.
        job.id = 76;
        job.array = Some(wharf_api::array::ArrayTask {
            job_id: 75,
            task_id: 2,
            throttle: None,
            shape: Default::default(),
        });
        assert_eq!(super::cell(&job, "JobID", 0), "75_2");
        assert_eq!(super::cell(&job, "JobIDRaw", 0), "76");
        let node = |n: &str| StepNode {
            node: n.into(),
            ..Default::default()
        };
        let mut step = StepRecord {
            nodes: vec![node("a"), node("b")],
            tasks_per_node: 2,
            ..Default::default()
        };
        let cell = |s: &StepRecord, c| super::step_cell(&job, s, c, 0);
        // Without -c or --gpus-per-task, the job's on each of its nodes.
        assert_eq!(
            (cell(&step, "AllocCPUS"), cell(&step, "AllocGPUS")),
            ("8".into(), "4".into())
        );
        step.cpus_per_task = Some(1);
        step.gpus_per_task = Some(0);
        assert_eq!(
            (cell(&step, "AllocCPUS"), cell(&step, "AllocGPUS")),
            ("4".into(), "0".into())
        );
        assert_eq!(cell(&step, "ExitCode"), "0:0");
        // GPUs held of its own: those it was given on each node.
        step.gpus_per_task = None;
        step.gpus_per_node = Some(1);
        step.nodes[0].gpu_ids = vec![3];
        step.nodes[1].gpu_ids = vec![0];
        assert_eq!(cell(&step, "AllocGPUS"), "2");
        // Memory: the job's, or the step's own ceiling (`srun --mem`).
        assert_eq!(cell(&step, "ReqMem"), "1G");
        step.nodes[0].memory = Some(256 << 20);
        assert_eq!(cell(&step, "ReqMem"), "256M");
    }
}

#[cfg(test)]
mod window_tests {
    use super::window_time;

    #[test]
    fn now_minus_counts_seconds_unless_a_unit_says_otherwise_as_sacct() {
        let now = 1_000_000_000;
        let at = |t: &str| window_time("-S", t, now);
        assert_eq!(at("now-5").unwrap(), now - 5_000);
        assert_eq!(at("now-5min").unwrap(), now - 300_000);
        assert_eq!(at("now-1hours").unwrap(), now - 3_600_000);
        assert_eq!(at("now-7d").unwrap(), now - 7 * 86_400_000);
        assert_eq!(at("now").unwrap(), now);
        let e = at("now-1fortnight").unwrap_err().to_string();
        assert!(e.contains("unknown unit") && e.contains("-S"), "{e}");
        // Today's start is a past midnight, within the last day and a bit (a clock change).
        let today = at("today").unwrap();
        let real_now = wharf_controller::now_ms();
        assert!(
            today <= real_now && real_now - today <= 25 * 3_600_000,
            "{today}"
        );
    }
}
