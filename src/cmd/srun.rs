//! `wharf srun` (and the binary called as `srun`): Slurm's `srun` on Wharf. Inside a job
//! (its step socket named in the environment) it runs a step, as `wharf step` does; outside
//! one it runs the command as a job of its own, as `wharf run` does, when every flag given
//! has a meaning there, and otherwise says which flag and what to do instead.

use anyhow::{bail, Result};

use wharf_api::step_input::StepInput;

use super::step;

/// Arguments: the common `srun` flags.
#[derive(Debug, clap::Args)]
#[command(trailing_var_arg = true)]
pub struct Args {
    /// Nodes: inside a job, the job's first N; outside, the new job's.
    #[arg(short = 'N', long)]
    nodes: Option<u32>,
    /// Tasks in all.
    #[arg(short = 'n', long)]
    ntasks: Option<u32>,
    /// Tasks on each node.
    #[arg(long)]
    ntasks_per_node: Option<u32>,
    /// Nodes to run on (a host list, e.g. `gpu[01-02]`).
    #[arg(short = 'w', long)]
    nodelist: Option<String>,
    /// Begin each line of output with the task's rank (inside a job).
    #[arg(short = 'l', long)]
    label: bool,
    /// GPUs each task has to itself.
    #[arg(long)]
    gpus_per_task: Option<u32>,
    /// The job to run in (inside a job: refused unless it is this one).
    #[arg(long)]
    jobid: Option<u64>,
    /// CPUs each task needs: outside a job, the new job's; inside one, each step task's
    /// own, within the job's CPUs on a node.
    #[arg(short = 'c', long)]
    cpus_per_task: Option<u32>,
    /// Which tasks read standard input (inside a job): a task's rank, `all` or `none`.
    #[arg(short = 'i', long, value_parser = StepInput::parse)]
    input: Option<StepInput>,
    /// Output file pattern (see `wharf step --help`); default: this command's output.
    #[arg(short = 'o', long)]
    output: Option<String>,
    /// Error file pattern.
    #[arg(short = 'e', long)]
    error: Option<String>,
    /// The new job's name outside a job; inside one, the step's.
    #[arg(short = 'J', long)]
    job_name: Option<String>,
    /// Time limit (outside a job).
    #[arg(short = 't', long)]
    time: Option<String>,
    /// Partition (outside a job).
    #[arg(short = 'p', long)]
    partition: Option<String>,
    /// Account (outside a job).
    #[arg(short = 'A', long)]
    account: Option<String>,
    /// Memory per node: outside a job, the new job's; inside one, the most the step's tasks
    /// on a node may use together, within the job's there (0: all the job's).
    #[arg(long)]
    mem: Option<String>,
    /// Memory per CPU: the new job's, or the step's per CPU it has on a node.
    #[arg(long, conflicts_with_all = ["mem", "mem_per_gpu"])]
    mem_per_cpu: Option<String>,
    /// Memory per GPU: the new job's, or the step's per GPU it sees on a node.
    #[arg(long, conflicts_with = "mem")]
    mem_per_gpu: Option<String>,
    /// GPUs in all, split evenly over the nodes: outside a job, the new job's; inside one,
    /// the step's own of the job's.
    #[arg(short = 'G', long)]
    gpus: Option<String>,
    /// GPUs per node: outside a job, the new job's; inside one, the step's own.
    #[arg(long)]
    gpus_per_node: Option<String>,
    /// GPUs per node as Slurm writes them (gpu:COUNT, gpu:TYPE:COUNT): outside a job, the new
    /// job's; inside one, the step's own.
    #[arg(long, conflicts_with_all = ["gpus", "gpus_per_node"])]
    gres: Option<String>,
    /// Image (outside a job).
    #[arg(long)]
    image: Option<String>,
    /// Print nothing of Wharf's own on standard error.
    #[arg(short = 'Q', long)]
    quiet: bool,
    /// Inside a job, write the tasks' output as it comes, a part of a line too (outside
    /// one, the job's output is shown as it is written anyway).
    #[arg(short = 'u', long)]
    unbuffered: bool,
    /// Working directory: the tasks' inside a job, the new job's outside one.
    #[arg(short = 'D', long, value_name = "DIR")]
    chdir: Option<String>,
    /// Which variables the tasks get, comma-separated: ALL, NONE, NAME, NAME=VALUE (see
    /// `wharf step --help`). Outside a job, only those named or set reach the new job.
    #[arg(long, value_name = "ALL|NONE|NAME[=VALUE],...")]
    export: Option<String>,
    /// Stop the other tasks when one fails: what Wharf always does (0 is refused).
    #[arg(
        short = 'K',
        long,
        value_name = "0|1",
        num_args = 0..=1,
        default_missing_value = "1",
        require_equals = true
    )]
    kill_on_bad_exit: Option<u8>,
    /// Share the job's resources with its other steps: its CPUs (what a step always does)
    /// and its GPUs (a step that asks for GPUs otherwise holds its own).
    #[arg(long)]
    overlap: bool,
    /// Inside a job, CPUs of the step's own, not shared with the job's other steps: not done
    /// here (a step shares them; -c gives each of its tasks CPUs of its own among its tasks),
    /// said once. Outside one, whole nodes for the new job.
    #[arg(long)]
    exclusive: bool,
    /// Only the resources the step asks for: what a step has here (taken, changing nothing).
    #[arg(long)]
    exact: bool,
    /// MPI plugin: only `none` (Wharf runs no PMI server).
    #[arg(long, value_name = "none")]
    mpi: Option<String>,
    /// How ranks are laid on nodes: only `block` (ranks 0 to k-1 on the first node, and so
    /// on), what Wharf does.
    #[arg(short = 'm', long, value_name = "block")]
    distribution: Option<String>,
    /// The command and its arguments. An option before it that srun does not know is
    /// refused (see [`refused_option`]), not taken for the command; after `--` every word is
    /// the command's.
    #[arg(required = true)]
    command: Vec<String>,
}

/// srun's own words for clap's refusal of an option it does not know, when `err` is that
/// refusal on a `wharf srun` (or `srun`) command line; `None` for any other error.
pub fn refused_option(err: &clap::Error) -> Option<String> {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    if err.kind() != ErrorKind::UnknownArgument {
        return None;
    }
    let usage = err.get(ContextKind::Usage)?.to_string();
    if !usage.contains("wharf srun ") {
        return None;
    }
    let ContextValue::String(option) = err.get(ContextKind::InvalidArg)? else {
        return None;
    };
    let hint = match err.get(ContextKind::SuggestedArg) {
        Some(ContextValue::String(s)) => format!(" (did you mean {s}?)"),
        _ => String::new(),
    };
    let name = option.split('=').next().unwrap_or(option);
    if let Some(why) = not_here(name) {
        return Some(format!("srun: {name} is not available here: {why}"));
    }
    Some(format!(
        "srun: unknown option {option}{hint}; srun options go before the command, and `--` \
         ends them (srun [OPTIONS] [--] COMMAND [ARGS]...)"
    ))
}

/// srun's options Wharf does not take, with why and what to do instead.
fn not_here(option: &str) -> Option<&'static str> {
    Some(match option {
        "--pty" => {
            "Wharf runs no interactive terminal (a job's tasks read no terminal); put the \
             commands in a job's script, or run them one by one with srun"
        }
        "--cpu-bind" | "--mem-bind" | "--hint" => {
            "Wharf places a step's tasks on the job's CPUs of each node itself; -c gives \
             each task CPUs of its own"
        }
        "--gpu-bind" => "--gpus-per-task gives each task GPUs of its own",
        "--x11" => "Wharf forwards no X11 display",
        "--het-group" => "Wharf has no heterogeneous jobs",
        _ => return None,
    })
}

/// The `--env NAME=VALUE` flags of a new job (srun outside a job) for `--export`: a job gets
/// no variable of the caller's shell but those named (with their values here) or set;
/// `ALL` cannot be honoured, and says so.
fn outside_export(spec: Option<&str>, env: &dyn Fn(&str) -> Option<String>) -> Result<Vec<String>> {
    let Some(spec) = spec else {
        return Ok(Vec::new());
    };
    let entries = step::export_entries(spec).map_err(|e| anyhow::anyhow!("srun: {e}"))?;
    let mut out = Vec::new();
    for e in entries {
        match e {
            step::Export::None => {}
            step::Export::All => eprintln!(
                "wharf: srun --export=ALL: a new job gets no variable of this shell; name the \
                 ones it needs (--export=NAME,NAME=VALUE)"
            ),
            step::Export::Set(name, value) => out.push(format!("{name}={value}")),
            step::Export::Name(name) => out.extend(env(name).map(|v| format!("{name}={v}"))),
        }
    }
    Ok(out)
}

/// What `srun` does here.
#[derive(Debug)]
pub enum Plan {
    /// Inside a job: a step.
    Step(Box<step::Args>),
    /// Outside a job: `wharf run` with these arguments (after `wharf`).
    Run(Vec<String>),
}

/// Whether this process runs inside a Wharf job that can take steps.
fn inside_job(env: &dyn Fn(&str) -> Option<String>) -> Result<bool> {
    let job = env("WHARF_JOB_ID").or_else(|| env("SLURM_JOB_ID"));
    match (job, env("WHARF_STEP_SOCKET")) {
        (_, Some(_)) => Ok(true),
        (None, None) => Ok(false),
        (Some(id), None) => bail!(
            "srun: job {id} is in the environment but this node's Wharf step socket is not \
             (WHARF_STEP_SOCKET): run srun from a Wharf job's script or its processes, or \
             unset SLURM_JOB_ID/WHARF_JOB_ID to run the command as a new job"
        ),
    }
}

/// Decides what `srun` does with `args`, `env` reading the environment.
pub fn plan(args: Args, env: &dyn Fn(&str) -> Option<String>) -> Result<Plan> {
    if args.kill_on_bad_exit == Some(0) {
        bail!(
            "srun: --kill-on-bad-exit=0: Wharf always stops the other tasks when one fails \
             (what --kill-on-bad-exit asks); leave it out"
        );
    }
    if let Some(mpi) = args
        .mpi
        .as_deref()
        .filter(|m| !m.eq_ignore_ascii_case("none"))
    {
        bail!(
            "srun: --mpi={mpi}: Wharf runs no PMI server for MPI programs to start from. Its \
             tasks get RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT \
             (torch.distributed, NCCL) and SLURM_PROCID, SLURM_NTASKS and SLURM_LOCALID; \
             leave --mpi out, or give --mpi=none"
        );
    }
    if let Some(d) = &args.distribution {
        let first = d.split([':', ',']).next().unwrap_or("");
        if !first.eq_ignore_ascii_case("block") && first != "*" {
            bail!(
                "srun: --distribution={d}: Wharf lays ranks on nodes in blocks (ranks 0 to \
                 k-1 on the first node, and so on); leave it out, or give block"
            );
        }
    }
    if inside_job(env)? {
        if args.exclusive && !args.quiet {
            eprintln!(
                "wharf: srun --exclusive: this step shares the job's CPUs with its other steps \
                 (-c gives each of its tasks CPUs of its own among its tasks)"
            );
        }
        if let Some(c) = args.cpus_per_task {
            let on_node = env("SLURM_CPUS_ON_NODE").and_then(|v| v.parse::<u32>().ok());
            let per_node = args.ntasks_per_node.unwrap_or(1);
            if let Some(have) = on_node.filter(|&h| c.saturating_mul(per_node) > h) {
                bail!(
                    "srun: {per_node} task(s) of {c} CPUs each on a node is more than the \
                     job's {have} CPUs there; ask for fewer, or submit the job with more"
                );
            }
        }
        let outside_only = [
            ("--partition", args.partition.is_some()),
            ("--account", args.account.is_some()),
            ("--image", args.image.is_some()),
        ];
        if let Some((flag, _)) = outside_only.iter().find(|(_, given)| *given) {
            bail!(
                "srun: {flag} is a job's, not a step's: inside a job a step runs in the job's \
                 allocation; leave it out, or give it to the job (wharf submit)"
            );
        }
        use wharf_api::resources::{parse_memory, parse_memory_or_whole};
        let size = |flag: &str, text: Option<String>, parse: fn(&str) -> Result<u64, String>| {
            (text.as_deref())
                .map(|t| parse(t).map_err(|e| anyhow::anyhow!("srun: {flag}: {e}")))
                .transpose()
        };
        return Ok(Plan::Step(Box::new(step::Args {
            mem: size("--mem", args.mem, parse_memory_or_whole)?,
            mem_per_cpu: size("--mem-per-cpu", args.mem_per_cpu, parse_memory)?,
            mem_per_gpu: size("--mem-per-gpu", args.mem_per_gpu, parse_memory)?,
            nodes: args.nodes,
            // Inside a job, -J names the step and -t limits it, as srun's do.
            job_name: args.job_name,
            time: (args.time.as_deref())
                .map(step::step_time)
                .transpose()
                .map_err(|e| anyhow::anyhow!("srun: {e}"))?,
            nodelist: args.nodelist,
            ntasks_per_node: args.ntasks_per_node,
            ntasks: args.ntasks,
            gpus_per_task: args.gpus_per_task,
            // Inside a job, the step's own GPUs of the job's (unless --overlap).
            gpus_per_node: args.gpus_per_node,
            gpus: args.gpus,
            gres: args.gres,
            overlap: args.overlap,
            cpus_per_task: args.cpus_per_task,
            jobid: args.jobid,
            input: args.input.unwrap_or(StepInput::Task(0)),
            label: args.label,
            output: args.output,
            error: args.error,
            quiet: args.quiet,
            unbuffered: args.unbuffered,
            chdir: args.chdir,
            export: args.export,
            command: args.command,
        })));
    }
    // Outside a job: a job of its own, as `wharf run` runs it.
    let unmapped = [
        (
            "--label",
            args.label,
            "`wharf run` prints the job's output file as it is",
        ),
        (
            "--jobid",
            args.jobid.is_some(),
            "a step runs only inside the job it is started from",
        ),
        (
            "--input",
            args.input.is_some(),
            "a job reads no standard input (its tasks read /dev/null)",
        ),
    ];
    if let Some((flag, _, why)) = unmapped.iter().find(|(_, given, _)| *given) {
        bail!(
            "srun: not inside a Wharf job, so srun runs the command as a new job (wharf run), \
             where {flag} has no meaning: {why}. Leave {flag} out, or call srun from inside a \
             job (a `wharf submit` script)"
        );
    }
    let mut argv = vec!["run".to_string()];
    let mut flag = |name: &str, value: Option<String>| {
        if let Some(v) = value {
            argv.push(format!("--{name}={v}"));
        }
    };
    let num = |v: Option<u32>| v.map(|n| n.to_string());
    flag("nodes", num(args.nodes));
    flag("ntasks", num(args.ntasks));
    flag("ntasks-per-node", num(args.ntasks_per_node));
    flag("nodelist", args.nodelist);
    flag("gpus-per-task", num(args.gpus_per_task));
    flag("cpus", num(args.cpus_per_task));
    flag("output", args.output);
    flag("error", args.error);
    flag("job-name", args.job_name);
    flag("time", args.time);
    flag("partition", args.partition);
    flag("account", args.account);
    flag("mem", args.mem);
    flag("mem-per-cpu", args.mem_per_cpu);
    flag("mem-per-gpu", args.mem_per_gpu);
    flag("gpus", args.gpus);
    flag("gpus-per-node", args.gpus_per_node);
    flag("gres", args.gres);
    flag("image", args.image);
    flag("chdir", args.chdir);
    for entry in outside_export(args.export.as_deref(), env)? {
        flag("env", Some(entry));
    }
    // Outside an allocation srun's --exclusive asks for whole nodes, as sbatch's does.
    if args.exclusive {
        argv.push("--exclusive".into());
    }
    if args.quiet {
        argv.push("--quiet".into());
    }
    argv.push("--".into());
    argv.extend(args.command);
    Ok(Plan::Run(argv))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        args: Args,
    }

    fn parse(words: &[&str]) -> Args {
        let mut argv = vec!["srun"];
        argv.extend(words);
        Cli::try_parse_from(argv).unwrap().args
    }

    /// What srun outside a job runs for `words`: its `wharf run` argv.
    fn run_argv(words: &[&str]) -> Vec<String> {
        let Plan::Run(argv) = plan(parse(words), &env_of(&[])).unwrap() else {
            panic!("not a run")
        };
        argv
    }

    fn env_of(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |k| {
            pairs
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    }

    const IN_JOB: &[(&str, &str)] = &[
        ("WHARF_JOB_ID", "12"),
        ("WHARF_STEP_SOCKET", "@x"),
        ("SLURM_CPUS_ON_NODE", "4"),
    ];

    #[test]
    fn inside_a_job_srun_is_a_step_with_the_same_flags() {
        let a = parse(&[
            "-N",
            "2",
            "-l",
            "--ntasks-per-node=2",
            "-c",
            "2",
            "hostname",
            "-s",
        ]);
        let Plan::Step(s) = plan(a, &env_of(IN_JOB)).unwrap() else {
            panic!("not a step")
        };
        assert_eq!(
            (s.nodes, s.ntasks_per_node, s.label),
            (Some(2), Some(2), true)
        );
        assert_eq!(s.command, ["hostname", "-s"]);
        // -c reaches the step (each task's CPUs); input goes to task 0, as srun's does.
        assert_eq!(s.cpus_per_task, Some(2));
        assert_eq!(s.input, StepInput::Task(0));
        let a = parse(&["-i", "all", "cat"]);
        let Plan::Step(s) = plan(a, &env_of(IN_JOB)).unwrap() else {
            panic!("not a step")
        };
        assert_eq!((s.input, s.cpus_per_task), (StepInput::All, None));
        assert!(Cli::try_parse_from(["srun", "-i", "in.txt", "cat"]).is_err());
        // More CPUs than the job has on a node, or a job's own flag: refused with words.
        let a = parse(&["--ntasks-per-node=2", "-c", "3", "true"]);
        let e = plan(a, &env_of(IN_JOB)).unwrap_err().to_string();
        assert!(e.contains("more than the job's 4 CPUs"), "{e}");
        let e = plan(parse(&["-p", "gpu", "true"]), &env_of(IN_JOB))
            .unwrap_err()
            .to_string();
        assert!(e.contains("--partition is a job's"), "{e}");
        // -J names the step, -t limits it (minutes, as a job's).
        let a = parse(&["-J", "prep", "-t", "5", "true"]);
        let Plan::Step(s) = plan(a, &env_of(IN_JOB)).unwrap() else {
            panic!("not a step")
        };
        assert_eq!((s.job_name.as_deref(), s.time), (Some("prep"), Some(300)));
        let e = plan(parse(&["-t", "soon", "true"]), &env_of(IN_JOB)).unwrap_err();
        assert!(e.to_string().contains("srun: --time"), "{e}");
    }

    #[test]
    fn an_unknown_option_before_the_command_is_refused_naming_it() {
        let refused = |words: &[&str]| {
            let mut argv = vec!["wharf", "srun"];
            argv.extend(words);
            let err = crate::Cli::try_parse_from(argv).expect_err("an unknown option parsed");
            refused_option(&err).unwrap_or_else(|| panic!("not srun's words: {err}"))
        };
        let e = refused(&["--bogus", "hostname"]);
        assert!(
            e.starts_with("srun: unknown option --bogus; srun options go before the command"),
            "{e}"
        );
        let e = refused(&["-N", "1", "-Z", "hostname"]);
        assert!(e.contains("unknown option -Z;"), "{e}");
        let e = refused(&["--nodess", "2", "hostname"]);
        assert!(
            e.contains("unknown option --nodess (did you mean --nodes?)"),
            "{e}"
        );
        // Other commands' errors are not srun's.
        let err = crate::Cli::try_parse_from(["wharf", "queue", "--bogus"]).unwrap_err();
        assert_eq!(refused_option(&err), None);
        // Known options still parse; the command's own options, and anything after `--`,
        // are the command's.
        assert_eq!(
            run_argv(&["-N", "1", "hostname", "--bogus", "-s"]),
            ["run", "--nodes=1", "--", "hostname", "--bogus", "-s"]
        );
        assert_eq!(
            run_argv(&["-N", "1", "--", "--bogus", "x"]),
            ["run", "--nodes=1", "--", "--bogus", "x"]
        );
    }

    #[test]
    fn outside_a_job_srun_is_wharf_run_where_the_flags_map() {
        assert_eq!(
            run_argv(&["-N", "2", "-n", "4", "-c", "2", "-t", "10", "python", "x.py"]),
            [
                "run",
                "--nodes=2",
                "--ntasks=4",
                "--cpus=2",
                "--time=10",
                "--",
                "python",
                "x.py"
            ]
        );
        // GPUs and memory as Slurm writes them: the job's, per node, per CPU or per GPU.
        assert_eq!(
            run_argv(&["-N", "2", "-G", "h100:8", "--mem-per-gpu", "40G", "true"]),
            [
                "run",
                "--nodes=2",
                "--mem-per-gpu=40G",
                "--gpus=h100:8",
                "--",
                "true"
            ]
        );
        let e = plan(parse(&["-l", "true"]), &env_of(&[]))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("runs the command as a new job (wharf run)"),
            "{e}"
        );
        assert!(e.contains("--label"), "{e}");
        let e = plan(parse(&["-i", "none", "true"]), &env_of(&[]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("--input has no meaning"), "{e}");
        // A Slurm job's id without Wharf's socket: not silently a new job.
        let e = plan(parse(&["true"]), &env_of(&[("SLURM_JOB_ID", "5")]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("WHARF_STEP_SOCKET"), "{e}");
    }

    #[test]
    fn inside_a_job_srun_gives_gpu_and_memory_requests_to_the_step() {
        let step = |words: &[&str]| match plan(parse(words), &env_of(IN_JOB)).unwrap() {
            Plan::Step(s) => s,
            Plan::Run(argv) => panic!("not a step: {argv:?}"),
        };
        let s = step(&["-n1", "--gres=gpu:1", "python", "train.py"]);
        assert_eq!((s.gres.as_deref(), s.overlap), (Some("gpu:1"), false));
        let s = step(&["--gpus-per-node", "2", "--overlap", "true"]);
        assert_eq!((s.gpus_per_node.as_deref(), s.overlap), (Some("2"), true));
        assert_eq!(
            step(&["-G", "h100:4", "true"]).gpus.as_deref(),
            Some("h100:4")
        );
        // Memory is the step's ceiling within the job's; 0 is all the job's.
        assert_eq!(step(&["--mem", "4G", "true"]).mem, Some(4 << 30));
        assert_eq!(step(&["--mem=0", "true"]).mem, Some(0));
        let s = step(&["--mem-per-cpu", "2G", "true"]);
        assert_eq!((s.mem, s.mem_per_cpu), (None, Some(2 << 30)));
        assert_eq!(
            step(&["--mem-per-gpu=40G", "true"]).mem_per_gpu,
            Some(40 << 30)
        );
        let e = plan(parse(&["--mem-per-cpu", "0", "true"]), &env_of(IN_JOB)).unwrap_err();
        assert!(e.to_string().contains("srun: --mem-per-cpu"), "{e}");
        let e = plan(parse(&["--mem", "lots", "true"]), &env_of(IN_JOB)).unwrap_err();
        assert!(
            e.to_string().contains("srun: --mem: invalid memory size"),
            "{e}"
        );
        // Outside a job --gres is the new job's.
        assert_eq!(
            run_argv(&["--gres", "gpu:2", "true"]),
            ["run", "--gres=gpu:2", "--", "true"]
        );
    }

    #[test]
    fn srun_options_of_slurm_scripts_are_honoured_or_refused_with_why() {
        // Inside a job: unbuffered output, a working directory and the environment reach
        // the step; what Wharf always does (-K, --overlap, --mpi=none, block) is taken.
        let a = parse(&[
            "-u",
            "-D",
            "run1",
            "--export=NONE,OMP_NUM_THREADS=4",
            "-K",
            "--overlap",
            "--mpi=none",
            "-m",
            "block:cyclic",
            "python",
            "train.py",
        ]);
        let Plan::Step(s) = plan(a, &env_of(IN_JOB)).unwrap() else {
            panic!("not a step")
        };
        assert!(s.unbuffered);
        assert_eq!(s.chdir.as_deref(), Some("run1"));
        assert_eq!(s.export.as_deref(), Some("NONE,OMP_NUM_THREADS=4"));
        assert_eq!(s.command, ["python", "train.py"]);
        assert!(plan(parse(&["--kill-on-bad-exit=1", "true"]), &env_of(IN_JOB)).is_ok());
        // --exclusive: a step's is taken (with a warning); outside a job, whole nodes.
        assert!(plan(parse(&["--exclusive", "-n1", "true"]), &env_of(IN_JOB)).is_ok());
        assert_eq!(
            run_argv(&["--exclusive", "true"]),
            ["run", "--exclusive", "--", "true"]
        );
        // --exact asks for no node of the job's own.
        assert_eq!(run_argv(&["--exact", "true"]), ["run", "--", "true"]);
        // What Wharf cannot do is refused, saying why, inside a job and outside.
        for env in [IN_JOB, &[]] {
            let e = |words: &[&str]| plan(parse(words), &env_of(env)).unwrap_err().to_string();
            assert!(e(&["-K=0", "true"]).contains("always stops the other tasks"));
            assert!(e(&["--mpi=pmix", "a.out"]).contains("no PMI server"));
            assert!(e(&["-m", "cyclic", "true"]).contains("in blocks"));
        }
        // Outside a job: the new job's directory, and only the variables named or set (with
        // their values here), as `wharf run` takes them.
        let env = env_of(&[("HOME", "/home/ann"), ("SECRET", "x")]);
        let Plan::Run(argv) = plan(
            parse(&["-u", "-D", "/scratch", "--export=HOME,A=1,GONE", "true"]),
            &env,
        )
        .unwrap() else {
            panic!("not a run")
        };
        assert_eq!(
            argv,
            [
                "run",
                "--chdir=/scratch",
                "--env=HOME=/home/ann",
                "--env=A=1",
                "--",
                "true"
            ]
        );
        let e = plan(parse(&["--export=A;B", "true"]), &env)
            .unwrap_err()
            .to_string();
        assert!(e.contains("is not ALL, NONE"), "{e}");
        // Options Wharf has not: refused with why, not as unknown.
        let refused = |words: &[&str]| {
            let mut argv = vec!["wharf", "srun"];
            argv.extend(words);
            refused_option(&crate::Cli::try_parse_from(argv).unwrap_err()).unwrap()
        };
        let e = refused(&["--pty", "bash"]);
        assert!(e.starts_with("srun: --pty is not available here: Wharf runs no interactive"));
        let e = refused(&["--cpu-bind=cores", "true"]);
        assert!(
            e.starts_with("srun: --cpu-bind is not available here"),
            "{e}"
        );
    }
}
