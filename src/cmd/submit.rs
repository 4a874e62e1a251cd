//! `wharf submit`.

use std::io::{IsTerminal, Read};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use wharf_api::jobfile::{parse_job_file, set_option};
use wharf_api::wire::{SubmitRequest, SubmitResponse};
use wharf_api::JobRequest;
use wharf_client::{Client, ClientError, Endpoint};

/// Job options shared by `submit` and `run`. Same names as `#WHARF` lines.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct JobFlags {
    /// Job name.
    #[arg(short = 'J', long = "job-name")]
    pub name: Option<String>,
    /// Image: a name in the nodes' image store, or "host".
    #[arg(long)]
    pub image: Option<String>,
    /// CPUs per task (a node gives the job this many times --ntasks-per-node).
    #[arg(short = 'c', long, visible_alias = "cpus-per-task")]
    pub cpus: Option<String>,
    /// Memory per node, e.g. 4G or 512M (default: the partition's default per CPU or GPU, or
    /// the site's).
    #[arg(long)]
    pub mem: Option<String>,
    /// Memory per CPU, e.g. 2G: the job gets this times its CPUs on each node.
    #[arg(long, conflicts_with_all = ["mem", "mem_per_gpu"])]
    pub mem_per_cpu: Option<String>,
    /// Memory per GPU, e.g. 40G: the job gets this times its GPUs on each node.
    #[arg(long, conflicts_with_all = ["mem"])]
    pub mem_per_gpu: Option<String>,
    /// GPUs for the whole job, as Slurm's --gpus: COUNT, or TYPE:COUNT for one type (e.g.
    /// h100:8); split evenly over its nodes.
    #[arg(short = 'G', long)]
    pub gpus: Option<String>,
    /// GPUs per node: COUNT, or TYPE:COUNT for one type (e.g. h100:2).
    #[arg(long)]
    pub gpus_per_node: Option<String>,
    /// GPUs per node as Slurm's --gres writes them: gpu:COUNT or gpu:TYPE:COUNT (the count
    /// is 1 when left out: gpu, gpu:TYPE).
    #[arg(long, conflicts_with_all = ["gpus", "gpus_per_node"])]
    pub gres: Option<String>,
    /// Time limit, e.g. 30m, 2h, 1:00:00, or UNLIMITED for the partition's maximum.
    #[arg(short = 't', long)]
    pub time: Option<String>,
    /// Nodes, allocated at once and launched together (a gang job).
    #[arg(short = 'N', long)]
    pub nodes: Option<String>,
    /// Tasks in all: --nodes times --ntasks-per-node (either left out is derived from it).
    #[arg(short = 'n', long)]
    pub ntasks: Option<String>,
    /// Tasks per node (default 1), each in its own sandbox; ranks are numbered node by node.
    #[arg(long)]
    pub ntasks_per_node: Option<String>,
    /// GPUs per task, each task seeing only its own (one task per GPU:
    /// --ntasks-per-node=G --gpus-per-task=1).
    #[arg(long)]
    pub gpus_per_task: Option<String>,
    /// Partition to run in (default: the site's default partition).
    #[arg(short = 'p', long)]
    pub partition: Option<String>,
    /// Account to charge (default: your default account).
    #[arg(short = 'A', long)]
    pub account: Option<String>,
    /// Quality of service.
    #[arg(short = 'q', long)]
    pub qos: Option<String>,
    /// Lower the job's priority by this much (negative: admins only).
    #[arg(long, allow_hyphen_values = true)]
    pub nice: Option<String>,
    /// Do not start before this time: now+1h, now+30m, 16:00, 2026-12-01T08:00 (your time
    /// zone, TZ or /etc/localtime), 2026-12-01T08:00Z (UTC) or with an offset (+01:00).
    #[arg(short = 'b', long)]
    pub begin: Option<String>,
    /// Start only after other jobs: afterok:ID[:ID], afternotok:ID, afterany:ID, after:ID,
    /// singleton; joined by `,` (all) or `?` (any).
    #[arg(short = 'd', long)]
    pub dependency: Option<String>,
    /// A job array, one job per task: 0-99, 1,3,5, 0-15:4; %8 runs at most 8 at once.
    #[arg(short = 'a', long)]
    pub array: Option<String>,
    /// Submit held: the job waits until you release it (`wharf release JOB`).
    #[arg(short = 'H', long)]
    pub hold: bool,
    /// Node features the job needs: NAME, joined by & (all) or | (any), e.g. 'ib&nvme'.
    #[arg(short = 'C', long)]
    pub constraint: Option<String>,
    /// Run only on these nodes (a host list, e.g. gpu[01-04]); a job takes as many of them as
    /// it has nodes.
    #[arg(short = 'w', long)]
    pub nodelist: Option<String>,
    /// Never run on these nodes (a host list).
    #[arg(short = 'x', long)]
    pub exclude: Option<String>,
    /// Take whole nodes: all their CPUs, memory and GPUs, shared with no other job.
    #[arg(long)]
    pub exclusive: bool,
    /// Never requeue this job: a preemption in requeue mode ends it PREEMPTED instead, a lost
    /// node NODE_FAIL, and `wharf requeue` refuses it.
    #[arg(long, conflicts_with = "requeue")]
    pub no_requeue: bool,
    /// May be requeued when preempted or its node is lost (the default for batch jobs,
    /// `wharf submit`; `wharf run` jobs only with this flag; overrides a `--no-requeue` line).
    #[arg(long)]
    pub requeue: bool,
    /// Run the command once, as rank 0 on the first node, as sbatch runs a batch script (the
    /// default for a script with #SBATCH lines); the job's other tasks run nothing and hold
    /// their share of their nodes for its steps (srun, wharf step).
    #[arg(long, conflicts_with = "every_task")]
    pub once: bool,
    /// Run the command in every task of the job, as srun runs one (the default, but for a
    /// script with #SBATCH lines).
    #[arg(long)]
    pub every_task: bool,
    /// Working directory (default: the current directory).
    #[arg(short = 'D', long)]
    pub chdir: Option<String>,
    /// Output file; %j is the job id, %x the name (default wharf-%j.out; `wharf run` passes
    /// its files on and removes them unless this or --error names them).
    #[arg(short = 'o', long)]
    pub output: Option<String>,
    /// Error file (default: the output file).
    #[arg(short = 'e', long)]
    pub error: Option<String>,
    /// Bind SOURCE:DEST[:ro] into the job (SOURCE under a path the node allows; repeatable).
    #[arg(long = "mount", value_name = "SOURCE:DEST[:ro]")]
    pub mounts: Vec<String>,
    /// Be root inside the container (still yourself outside, still no capabilities).
    #[arg(long)]
    pub remap_root: bool,
    /// A writable root: changes go to a per-job layer over the image (in memory, counted
    /// against --mem, gone when the job ends). With --remap-root the image's root-owned files
    /// are yours to change (e.g. to install packages).
    #[arg(long)]
    pub writable: bool,
    /// Needs the node's RDMA devices (InfiniBand/EFA, /dev/infiniband).
    #[arg(long)]
    pub rdma: bool,
    /// Locked memory the job needs (e.g. 64G, or unlimited); refused at once where the node
    /// cannot give it.
    #[arg(long)]
    pub memlock: Option<String>,
    /// Environment variable for the job, NAME=VALUE (repeatable).
    #[arg(long = "env", value_name = "NAME=VALUE")]
    pub env: Vec<String>,
}

impl JobFlags {
    /// The flags as a request (only what was given).
    pub fn to_request(&self) -> Result<JobRequest> {
        let mut req = JobRequest::default();
        let pairs = [
            ("job-name", &self.name),
            ("image", &self.image),
            ("cpus", &self.cpus),
            ("mem", &self.mem),
            ("mem-per-cpu", &self.mem_per_cpu),
            ("mem-per-gpu", &self.mem_per_gpu),
            ("gpus", &self.gpus),
            ("gpus-per-node", &self.gpus_per_node),
            ("gres", &self.gres),
            ("time", &self.time),
            ("nodes", &self.nodes),
            ("ntasks", &self.ntasks),
            ("ntasks-per-node", &self.ntasks_per_node),
            ("gpus-per-task", &self.gpus_per_task),
            ("partition", &self.partition),
            ("account", &self.account),
            ("qos", &self.qos),
            ("nice", &self.nice),
            ("begin", &self.begin),
            ("dependency", &self.dependency),
            ("array", &self.array),
            ("constraint", &self.constraint),
            ("nodelist", &self.nodelist),
            ("exclude", &self.exclude),
            ("chdir", &self.chdir),
            ("output", &self.output),
            ("error", &self.error),
            ("memlock", &self.memlock),
        ];
        let switches = [
            (self.rdma, "rdma"),
            (self.remap_root, "remap-root"),
            (self.writable, "writable"),
            (self.hold, "hold"),
            (self.exclusive, "exclusive"),
            (self.no_requeue, "no-requeue"),
            (self.requeue, "requeue"),
            (self.once, "once"),
            (self.every_task, "every-task"),
        ];
        set_options(&mut req, &pairs, &switches, "yes")?;
        for m in &self.mounts {
            set_option(&mut req, "mount", m).map_err(anyhow::Error::msg)?;
        }
        for e in &self.env {
            set_option(&mut req, "env", e).map_err(anyhow::Error::msg)?;
        }
        Ok(req)
    }
}

/// Arguments.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Job file: TOML (`*.toml`) or a script with #WHARF (or #SBATCH) lines, then the
    /// script's arguments ($1, $2, ...): as with sbatch, every word after the file is the
    /// script's, options included, so Wharf's options come before it.
    #[arg(trailing_var_arg = true, value_name = "FILE [ARG]...")]
    file: Vec<String>,
    #[command(flatten)]
    flags: JobFlags,
    /// Run this shell command instead of a file (like sbatch --wrap).
    #[arg(long, conflicts_with = "file")]
    wrap: Option<String>,
    /// Print the answer as JSON.
    #[arg(long, conflicts_with = "parsable")]
    json: bool,
    /// Print only the job's id (as sbatch --parsable).
    #[arg(long)]
    parsable: bool,
    /// Return once the job has ended (every task of an array), with its exit status (the
    /// highest of an array's), as sbatch --wait.
    #[arg(short = 'W', long)]
    wait: bool,
    #[command(flatten)]
    sbatch: SbatchFlags,
}

/// sbatch's options that Wharf takes as a script's `#SBATCH` lines give them: `--export`
/// and `--open-mode` as far as Wharf can honour them (else refused, saying why), the others
/// accepted with a warning of why they change nothing. So `wharf submit --mail-type=END
/// job.sh` does what the same line in the script does.
#[derive(Debug, Clone, Default, clap::Args)]
#[command(next_help_heading = "sbatch options (as in #SBATCH lines: taken, or warned of)")]
pub struct SbatchFlags {
    /// NONE (what Wharf does: no variable of this shell), NAME=VALUE (as --env); ALL and
    /// bare names are warned of (the job gets no variable of this shell).
    #[arg(long, value_name = "NONE|NAME=VALUE,...")]
    export: Option<String>,
    /// truncate (what Wharf does); append is refused.
    #[arg(long, value_name = "truncate")]
    open_mode: Option<String>,
    /// No mail is sent.
    #[arg(long, value_name = "TYPE")]
    mail_type: Option<String>,
    /// No mail is sent.
    #[arg(long, value_name = "ADDRESS")]
    mail_user: Option<String>,
    /// At its time limit a job gets SIGTERM, then SIGKILL after the grace period.
    #[arg(long, value_name = "SIG@TIME")]
    signal: Option<String>,
    /// Jobs keep no comment.
    #[arg(long)]
    comment: Option<String>,
    /// CPUs are placed by Wharf's own rules.
    #[arg(long)]
    hint: Option<String>,
    /// Wharf has no reservations.
    #[arg(long)]
    reservation: Option<String>,
    /// The job keeps its --time.
    #[arg(long)]
    time_min: Option<String>,
    /// A job's /tmp is a private tmpfs of the node's size.
    #[arg(long)]
    tmp: Option<String>,
    /// The cluster's [scheduler] kill_invalid_dependency decides.
    #[arg(long, value_name = "yes|no")]
    kill_on_invalid_dep: Option<String>,
    /// Usage is sampled by the nodes.
    #[arg(long)]
    profile: Option<String>,
    /// Usage is sampled by the nodes.
    #[arg(long)]
    acctg_freq: Option<String>,
    /// The job gets no login environment; set variables with --env. (A value only after
    /// `=`, as sbatch takes it: the word after it is the script.)
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "")]
    #[arg(value_name = "TIMEOUT")]
    get_user_env: Option<String>,
    /// The node's resource limits apply. (A value only after `=`.)
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "")]
    #[arg(value_name = "LIMITS")]
    propagate: Option<String>,
    /// A job's CPUs, memory and GPUs are its own.
    #[arg(short = 's', long)]
    oversubscribe: bool,
    /// Changes nothing.
    #[arg(short = 'v', long, action = clap::ArgAction::Count)]
    verbose: u8,
    /// Changes nothing.
    #[arg(short = 'Q', long)]
    quiet: bool,
}

impl SbatchFlags {
    /// The flags as a request, each as its `#SBATCH` line sets it.
    fn to_request(&self) -> Result<JobRequest> {
        let mut req = JobRequest::default();
        let valued = [
            ("export", &self.export),
            ("open-mode", &self.open_mode),
            ("mail-type", &self.mail_type),
            ("mail-user", &self.mail_user),
            ("signal", &self.signal),
            ("comment", &self.comment),
            ("hint", &self.hint),
            ("reservation", &self.reservation),
            ("time-min", &self.time_min),
            ("tmp", &self.tmp),
            ("kill-on-invalid-dep", &self.kill_on_invalid_dep),
            ("profile", &self.profile),
            ("acctg-freq", &self.acctg_freq),
            ("get-user-env", &self.get_user_env),
            ("propagate", &self.propagate),
        ];
        let switches = [
            (self.oversubscribe, "oversubscribe"),
            (self.verbose > 0, "verbose"),
            (self.quiet, "quiet"),
        ];
        set_options(&mut req, &valued, &switches, "")?;
        Ok(req)
    }
}

/// Sets on `req` each option of `valued` given a value and each switch set (to `on`), as
/// the job file's lines would.
fn set_options(
    req: &mut JobRequest,
    valued: &[(&str, &Option<String>)],
    switches: &[(bool, &str)],
    on: &str,
) -> Result<()> {
    let given = valued.iter().filter_map(|(k, v)| Some((*k, v.as_deref()?)));
    let set = switches.iter().filter(|(s, _)| *s).map(|&(_, k)| (k, on));
    for (key, value) in given.chain(set) {
        set_option(req, key, value).map_err(anyhow::Error::msg)?;
    }
    Ok(())
}

/// Reads a job file into a request.
pub fn read_job_file(path: &PathBuf) -> Result<JobRequest> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading job file {}", path.display()))?;
    parse_job_file(&path.display().to_string(), &text).map_err(anyhow::Error::msg)
}

/// The job's working directory (`--chdir`, else the submit directory) when it lies under a
/// path every sandbox mounts afresh (its own `/tmp`, `/dev`, `/proc`, `/sys`): the job
/// cannot see it, and the node starts it in `/`.
pub(crate) fn hidden_workdir(chdir: Option<&str>, cwd: &std::path::Path) -> Option<PathBuf> {
    let joined = chdir.map_or_else(|| cwd.to_path_buf(), |d| cwd.join(d));
    // `..` taken as written, as the node takes the path.
    let mut dir = PathBuf::new();
    for c in joined.components() {
        match c {
            std::path::Component::ParentDir => {
                dir.pop();
            }
            std::path::Component::CurDir => {}
            other => dir.push(other),
        }
    }
    let top = dir.components().nth(1)?.as_os_str().to_str()?.to_string();
    wharf_runtime::SANDBOX_MOUNT_POINTS
        .contains(&top.as_str())
        .then_some(dir)
}

/// Submits `job`, retrying while the controller is unreachable (the client token makes a
/// retry of a submit that was in fact stored return the same job).
pub async fn submit(socket: &str, mut job: JobRequest) -> Result<u64> {
    // A wall-clock --begin means the user's time zone, which only this side knows.
    job.begin = job.begin.map(crate::localtime::localize).transpose()?;
    let cwd = std::env::current_dir().context("reading the current directory")?;
    if let Some(w) = hidden_workdir(job.workdir.as_deref(), &cwd) {
        eprintln!(
            "wharf: warning: the job cannot see {}: it gets its own private {} there, so it \
             starts in / (its output files are still written where they are named); submit \
             from a shared directory or give --chdir DIR",
            crate::output::clean(&w.display().to_string()),
            crate::output::clean(&w.iter().take(2).collect::<PathBuf>().display().to_string()),
        );
    }
    // The user's own credential for the registry the job's image names, if they have one.
    let registry_auth = job.image.as_deref().and_then(|image| {
        let files = crate::registry_auth::auth_files(|v| std::env::var(v).ok());
        crate::registry_auth::for_image(image, &files, &mut |w| {
            eprintln!("wharf: warning: {}", crate::output::clean(&w))
        })
    });
    let req = SubmitRequest {
        job,
        cwd: cwd.display().to_string(),
        client_token: Some(wharf_client::random_hex(16)?),
        registry_auth,
    };
    let client = Client::new(Endpoint::parse(socket), None);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    let mut retrying = false;
    loop {
        match client.post::<_, SubmitResponse>("/v1/jobs", &req).await {
            Ok(r) => return Ok(r.id),
            Err(e) if e.is_transient() && tokio::time::Instant::now() < deadline => {
                if !retrying {
                    eprintln!(
                        "wharf: {}; retrying for up to 15s",
                        crate::output::clean(&e.to_string())
                    );
                    retrying = true;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(ClientError::Api { error, .. }) => anyhow::bail!("job rejected: {}", error.error),
            Err(e) => return Err(e.into()),
        }
    }
}

/// The first of a script's arguments, if it is one of `wharf submit`'s own options
/// (`--cpus`, `--time=1h`, `-c`): most likely meant for Wharf, which takes options only
/// before the script.
fn wharf_flag(script_args: &[String]) -> Option<&str> {
    let first = script_args.first()?.as_str();
    let cmd = <Args as clap::Args>::augment_args(clap::Command::new("submit"));
    let known = |a: &clap::Arg| match first.strip_prefix("--") {
        Some(long) => a.get_long() == Some(long.split('=').next().unwrap_or(long)),
        None => {
            let mut chars = first.strip_prefix('-').unwrap_or("").chars();
            chars.next().is_some_and(|c| a.get_short() == Some(c))
        }
    };
    (first.starts_with('-') && cmd.get_arguments().any(known)).then_some(first)
}

/// The job `args` describe: its file (and the script's arguments) or `--wrap`, under the
/// flags.
fn job_of(args: &Args) -> Result<JobRequest> {
    job_from(
        args,
        &mut std::io::stdin().lock(),
        std::io::stdin().is_terminal(),
    )
}

/// [`job_of`], the script read from `stdin` where it comes from there: `-` in the file's
/// place, or no file and no `--wrap` with `stdin` not a terminal (`sbatch <<EOF`, as sbatch
/// reads it).
fn job_from(args: &Args, stdin: &mut dyn Read, terminal: bool) -> Result<JobRequest> {
    let piped = args.file.is_empty() && args.wrap.is_none() && !terminal;
    let from_stdin = piped || args.file.first().is_some_and(|f| f == "-");
    let mut job = match (args.file.split_first(), &args.wrap) {
        _ if from_stdin => {
            let mut text = String::new();
            let limit = wharf_api::jobfile::MAX_JOB_FILE as u64 + 1;
            stdin
                .take(limit)
                .read_to_string(&mut text)
                .context("reading the script from standard input")?;
            // Named as sbatch names a job read from its standard input, errors with it.
            let mut job = parse_job_file("sbatch", &text).map_err(anyhow::Error::msg)?;
            if job.script.is_none() || text.trim().is_empty() {
                anyhow::bail!(
                    "standard input held no script: give a job file, --wrap 'COMMAND', or a \
                     script on standard input (wharf submit <<EOF)"
                );
            }
            job.args = args.file.iter().skip(1).cloned().collect();
            job
        }
        (Some((f, script_args)), _) => {
            let mut job = read_job_file(&PathBuf::from(f))?;
            if !script_args.is_empty() {
                if job.script.is_none() {
                    anyhow::bail!(
                        "{f} is a TOML job file: nothing may follow it; put Wharf's options \
                         before it (`wharf submit --cpus 4 {f}`) and a command's arguments in \
                         its `command`"
                    );
                }
                if let Some(flag) = wharf_flag(script_args) {
                    eprintln!(
                        "wharf: warning: {} follows the script, so it is the script's argument \
                         ($1...), as with sbatch, not an option of Wharf's; put Wharf's options \
                         before the script",
                        crate::output::clean(flag)
                    );
                }
                job.args = script_args.to_vec();
            }
            job
        }
        (None, Some(w)) => JobRequest {
            script: Some(w.clone()),
            name: Some("wrap".into()),
            ..Default::default()
        },
        (None, None) => anyhow::bail!(
            "give a job file (job.toml or a script), --wrap 'COMMAND', or a script on standard \
             input (wharf submit <<EOF)"
        ),
    };
    job = job.overlay(args.flags.to_request()?);
    job = job.overlay(args.sbatch.to_request()?);
    job.parsable |= args.parsable;
    job.wait |= args.wait;
    Ok(job)
}

/// The warning of the options `job` gave that Wharf accepts but does not honour.
fn ignored_warning(job: &JobRequest) -> Option<String> {
    (!job.ignored.is_empty()).then(|| {
        format!(
            "wharf: warning: these options are accepted but not honoured: {}",
            job.ignored.join("; ")
        )
    })
}

/// The warning for a script of a job of several tasks that launches steps itself (`srun`,
/// `wharf step`, `mpirun`), runs in every task (not `--once`, which a script with `#SBATCH`
/// lines is) and never looks at its rank: each launch would then run once per task.
fn fan_out_warning(job: &JobRequest) -> Option<String> {
    if job.once == Some(true) {
        return None;
    }
    let script = job.script.as_deref()?;
    let tasks = job
        .ntasks
        .unwrap_or_else(|| job.nodes.unwrap_or(1) * job.ntasks_per_node.unwrap_or(1));
    let launches = script.lines().any(|line| {
        let mut words = line.split_whitespace();
        match words.next() {
            Some("srun" | "mpirun" | "mpiexec") => true,
            Some("wharf") => matches!(words.next(), Some("step" | "srun")),
            _ => false,
        }
    });
    let ranked = ["RANK", "SLURM_PROCID", "SLURM_NODEID", "SLURM_LOCALID"]
        .iter()
        .any(|v| script.contains(v));
    (tasks > 1 && launches && !ranked).then(|| {
        format!(
            "wharf: warning: the script runs in each of the job's {tasks} tasks (Wharf runs a \
             job's command in every task, as srun does, where sbatch runs a script once), so \
             each srun, wharf step or mpirun in it runs {tasks} times over; submit it with \
             --once to run it once, as sbatch does, the other tasks holding their nodes"
        )
    })
}

/// Runs the command.
pub async fn run(socket: &str, args: Args) -> Result<i32> {
    let job = job_of(&args)?;
    if let Some(w) = ignored_warning(&job) {
        eprintln!("{}", crate::output::clean(&w));
    }
    if let Some(w) = fan_out_warning(&job) {
        eprintln!("{w}");
    }
    let (parsable, wait) = (job.parsable, job.wait);
    let tasks = job.array.as_ref().map(|a| a.tasks.len());
    let id = submit(socket, job).await?;
    if args.json {
        println!("{}", serde_json::json!({ "id": id }));
    } else if parsable {
        println!("{id}");
    } else {
        // sbatch's words, which scripts parse (`awk '{print $4}'`); an array's size after
        // them on stderr.
        println!("Submitted batch job {id}");
        if let Some(n) = tasks {
            eprintln!("wharf: an array of {n} tasks, {id}_TASK each (or {id} for all of them)");
        }
    }
    if !wait {
        return Ok(0);
    }
    // An array's tasks are jobs `id`, `id + 1`, ... in task order.
    let client = Client::new(Endpoint::parse(socket), None);
    let mut status = 0;
    for job in id..id + tasks.unwrap_or(1) as u64 {
        status = status.max(crate::cmd::run::wait_for_end(&client, job).await?);
    }
    Ok(status)
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_script_launching_steps_from_every_task_is_warned_of_unless_it_checks_its_rank() {
        let job = |script: &str, nodes: Option<u32>, ntasks: Option<u32>| wharf_api::JobRequest {
            script: Some(script.into()),
            nodes,
            ntasks,
            ..Default::default()
        };
        let steps = "#!/bin/bash\n#SBATCH -n 2\nsrun hostname\n";
        let w = super::fan_out_warning(&job(steps, None, Some(2))).unwrap();
        assert!(w.contains("runs 2 times over"), "{w}");
        assert!(super::fan_out_warning(&job("wharf step -N 1 x\n", Some(4), None)).is_some());
        // One task, no launcher, a launcher only in a comment, or a rank check: no warning.
        assert_eq!(super::fan_out_warning(&job(steps, None, Some(1))), None);
        assert_eq!(
            super::fan_out_warning(&job("hostname\n", None, Some(2))),
            None
        );
        assert_eq!(
            super::fan_out_warning(&job("# srun x\n", None, Some(2))),
            None
        );
        let guarded = "[ \"$RANK\" = 0 ] || exit 0\nsrun hostname\n";
        assert_eq!(super::fan_out_warning(&job(guarded, None, Some(2))), None);
        // Run once (a #SBATCH script's default): its launches run once.
        let once = wharf_api::JobRequest {
            once: Some(true),
            ..job(steps, None, Some(2))
        };
        assert_eq!(super::fan_out_warning(&once), None);
        assert!(w.contains("submit it with --once"), "{w}");
    }

    use super::*;
    use clap::Parser;

    #[derive(Debug, clap::Parser)]
    struct Cli {
        #[command(flatten)]
        args: Args,
    }

    fn job(words: &[&str], script: &str) -> Result<JobRequest> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("job.sh");
        std::fs::write(&path, script).unwrap();
        let path = path.display().to_string();
        let argv = std::iter::once("submit").chain(words.iter().map(|w| match *w {
            "FILE" => path.as_str(),
            w => w,
        }));
        job_from(
            &Cli::try_parse_from(argv).unwrap().args,
            &mut std::io::empty(),
            true,
        )
    }

    #[test]
    fn a_script_comes_from_standard_input_as_sbatch_reads_it() {
        let args = |words: &[&str]| {
            let argv = std::iter::once("submit").chain(words.iter().copied());
            Cli::try_parse_from(argv).unwrap().args
        };
        let script = "#!/bin/sh\n#SBATCH -n 2\necho $1\n";
        let piped = |words: &[&str], text: &str, terminal| {
            job_from(&args(words), &mut text.as_bytes(), terminal)
        };
        // Piped with no file, or `-` with the script's arguments after it.
        let j = piped(&["-p", "gpu"], script, false).unwrap();
        assert_eq!(j.script.as_deref(), Some(script));
        assert_eq!((j.name.as_deref(), j.ntasks), (Some("sbatch"), Some(2)));
        assert_eq!(j.partition.as_deref(), Some("gpu"));
        let j = piped(&["-", "a", "b"], script, true).unwrap();
        assert_eq!(j.args, ["a", "b"]);
        // A terminal is not read; empty input is no script; too much is refused.
        let e = piped(&[], script, true).unwrap_err().to_string();
        assert!(e.contains("give a job file"), "{e}");
        let e = piped(&[], "", false).unwrap_err().to_string();
        assert!(e.contains("standard input held no script"), "{e}");
        let huge = format!(
            "#!/bin/sh\n{}",
            "x".repeat(wharf_api::jobfile::MAX_JOB_FILE)
        );
        let e = piped(&[], &huge, false).unwrap_err().to_string();
        assert!(e.contains("the limit is"), "{e}");
    }

    #[test]
    fn sbatch_options_on_the_command_line_do_what_their_script_lines_do() {
        let j = job(
            &[
                "--export=NONE,FOO=bar",
                "--mail-type=END",
                "--open-mode",
                "truncate",
                "-v",
                "-s",
                "--get-user-env",
                "FILE",
            ],
            "#!/bin/sh\ntrue\n",
        )
        .unwrap();
        assert_eq!(j.env.get("FOO").map(String::as_str), Some("bar"));
        // The word after a switch whose value is optional is the script, as sbatch takes it.
        assert_eq!(j.name.as_deref(), Some("job.sh"));
        let p = job(
            &["--propagate=STACK", "--get-user-env=10L", "FILE"],
            "true\n",
        )
        .unwrap();
        assert!(ignored_warning(&p).unwrap().contains("--propagate"));
        let w = ignored_warning(&j).unwrap();
        for name in [
            "--mail-type",
            "--verbose",
            "--get-user-env",
            "--oversubscribe",
        ] {
            assert!(w.contains(name), "{name} not in {w}");
        }
        // ALL is warned of, append refused, as the script's lines are, each saying why.
        let w = ignored_warning(&job(&["--export=ALL", "FILE"], "true\n").unwrap()).unwrap();
        assert!(w.contains("--export=ALL (a job gets no variable"), "{w}");
        let e = job(&["--open-mode=append", "FILE"], "true\n").unwrap_err();
        assert!(e.to_string().contains("--open-mode=append"), "{e}");
    }

    #[test]
    fn a_workdir_the_sandbox_hides_is_named() {
        let home = std::path::Path::new("/home/ann/work");
        let tmp = std::path::Path::new("/tmp/ann/work");
        assert_eq!(hidden_workdir(None, tmp), Some(tmp.to_path_buf()));
        assert_eq!(hidden_workdir(None, home), None);
        assert_eq!(
            hidden_workdir(Some("/tmp/x"), home),
            Some(PathBuf::from("/tmp/x"))
        );
        assert_eq!(hidden_workdir(Some("/data/x"), tmp), None);
        assert_eq!(hidden_workdir(Some("sub"), home), None);
        assert_eq!(hidden_workdir(Some("/"), home), None);
        assert_eq!(hidden_workdir(Some("../../../home/ann"), tmp), None);
        // Two levels up from the home directory, then tmp/y: still under the home tree.
        assert_eq!(hidden_workdir(Some("../../tmp/y"), home), None);
        assert_eq!(
            hidden_workdir(Some("../../../tmp/y"), home),
            Some(PathBuf::from("/tmp/y"))
        );
    }

    #[test]
    fn words_after_a_script_are_its_arguments() {
        let j = job(
            &["--cpus", "2", "FILE", "a1", "--cpus", "-x"],
            "#!/bin/sh\ntrue\n",
        )
        .unwrap();
        assert_eq!(j.cpus, Some(2));
        assert_eq!(j.args, ["a1", "--cpus", "-x"]);
        let spec = j
            .resolve("/tmp", &wharf_api::JobDefaults::default())
            .unwrap();
        assert_eq!(spec.argv[3..], ["/bin/sh", "a1", "--cpus", "-x"]);
        assert!(job(&["FILE"], "#!/bin/sh\ntrue\n").unwrap().args.is_empty());
        // One of Wharf's own options first after the script is most likely misplaced.
        let words = |w: &[&str]| w.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        for flag in ["--cpus", "--time=4h", "-c", "-t4h"] {
            assert_eq!(wharf_flag(&words(&[flag, "8"])), Some(flag));
        }
        for other in ["--lr", "-9", "a1", "--", "-"] {
            assert_eq!(wharf_flag(&words(&[other, "--cpus"])), None, "{other}");
        }
    }

    #[test]
    fn sbatch_parsable_and_wait_lines_reach_the_command_and_ignored_ones_warn_once() {
        let j = job(
            &["FILE"],
            "#!/bin/sh\n#SBATCH --parsable --wait\n#SBATCH --mail-type=END --mail-user=a@b\n\
             #SBATCH --mail-type=FAIL\ntrue\n",
        )
        .unwrap();
        assert!(j.parsable && j.wait);
        let w = ignored_warning(&j).unwrap();
        assert_eq!(w.matches("--mail-type").count(), 1, "{w}");
        assert!(w.contains("--mail-user (Wharf sends no mail)"), "{w}");
        assert!(ignored_warning(&job(&["FILE"], "true\n").unwrap()).is_none());
    }
}
