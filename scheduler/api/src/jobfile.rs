//! Job files: TOML (`job.toml`) or a shell script whose leading `#WHARF` lines carry options
//! (`#SBATCH` lines too, so that a Slurm batch script keeps its options).
//!
//! ```text
//! #!/bin/sh
//! #WHARF --cpus=2 --mem=4G --time=30m
//! #WHARF --image=pytorch
//! python train.py
//! ```
//!
//! Errors name the file's line and the field, and nothing is submitted when any is found.

use crate::job::JobRequest;
use crate::resources::{parse_memory, parse_memory_or_whole, parse_time_limit};

/// A job file could not be read; `line` is 1-based when known.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}{}: {message}", line.map(|l| format!(" line {l}")).unwrap_or_default())]
pub struct JobFileError {
    /// File name as the user gave it.
    pub file: String,
    /// 1-based line, when the problem has one.
    pub line: Option<usize>,
    /// What is wrong, naming the field.
    pub message: String,
}

/// Largest job file accepted.
pub const MAX_JOB_FILE: usize = 256 * 1024;

/// Parses a job file. A file whose first line starts with `#!` or whose name does not end in
/// `.toml` is a script; otherwise TOML.
pub fn parse_job_file(file: &str, text: &str) -> Result<JobRequest, JobFileError> {
    let err = |line, message: String| JobFileError {
        file: file.to_string(),
        line,
        message,
    };
    if text.len() > MAX_JOB_FILE {
        return Err(err(
            None,
            format!("is {} bytes; the limit is {MAX_JOB_FILE}", text.len()),
        ));
    }
    if file.ends_with(".toml") && !text.starts_with("#!") {
        return toml::from_str::<JobRequest>(text).map_err(|e| {
            let line = e
                .span()
                .map(|s| text[..s.start.min(text.len())].lines().count().max(1));
            let line = line.map(|l| {
                // A span that starts right after a newline belongs to the next line.
                if e.span()
                    .is_some_and(|s| text[..s.start.min(text.len())].ends_with('\n'))
                {
                    l + 1
                } else {
                    l
                }
            });
            err(line, e.message().to_string())
        });
    }
    parse_script(file, text)
}

/// Parses `#WHARF` (or `#SBATCH`) directives at the top of a script (before the first command
/// line), like sbatch does. The script itself becomes the job's `script`. A script with
/// `#SBATCH` lines is a Slurm batch script: it runs once, as sbatch runs it
/// ([`JobRequest::once`]), unless it says `--every-task`.
pub fn parse_script(file: &str, text: &str) -> Result<JobRequest, JobFileError> {
    let mut req = JobRequest::default();
    let mut sbatch = false;
    for (i, line) in text.lines().enumerate() {
        let trimmed = line.trim();
        let directive = trimmed
            .strip_prefix("#WHARF")
            .or_else(|| trimmed.strip_prefix("#SBATCH"));
        if trimmed.is_empty() || (trimmed.starts_with('#') && directive.is_none()) {
            continue;
        }
        let Some(rest) = directive else {
            break; // first command: directives end here
        };
        sbatch |= trimmed.starts_with("#SBATCH");
        let words = split_words(rest).map_err(|m| JobFileError {
            file: file.into(),
            line: Some(i + 1),
            message: m,
        })?;
        apply_words(&mut req, &words).map_err(|m| JobFileError {
            file: file.into(),
            line: Some(i + 1),
            message: m,
        })?;
    }
    if req.command.is_some() {
        return Err(JobFileError {
            file: file.into(),
            line: None,
            message: "a script cannot also set `command`".into(),
        });
    }
    req.script = Some(text.to_string());
    if sbatch && req.once.is_none() {
        req.once = Some(true);
    }
    if req.name.is_none() {
        req.name = Some(file.rsplit('/').next().unwrap_or(file).to_string());
    }
    Ok(req)
}

/// Splits a directive into words, honouring single and double quotes.
fn split_words(text: &str) -> Result<Vec<String>, String> {
    let mut words = Vec::new();
    let mut cur = String::new();
    let mut in_word = false;
    let mut quote: Option<char> = None;
    for c in text.chars() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => cur.push(c),
            (None, '"' | '\'') => {
                quote = Some(c);
                in_word = true;
            }
            (None, c) if c.is_whitespace() => {
                if in_word {
                    words.push(std::mem::take(&mut cur));
                    in_word = false;
                }
            }
            (None, '#') if !in_word => break, // trailing comment
            (None, c) => {
                cur.push(c);
                in_word = true;
            }
        }
    }
    if quote.is_some() {
        return Err("unterminated quote".into());
    }
    if in_word {
        words.push(cur);
    }
    Ok(words)
}

/// Applies command-line style words (`--mem=4G`, `--cpus 2`, `-c 2`) to a request.
pub fn apply_words(req: &mut JobRequest, words: &[String]) -> Result<(), String> {
    let mut i = 0;
    while i < words.len() {
        let w = &words[i];
        let (key, inline) = if let Some(long) = w.strip_prefix("--") {
            match long.split_once('=') {
                Some((k, v)) => (k.to_string(), Some(v.to_string())),
                None => (long.to_string(), None),
            }
        } else if let Some(short) = w.strip_prefix('-').filter(|s| !s.is_empty()) {
            // One character, which may take several bytes.
            let first = short.chars().next().map_or(0, char::len_utf8);
            let (k, v) = short.split_at(first);
            (k.to_string(), (!v.is_empty()).then(|| v.to_string()))
        } else {
            return Err(format!("expected an option like --cpus=2, found {w:?}"));
        };
        let value = match inline {
            Some(v) => v,
            // A switch: `--rdma` alone means yes.
            None if BOOLEAN_OPTIONS.contains(&key.as_str())
                && words.get(i + 1).is_none_or(|w| w.starts_with('-')) =>
            {
                "yes".into()
            }
            // sbatch's switches take a value only after `=` (`--get-user-env=10L`).
            None if SBATCH_SWITCHES.contains(&key.as_str()) => String::new(),
            None => {
                i += 1;
                match words.get(i) {
                    Some(v) => v.clone(),
                    // An option this does not know is said to be unknown, not short of a
                    // value: tried on a scratch request, it says which.
                    None => {
                        return Err(match set_option(&mut JobRequest::default(), &key, "") {
                            Err(e) if e.starts_with("unknown option") => e,
                            _ => format!("option --{key} needs a value"),
                        })
                    }
                }
            }
        };
        set_option(req, &key, &value)?;
        i += 1;
    }
    Ok(())
}

/// Whether one word after `gpu:` is meant as a count: it starts with a digit or a sign, and
/// is not a MIG profile (`1g.10gb`: a dot and letters), the only types that start with a
/// digit. `1.5` and `2x` are counts, and refused as such.
fn looks_like_count(word: &str) -> bool {
    let w = word.trim();
    let profile = w.contains('.') && w.contains(|c: char| c.is_ascii_alphabetic());
    w.starts_with(|c: char| c.is_ascii_digit() || c == '-' || c == '+') && !profile
}

/// A GPU count: digits only (no sign), as in `--gpus 2` or `h100:2`; 0 asks for none (and a
/// type with it is refused when the job is checked).
fn gpu_count(key: &str, count: &str, value: &str) -> Result<u32, String> {
    let c = count.trim();
    c.bytes()
        .all(|b| b.is_ascii_digit())
        .then(|| c.parse::<u32>().ok())
        .flatten()
        .ok_or_else(|| {
            let whole = if c == value.trim() {
                String::new()
            } else {
                format!(" {value:?}")
            };
            format!(
                "invalid count {c:?} in --{key}{whole}: a count is a whole number \
                 (COUNT or TYPE:COUNT, e.g. h100:2)"
            )
        })
}

/// A GPU type's name: letters, digits, `_`, `-` and `.`, starting with a letter or digit.
fn is_gpu_type(kind: &str) -> bool {
    kind.starts_with(|c: char| c.is_ascii_alphanumeric())
        && kind
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c))
}

/// Checks the host list given as `--{key}`; returns it as written.
fn host_list(key: &str, value: &str) -> Result<String, String> {
    crate::hostlist::HostList::parse(value).map_err(|e| format!("--{key}: {e}"))?;
    Ok(value.trim().to_string())
}

fn yes_no(key: &str, value: &str) -> Result<bool, String> {
    match value.trim().to_ascii_lowercase().as_str() {
        "yes" | "true" | "1" => Ok(true),
        "no" | "false" | "0" => Ok(false),
        _ => Err(format!("--{key} expects yes or no, found {value:?}")),
    }
}

/// Options that are switches: given alone they mean yes.
const BOOLEAN_OPTIONS: [&str; 10] = [
    "rdma",
    "remap-root",
    "writable",
    "hold",
    "H",
    "exclusive",
    "requeue",
    "no-requeue",
    "once",
    "every-task",
];

/// sbatch's options that are switches: given alone, they take no value (any comes after `=`).
const SBATCH_SWITCHES: [&str; 11] = [
    "parsable",
    "wait",
    "W",
    "verbose",
    "v",
    "quiet",
    "Q",
    "get-user-env",
    "propagate",
    "oversubscribe",
    "s",
];

/// sbatch's options that Wharf accepts but cannot honour, with why; `wharf submit` warns of
/// those a job gave, once (see README.md, "Slurm batch scripts").
fn ignored_option(key: &str) -> Option<(&'static str, &'static str)> {
    Some(match key {
        "mail-type" => ("mail-type", "Wharf sends no mail"),
        "mail-user" => ("mail-user", "Wharf sends no mail"),
        "signal" => (
            "signal",
            "at its time limit a job gets SIGTERM, then SIGKILL after the grace period",
        ),
        "comment" => ("comment", "jobs keep no comment"),
        "hint" => ("hint", "CPUs are placed by Wharf's own rules"),
        "reservation" => ("reservation", "Wharf has no reservations"),
        "time-min" => ("time-min", "the job keeps its --time"),
        "tmp" => (
            "tmp",
            "a job's /tmp is a private tmpfs of the node's [agent] tmp_size",
        ),
        "get-user-env" => (
            "get-user-env",
            "the job gets no login environment; set variables with --env",
        ),
        "propagate" => ("propagate", "the node's resource limits apply"),
        "verbose" | "v" => ("verbose", "it changes nothing"),
        "quiet" | "Q" => ("quiet", "it changes nothing"),
        "kill-on-invalid-dep" => (
            "kill-on-invalid-dep",
            "the cluster's [scheduler] kill_invalid_dependency decides",
        ),
        "oversubscribe" | "s" => ("oversubscribe", "a job's CPUs, memory and GPUs are its own"),
        "profile" => ("profile", "usage is sampled by the nodes"),
        "acctg-freq" => ("acctg-freq", "usage is sampled by the nodes"),
        _ => return None,
    })
}

/// Notes an option that is accepted but not honoured, once per option.
fn ignore(req: &mut JobRequest, name: &str, why: &str) {
    let note = format!("--{name} ({why})");
    if !req.ignored.contains(&note) {
        req.ignored.push(note);
    }
}

/// `--export`: Wharf gives a job no variable of the submitting shell, only those of its node
/// and its own `--env` (as sbatch's `--export=NONE`), so `NONE` and `NIL` ask for what it does
/// and `NAME=VALUE` entries are set as `--env` would; `ALL` and bare names cannot be honoured.
fn export(req: &mut JobRequest, value: &str) -> Result<(), String> {
    let mut not_passed = Vec::new();
    for entry in value.split(',').map(str::trim) {
        match entry {
            "" => return Err(format!("--export: an empty entry in {value:?}")),
            e if e.eq_ignore_ascii_case("NONE") || e.eq_ignore_ascii_case("NIL") => {}
            _ => match entry.split_once('=') {
                Some((k, v)) if !k.is_empty() => {
                    req.env.insert(k.to_string(), v.to_string());
                }
                Some(_) => return Err(format!("--export: {entry:?} names no variable")),
                None => not_passed.push(entry),
            },
        }
    }
    if !not_passed.is_empty() {
        ignore(
            req,
            &format!("export={}", not_passed.join(",")),
            "a job gets no variable of the submitting shell; set them with --env NAME=VALUE",
        );
    }
    Ok(())
}

/// Sets one option by its long or short name. The names match `wharf submit --help`; sbatch's
/// options that Wharf has no use for are noted in `req.ignored`, or refused when leaving them
/// out would change what the job computes.
pub fn set_option(req: &mut JobRequest, key: &str, value: &str) -> Result<(), String> {
    let num = |what: &str| -> Result<u32, String> {
        value
            .trim()
            .parse::<u32>()
            .map_err(|_| format!("--{what} expects a whole number, found {value:?}"))
    };
    match key {
        "J" | "job-name" | "name" => req.name = Some(value.to_string()),
        "image" | "container-image" => req.image = Some(value.to_string()),
        "c" | "cpus" | "cpus-per-task" => req.cpus = Some(num("cpus")?),
        "mem" | "memory" => {
            req.memory = Some(parse_memory_or_whole(value).map_err(|e| format!("--mem: {e}"))?)
        }
        "mem-per-cpu" => {
            req.mem_per_cpu = Some(parse_memory(value).map_err(|e| format!("--mem-per-cpu: {e}"))?)
        }
        "mem-per-gpu" => {
            req.mem_per_gpu = Some(parse_memory(value).map_err(|e| format!("--mem-per-gpu: {e}"))?)
        }
        // `2`, `h100:2` (Slurm's --gpus: the job's, and --gpus-per-node: each node's), or
        // `gpu:h100:2` / `gpu:2` (Slurm's --gres, per node, where the count defaults to 1:
        // `gpu`, `gpu:h100`).
        "G" | "gpus" | "gres" | "gpus-per-node" => {
            let v = value.trim();
            let (kind, count) = if key == "gres" {
                let rest = match v {
                    "gpu" => "1",
                    _ => v.strip_prefix("gpu:").ok_or_else(|| {
                        format!("--gres supports GPUs only: write gpu, gpu:COUNT, gpu:TYPE or gpu:TYPE:COUNT, found {value:?}")
                    })?,
                };
                match rest.rsplit_once(':') {
                    Some((k, c)) => (Some(k), c),
                    // One word is a count or a type (whose count is 1): one that starts
                    // like a number and is no MIG profile (`1g.10gb`) is a count, and must be
                    // a good one (`gpu:-1`, `gpu:2x`).
                    None if looks_like_count(rest) => (None, rest),
                    // `gpu:` names neither: the type check below refuses it.
                    None => (Some(rest), "1"),
                }
            } else {
                match v.rsplit_once(':') {
                    Some((k, c)) => (Some(k), c),
                    None => (None, v),
                }
            };
            let count = gpu_count(key, count, value)?;
            if let Some(k) = kind.filter(|k| !is_gpu_type(k.trim())) {
                return Err(format!(
                    "--{key}: {k:?} is not a GPU type (letters, digits, '_', '-' and '.'; \
                     write TYPE:COUNT, e.g. h100:2)"
                ));
            }
            // The same option given again replaces itself, type and all (the last line wins,
            // as in Slurm); `--gpus h100:8 --gpus-per-node 4` keeps the type the other gave,
            // and two types across the two are refused.
            let total = matches!(key, "G" | "gpus");
            let (again, other) = if total {
                (req.gpus_total.is_some(), req.gpus.is_some())
            } else {
                (req.gpus.is_some(), req.gpus_total.is_some())
            };
            if again && !other {
                req.gpu_type = None;
            }
            if total {
                req.gpus_total = Some(count);
            } else {
                req.gpus = Some(count);
            }
            if let Some(k) = kind.map(|k| k.trim().to_ascii_lowercase()) {
                match &req.gpu_type {
                    Some(t) if *t != k => {
                        return Err(format!(
                            "--{key} asks for {k} GPUs but another option asked for {t}; \
                             a job's GPUs are of one type"
                        ))
                    }
                    _ => req.gpu_type = Some(k),
                }
            }
        }
        "t" | "time" => {
            req.time = Some(parse_time_limit(value).map_err(|e| format!("--time: {e}"))?)
        }
        "N" | "nodes" => req.nodes = Some(num("nodes")?),
        "n" | "ntasks" => req.ntasks = Some(num("ntasks")?),
        "ntasks-per-node" => req.ntasks_per_node = Some(num("ntasks-per-node")?),
        "gpus-per-task" => req.gpus_per_task = Some(num("gpus-per-task")?),
        "p" | "partition" => req.partition = Some(value.trim().to_string()),
        "A" | "account" => req.account = Some(value.trim().to_string()),
        "q" | "qos" => req.qos = Some(value.trim().to_string()),
        "nice" => {
            req.nice = Some(
                value
                    .trim()
                    .parse::<i32>()
                    .map_err(|_| format!("--nice expects a whole number, found {value:?}"))?,
            )
        }
        "b" | "begin" => req.begin = Some(crate::forms::parse_begin(value)?),
        "a" | "array" => req.array = Some(crate::array::parse_array(value)?),
        "d" | "dependency" => req.dependency = Some(crate::dependency::parse_dependency(value)?),
        "H" | "hold" => req.hold = Some(yes_no(key, value)?),
        "C" | "constraint" => {
            crate::features::Constraint::parse(value)?;
            req.constraint = Some(value.trim().to_string());
        }
        "w" | "nodelist" => req.nodelist = Some(host_list("nodelist", value)?),
        "x" | "exclude" => req.exclude = Some(host_list("exclude", value)?),
        "exclusive" => req.exclusive = Some(yes_no(key, value)?),
        "requeue" => req.requeue = Some(yes_no(key, value)?),
        "no-requeue" => req.requeue = Some(!yes_no(key, value)?),
        "once" | "every-task" => {
            let once = yes_no(key, value)? == (key == "once");
            if req.once.is_some_and(|o| o != once) {
                return Err(format!(
                    "--{key}: the job already says the other (--once and --every-task are one \
                     choice)"
                ));
            }
            req.once = Some(once);
        }
        "D" | "chdir" | "workdir" => req.workdir = Some(value.to_string()),
        "o" | "output" => req.output = Some(value.to_string()),
        "e" | "error" => req.error = Some(value.to_string()),
        "env" => {
            let (k, v) = value
                .split_once('=')
                .ok_or_else(|| format!("--env expects NAME=VALUE, found {value:?}"))?;
            req.env.insert(k.to_string(), v.to_string());
        }
        "rdma" => req.rdma = Some(yes_no(key, value)?),
        "remap-root" => req.remap_root = Some(yes_no(key, value)?),
        "writable" | "writable-tmpfs" => req.writable = Some(yes_no(key, value)?),
        "mount" => req.mounts.push(value.to_string()),
        "memlock" => {
            req.memlock = Some(crate::job::parse_memlock(value).map_err(|e| format!("--{e}"))?)
        }
        "export" => export(req, value)?,
        "parsable" => req.parsable = true,
        "W" | "wait" => req.wait = true,
        "open-mode" => match value.trim() {
            "truncate" => {}
            "append" => {
                return Err(
                    "--open-mode=append: Wharf starts a job's output file empty (a requeued \
                     job appends to it); give each job a file of its own (-o out-%j.txt) or \
                     leave the line out"
                        .into(),
                )
            }
            _ => {
                return Err(format!(
                    "--open-mode expects append or truncate, found {value:?}"
                ))
            }
        },
        other => match ignored_option(other) {
            Some((name, why)) => ignore(req, name, why),
            None => {
                return Err(format!(
                    "unknown option --{other}; see `wharf submit --help`"
                ))
            }
        },
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A Slurm batch script runs once, as sbatch runs it; a Wharf one in every task, as srun
    /// runs a command; either says otherwise with `--every-task` or `--once`.
    #[test]
    fn a_script_with_sbatch_lines_runs_once_unless_it_says_every_task() {
        let once = |text: &str| parse_job_file("s.sh", text).unwrap().once;
        assert_eq!(once("#!/bin/sh\n#SBATCH -N 2\nsrun hostname\n"), Some(true));
        assert_eq!(once("#!/bin/sh\n#WHARF -N 2\nhostname\n"), None);
        assert_eq!(once("#!/bin/sh\nhostname\n"), None);
        assert_eq!(
            once("#!/bin/sh\n#SBATCH -N 2\n#WHARF --every-task\nhostname\n"),
            Some(false)
        );
        assert_eq!(once("#!/bin/sh\n#WHARF --once\nsrun x\n"), Some(true));
        // Both in one job's lines: refused, as the CLI refuses both flags.
        let both = parse_job_file("s.sh", "#SBATCH --once\n#SBATCH --every-task\nx\n");
        assert!(both.unwrap_err().message.contains("one choice"));
        // A flag on the command line wins over the script's lines.
        let mut flags = JobRequest::default();
        set_option(&mut flags, "every-task", "yes").unwrap();
        let script = parse_job_file("s.sh", "#SBATCH -n 4\nsrun x\n").unwrap();
        assert_eq!(script.overlay(flags).once, Some(false));
        // Resolved: the spec runs once only when asked.
        let spec = |once| {
            let req = JobRequest {
                command: Some(vec!["true".into()]),
                once,
                ..Default::default()
            };
            req.resolve("/", &crate::JobDefaults::default())
                .unwrap()
                .once
        };
        assert!(spec(Some(true)) && !spec(None) && !spec(Some(false)));
    }

    #[test]
    fn no_requeue_from_directives_job_files_and_flags() {
        let req = parse_job_file("r.sh", "#WHARF --no-requeue\necho\n").unwrap();
        assert_eq!(req.requeue, Some(false));
        let req = parse_job_file("j.toml", "command = [\"x\"]\nrequeue = false\n").unwrap();
        assert_eq!(req.requeue, Some(false));
        let mut req = JobRequest::default();
        set_option(&mut req, "requeue", "yes").unwrap();
        assert_eq!(req.requeue, Some(true));
        assert!(set_option(&mut req, "no-requeue", "maybe").is_err());
    }

    #[test]
    fn mem_zero_asks_for_all_of_each_nodes_memory() {
        for line in ["--mem=0", "--mem=0G", "--mem 0M"] {
            let text = format!("#!/bin/sh\n#SBATCH {line}\ntrue\n");
            let req = parse_job_file("s.sh", &text).unwrap();
            assert_eq!(req.memory, Some(0), "{line}");
            let spec = req.resolve("/tmp", &crate::JobDefaults::default()).unwrap();
            assert!(spec.memory_whole && !spec.memory_defaulted, "{line}");
            assert_eq!(spec.resources.memory, crate::job::MIN_MEMORY);
        }
        let toml = parse_job_file("j.toml", "command = [\"x\"]\nmemory = 0\n").unwrap();
        assert_eq!(toml.memory, Some(0));
        // Per CPU, zero is still refused, and a size is a size.
        assert!(parse_job_file("s.sh", "#SBATCH --mem-per-cpu=0\n").is_err());
        let sized = parse_job_file("s.sh", "#SBATCH --mem=2G\n").unwrap();
        let spec = sized
            .resolve("/tmp", &crate::JobDefaults::default())
            .unwrap();
        assert!(!spec.memory_whole);
        assert!(parse_job_file("s.sh", "#SBATCH --mem=.\n").is_err());
    }

    #[test]
    fn memory_per_cpu_and_per_gpu_from_sbatch_lines_and_toml() {
        let req = parse_job_file("s.sh", "#!/bin/sh\n#SBATCH --mem-per-cpu=2G\ntrue\n").unwrap();
        assert_eq!((req.memory, req.mem_per_cpu), (None, Some(2 << 30)));
        let req = parse_job_file("s.sh", "#!/bin/sh\n#WHARF --mem-per-gpu 40G\ntrue\n").unwrap();
        assert_eq!(req.mem_per_gpu, Some(40 << 30));
        let text = "command = [\"x\"]\nmem_per_cpu = \"512M\"\n";
        assert_eq!(
            parse_job_file("j.toml", text).unwrap().mem_per_cpu,
            Some(512 << 20)
        );
        let e = parse_job_file("s.sh", "#SBATCH --mem-per-cpu=lots\n").unwrap_err();
        assert!(e.to_string().contains("line 1: --mem-per-cpu"), "{e}");
    }

    #[test]
    fn sbatch_options_wharf_cannot_honour_are_accepted_and_noted_once() {
        let text = "#!/bin/bash\n\
            #SBATCH --mail-type=END,FAIL --mail-user me@lab.org --signal=B:USR1@60\n\
            #SBATCH --open-mode=truncate --comment 'a run' --hint=nomultithread\n\
            #SBATCH --reservation=course --time-min=10 --tmp=10G --get-user-env\n\
            #SBATCH --propagate=STACK --verbose -v --quiet --requeue --no-requeue\n\
            #SBATCH --kill-on-invalid-dep=yes --oversubscribe --profile=task --acctg-freq=30\n\
            #SBATCH --export=NONE --mail-type=BEGIN --parsable\n\
            #SBATCH --cpus-per-task=2\ntrue\n";
        let req = parse_job_file("s.sh", text).unwrap();
        assert_eq!((req.cpus, req.requeue), (Some(2), Some(false)));
        assert!(req.parsable && !req.wait);
        let names: Vec<&str> = req
            .ignored
            .iter()
            .map(|n| n.split(' ').next().unwrap())
            .collect();
        assert_eq!(
            names,
            [
                "--mail-type",
                "--mail-user",
                "--signal",
                "--comment",
                "--hint",
                "--reservation",
                "--time-min",
                "--tmp",
                "--get-user-env",
                "--propagate",
                "--verbose",
                "--quiet",
                "--kill-on-invalid-dep",
                "--oversubscribe",
                "--profile",
                "--acctg-freq",
            ]
        );
        assert!(
            req.ignored[0].contains("sends no mail"),
            "{:?}",
            req.ignored
        );
        // Honoured in part: variables given a value are set; the submitting shell's are not
        // passed, which is said.
        let req = parse_job_file("s.sh", "#SBATCH --export=ALL,A=1,B=x=y -W\ntrue\n").unwrap();
        assert_eq!(req.env["A"], "1");
        assert_eq!(req.env["B"], "x=y");
        assert!(req.wait);
        assert_eq!(req.ignored.len(), 1);
        assert!(
            req.ignored[0].starts_with("--export=ALL ("),
            "{:?}",
            req.ignored
        );
        assert!(parse_job_file("s.sh", "#SBATCH --export=NONE\ntrue\n")
            .unwrap()
            .ignored
            .is_empty());
        // Refused where leaving it out would change what the job does, saying what to do.
        let e = parse_job_file("s.sh", "#SBATCH --open-mode=append\ntrue\n").unwrap_err();
        assert!(e.message.contains("-o out-%j.txt"), "{e}");
        let e = parse_job_file("s.sh", "#SBATCH --open-mode=sometimes\ntrue\n").unwrap_err();
        assert!(e.message.contains("append or truncate"), "{e}");
        let e = parse_job_file("s.sh", "#SBATCH --export=,A=1\ntrue\n").unwrap_err();
        assert!(e.message.contains("empty entry"), "{e}");
    }

    #[test]
    fn gpu_counts_are_whole_numbers_and_types_look_like_types() {
        for (key, value, says) in [
            ("gres", "gpu:-1", "invalid count \"-1\" in --gres"),
            ("gres", "gpu:+2", "invalid count \"+2\" in --gres"),
            ("gres", "gpu:2x", "invalid count \"2x\" in --gres"),
            ("gres", "gpu:1.5", "invalid count \"1.5\" in --gres"),
            ("gres", "gpu:h100:1.5", "invalid count \"1.5\" in --gres"),
            ("gres", "gpu:h100:-1", "invalid count \"-1\" in --gres"),
            ("gres", "gpu:h100:x", "invalid count \"x\" in --gres"),
            ("gpus", "h100:-1", "invalid count \"-1\" in --gpus"),
            ("gpus", "0x", "invalid count \"0x\" in --gpus"),
            ("gpus", "+1", "invalid count \"+1\" in --gpus"),
            (
                "gpus-per-node",
                "h100:",
                "invalid count \"\" in --gpus-per-node",
            ),
            ("gpus", "h1 00:2", "\"h1 00\" is not a GPU type"),
            ("gpus", "-h100:2", "\"-h100\" is not a GPU type"),
            ("gres", "gpu:h/100", "\"h/100\" is not a GPU type"),
        ] {
            let e = set_option(&mut JobRequest::default(), key, value).unwrap_err();
            assert!(e.contains(says), "{key} {value}: {e}");
        }
        for (key, value, gpus, kind) in [
            ("gres", "gpu:1g.10gb", Some(1), Some("1g.10gb")),
            ("gres", "gpu:rtx_a6000:2", Some(2), Some("rtx_a6000")),
            ("gres", "gpu:4", Some(4), None),
            ("gpus-per-node", "mi300x:8", Some(8), Some("mi300x")),
        ] {
            let mut req = JobRequest::default();
            set_option(&mut req, key, value).unwrap();
            assert_eq!((req.gpus, req.gpu_type.as_deref()), (gpus, kind), "{value}");
        }
    }

    #[test]
    fn toml_job() {
        let text = "name = \"t\"\nimage = \"host\"\ncommand = [\"echo\", \"hi\"]\nmemory = \"2G\"\ntime = \"10m\"\n[env]\nA = \"b\"\n";
        let req = parse_job_file("job.toml", text).unwrap();
        assert_eq!(req.memory, Some(2 << 30));
        assert_eq!(req.time, Some(600));
        assert_eq!(req.env["A"], "b");
    }

    #[test]
    fn toml_errors_name_line_and_field() {
        let text = "name = \"t\"\ncommand = [\"x\"]\nmemory = \"12XB\"\n";
        let e = parse_job_file("job.toml", text).unwrap_err();
        assert_eq!(e.line, Some(3), "{e}");
        assert!(e.message.contains("unknown memory unit"), "{e}");
        let e = parse_job_file("job.toml", "command = [\"x\"]\ncpu = 2\n").unwrap_err();
        assert_eq!(e.line, Some(2), "{e}");
        assert!(e.message.contains("unknown field `cpu`"), "{e}");
        let e = parse_job_file("job.toml", "command = [\"x\"]\ncpus = -1\n").unwrap_err();
        assert_eq!(e.line, Some(2), "{e}");
        // A quantity that is neither a whole number nor text says what it was.
        for (value, want) in [
            ("-5", "-5 is negative"),
            ("1e3", "1000 is not a whole number"),
            (
                "true",
                "invalid type: boolean `true`, expected a whole number, or text",
            ),
        ] {
            let text = format!("command = [\"x\"]\ntime = {value}\n");
            let e = parse_job_file("job.toml", &text).unwrap_err();
            assert_eq!(e.line, Some(2), "{e}");
            assert!(e.message.contains(want), "{value}: {e}");
        }
        let ok = parse_job_file(
            "job.toml",
            "command = [\"x\"]\ntime = 90\nmemory = \"1G\"\n",
        );
        let ok = ok.unwrap();
        assert_eq!((ok.time, ok.memory), (Some(90), Some(1 << 30)));
    }

    #[test]
    fn script_directives() {
        let text = "#!/bin/sh\n# plain comment\n#WHARF --cpus=2 --mem 4G\n#WHARF -t 30 --job-name 'my job'\necho hi\n#WHARF --cpus=8\n";
        let req = parse_job_file("train.sh", text).unwrap();
        assert_eq!(
            parse_job_file("r.sh", "#WHARF --rdma --memlock=unlimited\n")
                .unwrap()
                .rdma,
            Some(true)
        );
        assert_eq!(
            parse_job_file("r.sh", "#WHARF --rdma=no\n").unwrap().rdma,
            Some(false)
        );
        assert_eq!(
            parse_job_file("r.sh", "#WHARF --memlock 1G\n")
                .unwrap()
                .memlock,
            Some(1 << 30)
        );
        assert_eq!(
            parse_job_file("r.sh", "#WHARF --memlock unlimited\n")
                .unwrap()
                .memlock,
            Some(u64::MAX)
        );
        assert!(parse_job_file("r.sh", "#WHARF --rdma=maybe\n").is_err());
        assert_eq!(req.cpus, Some(2));
        assert_eq!(req.memory, Some(4 << 30));
        assert_eq!(req.time, Some(1800));
        assert_eq!(req.name.as_deref(), Some("my job"));
        assert_eq!(req.script.as_deref(), Some(text));
    }

    #[test]
    fn node_selection_from_sbatch_and_wharf_lines() {
        let text =
            "#!/bin/sh\n#SBATCH -C 'ib&nvme' --exclusive\n#WHARF -w gpu[01-02] -x gpu02\ntrue\n";
        let req = parse_job_file("s.sh", text).unwrap();
        assert_eq!(req.constraint.as_deref(), Some("ib&nvme"));
        assert_eq!(req.exclusive, Some(true));
        assert_eq!(req.nodelist.as_deref(), Some("gpu[01-02]"));
        assert_eq!(req.exclude.as_deref(), Some("gpu02"));
        let e = parse_job_file("s.sh", "#SBATCH --constraint='ib&'\n").unwrap_err();
        assert_eq!(e.line, Some(1));
        assert!(e.message.contains("no feature on one side"), "{e}");
        let e = parse_job_file("s.sh", "#!/bin/sh\n#SBATCH --nodelist n[1-\n").unwrap_err();
        assert!(
            e.to_string().contains("line 2: --nodelist: host list"),
            "{e}"
        );
        let toml =
            "command = [\"true\"]\nconstraint = \"ib\"\nnodelist = \"n[1-2]\"\nexclusive = true\n";
        let req = parse_job_file("j.toml", toml).unwrap();
        assert_eq!(req.nodelist.as_deref(), Some("n[1-2]"));
        let spec = req.resolve("/tmp", &crate::JobDefaults::default()).unwrap();
        assert_eq!(spec.nodelist.names(), ["n1", "n2"]);
        assert_eq!(spec.constraint.unwrap().to_string(), "ib");
        assert!(spec.exclusive);
    }

    #[test]
    fn gang_shapes_from_sbatch_wharf_lines_and_toml() {
        let text = "#!/bin/sh\n#SBATCH -N 2 --ntasks-per-node=1 -n 2\n\
                    #WHARF --gpus-per-node=h100:4 --cpus-per-task 8\ntrue\n";
        let req = parse_job_file("g.sh", text).unwrap();
        assert_eq!(
            (req.nodes, req.ntasks, req.ntasks_per_node),
            (Some(2), Some(2), Some(1))
        );
        assert_eq!((req.gpus, req.gpu_type.as_deref()), (Some(4), Some("h100")));
        let spec = req.resolve("/tmp", &crate::JobDefaults::default()).unwrap();
        assert_eq!((spec.nodes, spec.resources.cpus), (2, 8));
        assert!(!spec.rdma, "RDMA is required only when asked for");
        let toml = "command = [\"true\"]\nnodes = 3\ngpus_per_node = 2\ncpus_per_task = 4\n";
        let spec = parse_job_file("j.toml", toml)
            .unwrap()
            .resolve("/tmp", &crate::JobDefaults::default())
            .unwrap();
        assert_eq!(
            (spec.nodes, spec.resources.gpus, spec.resources.cpus),
            (3, 2, 4)
        );
        for (lines, says) in [
            ("-N 0", "`nodes` = 0: ask for 1 to"),
            (
                "-N 2 -n 3",
                "`ntasks` = 3 but the job has 2 nodes: Wharf starts the same",
            ),
            (
                "-n 3 -N 2 --ntasks-per-node 2",
                "`ntasks` = 3 but the job has 2 nodes with 2 tasks per node, which makes 4",
            ),
            (
                "-n 3 --ntasks-per-node 2",
                "`ntasks` = 3 is not a whole number of nodes",
            ),
            ("--ntasks-per-node 0", "must be at least 1"),
            ("--ntasks-per-node 5000", "ask for 1 to 1024 tasks per node"),
            ("-n 0", "`ntasks` must be at least 1"),
            ("--gpus-per-task 0", "`gpus_per_task` must be at least 1"),
            (
                "--ntasks-per-node 2 --gpus-per-task 1 --gpus 4",
                "`gpus` = 4 per node but `gpus_per_task` = 1 with 2 tasks per node makes 2",
            ),
        ] {
            let text = format!("#!/bin/sh\n#SBATCH {lines}\ntrue\n");
            let e = parse_job_file("g.sh", &text)
                .unwrap()
                .resolve("/tmp", &crate::JobDefaults::default())
                .unwrap_err();
            assert!(e.contains(says), "{lines}: {e}");
        }
    }

    #[test]
    fn tasks_per_node_from_sbatch_wharf_lines_and_toml() {
        let d = crate::JobDefaults::default();
        let shape = |lines: &str| {
            let text = format!("#!/bin/sh\n#SBATCH {lines}\ntrue\n");
            let spec = parse_job_file("t.sh", &text)
                .unwrap()
                .resolve("/tmp", &d)
                .unwrap();
            (
                spec.nodes,
                spec.tasks_per_node,
                spec.tasks(),
                spec.resources.cpus,
                spec.resources.gpus,
                spec.gpus_per_task,
            )
        };
        // Given outright, or derived from --ntasks as Slurm does.
        assert_eq!(shape("-N 2 --ntasks-per-node 4"), (2, 4, 8, 4, 0, None));
        assert_eq!(shape("-N 2 -n 8"), (2, 4, 8, 4, 0, None));
        assert_eq!(shape("-n 6 --ntasks-per-node 3"), (2, 3, 6, 3, 0, None));
        assert_eq!(shape("-n 2"), (1, 2, 2, 2, 0, None));
        assert_eq!(shape("-N 3"), (3, 1, 3, 1, 0, None));
        // CPUs are per task; GPUs per task make the node's.
        assert_eq!(
            shape("--ntasks-per-node=4 --cpus-per-task=2 --gpus-per-task=1"),
            (1, 4, 4, 8, 4, Some(1))
        );
        assert_eq!(
            shape("--ntasks-per-node=2 --gpus-per-task=2 --gpus=h100:4"),
            (1, 2, 2, 2, 4, Some(2))
        );
        let toml = "command = [\"true\"]\nnodes = 2\nntasks_per_node = 2\ngpus_per_task = 1\n";
        let spec = parse_job_file("j.toml", toml)
            .unwrap()
            .resolve("/tmp", &d)
            .unwrap();
        assert_eq!(
            (spec.tasks(), spec.resources.gpus, spec.gpus_per_task),
            (4, 2, Some(1))
        );
        let mut req = JobRequest::default();
        assert!(set_option(&mut req, "gpus-per-task", "x")
            .unwrap_err()
            .contains("--gpus-per-task expects a whole number"));
    }

    #[test]
    fn script_errors_name_line() {
        let e = parse_job_file(
            "a.sh",
            "#!/bin/sh\n#WHARF --cpus=2\n#WHARF --frobnicate=1\n",
        )
        .unwrap_err();
        assert_eq!(e.line, Some(3));
        assert!(
            e.to_string()
                .contains("a.sh line 3: unknown option --frobnicate"),
            "{e}"
        );
        let e = parse_job_file("a.sh", "#WHARF --mem=lots\n").unwrap_err();
        assert!(e.to_string().contains("line 1: --mem"), "{e}");
        let e = parse_job_file("a.sh", "#WHARF --cpus\n").unwrap_err();
        assert!(e.message.contains("needs a value"), "{e}");
        // An unknown option is unknown, value or not.
        for line in ["#SBATCH --bogus\n", "#SBATCH --cpus=1 -y\n"] {
            let e = parse_job_file("a.sh", line).unwrap_err();
            assert!(e.message.starts_with("unknown option --"), "{line}: {e}");
        }
        let e = parse_job_file("a.sh", "#WHARF -\u{e9}2\n").unwrap_err();
        assert!(e.message.contains("unknown option --\u{e9}"), "{e}");
    }
}
