//! `wharf`: one binary for the controller, the node agent and the user commands.

mod cmd;
mod config;
mod localtime;
mod output;
mod registry_auth;

use clap::{Parser, Subcommand};

/// Wharf: a container-native job runner for shared GPU clusters.
///
/// Users submit jobs (`submit`, `run`), watch them (`queue`, `show`, `nodes`), hold, release,
/// requeue and cancel them, and look back at them (`acct`, `eff`, `report`). Admins start
/// `controller` on one host and `agent` on every node, or `dev` for both on one machine, and
/// manage accounts, users, QoS and partitions with `admin`.
#[derive(Debug, Parser)]
#[command(
    name = "wharf",
    version,
    propagate_version = true,
    max_term_width = 100
)]
struct Cli {
    /// The controller's Unix socket. Default: /run/wharf/wharf.sock. (Its TCP port is for
    /// node agents alone.)
    #[arg(long, global = true, env = "WHARF_SOCKET")]
    socket: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Submit a batch job from a TOML job file or a script with #WHARF lines.
    Submit(Box<cmd::submit::Args>),
    /// Submit a command, wait for it, stream its output and exit with its status.
    Run(Box<cmd::run::Args>),
    /// List jobs: pending and running, or --all for recent ended ones too.
    #[command(disable_help_flag = true)]
    Queue(cmd::queue::Args),
    /// Show one job in detail, including why it is pending.
    Show(cmd::show::Args),
    /// Job records, ended or not (Slurm's sacct): by job, user, account, partition, state
    /// and time window, with chosen columns.
    Acct(cmd::acct::Args),
    /// Usage by account, user and partition in CPU-hours, GPU-hours and billing, and the
    /// cluster's utilization, over a time window (Slurm's sreport).
    Report(cmd::report::Args),
    /// How well an ended job used its CPUs, memory and GPUs, with hints for next time.
    Eff(cmd::eff::Args),
    /// Run a command on some or all of the nodes of the job it is called from, within its
    /// allocation (Slurm's srun inside a job), and exit with its status.
    Step(cmd::step::Args),
    /// Slurm's srun: a step inside a job, else the command as a job (`wharf run`); also
    /// what this binary does when it is called `srun` (a link named so).
    Srun(cmd::srun::Args),
    /// Cancel jobs.
    Cancel(cmd::cancel::Args),
    /// Hold pending jobs so they do not start (an admin's hold only an admin releases).
    Hold(cmd::hold::Args),
    /// Release held jobs.
    Release(cmd::hold::Args),
    /// Stop running jobs and put them back in the queue (same id and submit time).
    Requeue(cmd::requeue::Args),
    /// Change a pending job's time limit (only lower, unless admin), nice, partition, QoS,
    /// account or begin time; or a running job's time limit (counted from its start).
    Update(cmd::update::Args),
    /// List nodes and what is allocated on them.
    Nodes(cmd::nodes::Args),
    /// Slurm's sinfo: each partition's nodes grouped by state, one line per node (-N), per
    /// partition (-s) or per reason a node takes no work (-R); also what this binary does
    /// when it is called `sinfo`.
    #[command(disable_help_flag = true)]
    Sinfo(cmd::sinfo::Args),
    /// The fair-share tree (Slurm's sshare): each account's and user's shares and decayed
    /// usage against its siblings', and each user's fair-share factor.
    Share(cmd::share::Args),
    /// Accounts, users, QoS and partitions at run time, and their audit (admins; an
    /// account's coordinators manage its users).
    #[command(subcommand)]
    Admin(cmd::admin::Command),
    /// Manage the node's image store.
    #[command(subcommand)]
    Image(cmd::image::Command),
    /// Run the controller (API, scheduler, state store).
    Controller(cmd::controller::Args),
    /// Run the node agent (as root).
    Agent(cmd::agent::Args),
    /// Run a controller and an agent in one process, for a single machine.
    Dev(cmd::dev::Args),
    /// Supervise one job's container (started by the agent).
    #[command(hide = true)]
    Shim(cmd::shim::Args),
}

/// Slurm's commands this binary answers to when called by their names (a link named so, e.g.
/// `ln -s "$(command -v wharf)" ~/bin/sbatch`), and the command each is: its flags are
/// Slurm's where Wharf has them (see each command's `--help`).
const SLURM_NAMES: [(&str, &[&str]); 9] = [
    ("srun", &["srun"]),
    ("sbatch", &["submit"]),
    ("squeue", &["queue"]),
    ("scancel", &["cancel"]),
    ("sacct", &["acct"]),
    ("sshare", &["share"]),
    ("seff", &["eff"]),
    ("sprio", &["queue", "--priority"]),
    ("sinfo", &["sinfo"]),
];

/// The command line, with the command in front when this binary was called by one of
/// [`SLURM_NAMES`].
fn args() -> Vec<std::ffi::OsString> {
    as_called(std::env::args_os().collect())
}

/// `argv` as `wharf` takes it: a Slurm command's name in `argv[0]` becomes its command.
fn as_called(mut argv: Vec<std::ffi::OsString>) -> Vec<std::ffi::OsString> {
    let called = argv
        .first()
        .and_then(|a| std::path::Path::new(a).file_name())
        .map(|n| n.to_os_string());
    let found = SLURM_NAMES
        .iter()
        .find(|(name, _)| called.as_deref() == Some(std::ffi::OsStr::new(name)));
    if let Some((_, command)) = found {
        argv[0] = "wharf".into();
        argv.splice(1..1, command.iter().map(std::ffi::OsString::from));
    }
    argv
}

/// What a command that writes its answer and ends exits with when that answer's reader has
/// gone (`wharf queue --json | head -c 10`): 141, what a shell shows for a command killed by
/// SIGPIPE, as `cat` would be.
const CLOSED_STDOUT_STATUS: i32 = 128 + libc::SIGPIPE;

/// Makes a write to a closed standard output end the command quietly with
/// [`CLOSED_STDOUT_STATUS`] instead of panicking in `println!` (Rust ignores SIGPIPE, so the
/// write fails with EPIPE and `println!` panics on it). SIGPIPE itself stays ignored: a client
/// that writes its request to a controller that has closed the connection (one over its
/// per-user cap, say) must say so, not die without a word. Any other panic is reported as
/// before.
fn quiet_on_closed_stdout() {
    let report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let payload = info.payload();
        let text = (payload.downcast_ref::<String>().map(String::as_str))
            .or_else(|| payload.downcast_ref::<&str>().copied())
            .unwrap_or("");
        let epipe = format!("(os error {})", libc::EPIPE);
        if text.starts_with("failed printing to stdout") && text.contains(&epipe) {
            std::process::exit(CLOSED_STDOUT_STATUS);
        }
        report(info);
    }));
}

fn main() {
    let cli = match Cli::try_parse_from(args()) {
        Ok(cli) => cli,
        Err(e) => match cmd::srun::refused_option(&e) {
            // srun's words: clap's would suggest `-- --bogus`, which runs `--bogus` as the
            // command.
            Some(why) => {
                eprintln!("error: {why}");
                std::process::exit(2);
            }
            None => e.exit(),
        },
    };
    if let Command::Shim(args) = &cli.command {
        // The shim must stay single-threaded: no async runtime here.
        std::process::exit(cmd::shim::run(args));
    }
    let daemon = matches!(
        cli.command,
        Command::Controller(_) | Command::Agent(_) | Command::Dev(_)
    );
    if !daemon {
        quiet_on_closed_stdout();
    }
    init_tracing(daemon);
    // A client command makes a few requests in a row: on one thread, none of them waits for
    // another thread to be scheduled (which on a busy node costs more than the request).
    let runtime = if daemon {
        tokio::runtime::Builder::new_multi_thread()
    } else {
        tokio::runtime::Builder::new_current_thread()
    }
    .enable_all()
    .build();
    let runtime = match runtime {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            std::process::exit(1);
        }
    };
    let socket = config::socket(cli.socket.as_deref());
    let result = runtime.block_on(async move {
        match cli.command {
            Command::Submit(a) => cmd::submit::run(&socket, *a).await,
            Command::Run(a) => cmd::run::run(&socket, *a).await,
            Command::Queue(a) => cmd::queue::run(&socket, a).await,
            Command::Show(a) => cmd::show::run(&socket, a).await,
            Command::Eff(a) => cmd::eff::run(&socket, a).await,
            Command::Acct(a) => cmd::acct::run(&socket, a).await,
            Command::Report(a) => cmd::report::run(&socket, a).await,
            Command::Step(a) => cmd::step::run(a).await,
            Command::Srun(a) => {
                let env = |k: &str| std::env::var(k).ok();
                match cmd::srun::plan(a, &env)? {
                    cmd::srun::Plan::Step(a) => cmd::step::run(*a).await,
                    cmd::srun::Plan::Run(words) => {
                        let argv = std::iter::once("wharf".to_string()).chain(words);
                        match Cli::try_parse_from(argv)?.command {
                            Command::Run(a) => cmd::run::run(&socket, *a).await,
                            _ => unreachable!("srun's plan is a run"),
                        }
                    }
                }
            }
            Command::Cancel(a) => cmd::cancel::run(&socket, a).await,
            Command::Requeue(a) => cmd::requeue::run(&socket, a).await,
            Command::Hold(a) => cmd::hold::run(&socket, a, false).await,
            Command::Release(a) => cmd::hold::run(&socket, a, true).await,
            Command::Update(a) => cmd::update::run(&socket, a).await,
            Command::Nodes(a) => cmd::nodes::run(&socket, a).await,
            Command::Sinfo(a) => cmd::sinfo::run(&socket, a).await,
            Command::Share(a) => cmd::share::run(&socket, a).await,
            Command::Admin(c) => cmd::admin::run(&socket, c).await,
            Command::Image(c) => cmd::image::run(&socket, c).await,
            Command::Controller(a) => cmd::controller::run(a, cli.socket.as_deref()).await,
            Command::Agent(a) => cmd::agent::run(a).await,
            Command::Dev(a) => cmd::dev::run(a, cli.socket.as_deref()).await,
            Command::Shim(_) => unreachable!("handled before the runtime starts"),
        }
    });
    match result {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("error: {}", output::clean(&format!("{e:#}")));
            std::process::exit(1);
        }
    }
}

fn init_tracing(daemon: bool) {
    let default = if daemon { "info" } else { "warn" };
    let filter = tracing_subscriber::EnvFilter::try_from_env("WHARF_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // Colour only on a terminal: logs redirected to files stay plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(false)
        .init();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn called(argv: &[&str]) -> Vec<String> {
        let argv = argv.iter().map(std::ffi::OsString::from).collect();
        (as_called(argv).into_iter())
            .map(|a| a.into_string().unwrap())
            .collect()
    }

    #[test]
    fn slurms_command_names_are_their_commands() {
        assert_eq!(
            called(&["/usr/local/bin/sbatch", "-p", "gpu", "job.sh"]),
            ["wharf", "submit", "-p", "gpu", "job.sh"]
        );
        assert_eq!(
            called(&["sprio", "--me"]),
            ["wharf", "queue", "--priority", "--me"]
        );
        assert_eq!(called(&["srun", "-N2", "x"]), ["wharf", "srun", "-N2", "x"]);
        assert_eq!(called(&["wharf", "queue"]), ["wharf", "queue"]);
        assert_eq!(called(&["squeue-old", "-h"]), ["squeue-old", "-h"]);
        // Each parses as the command it names.
        for (name, _) in SLURM_NAMES {
            let argv: Vec<String> = called(&[name, "--help"]);
            let e = Cli::try_parse_from(argv).unwrap_err();
            assert_eq!(e.kind(), clap::error::ErrorKind::DisplayHelp, "{name}");
        }
        let cli = Cli::try_parse_from(called(&["squeue", "-h", "-u", "0"])).unwrap();
        assert!(matches!(cli.command, Command::Queue(_)));
        let cli = Cli::try_parse_from(called(&["sacct", "-X", "-P", "-j", "12"])).unwrap();
        assert!(matches!(cli.command, Command::Acct(_)));
        let cli = Cli::try_parse_from(called(&["sinfo", "-h", "-N", "-p", "gpu"])).unwrap();
        assert!(matches!(cli.command, Command::Sinfo(_)));
    }
}
