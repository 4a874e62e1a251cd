//! `wharf queue`.

use anyhow::Result;
use wharf_api::listing::JobRow;
use wharf_api::resources::{format_duration, format_memory};
use wharf_api::wire::{JobList, WhoAmI};
use wharf_api::{JobRecord, JobState, PriorityView};
use wharf_client::{Client, Endpoint};

use crate::output;

mod format;

/// Arguments.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Include recently ended jobs (up to --limit).
    #[arg(short, long)]
    all: bool,
    /// How many ended jobs --all shows, the most recent that the other filters keep (at most
    /// 10,000; `wharf acct` reads further back).
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    limit: u32,
    /// Only my jobs.
    #[arg(long)]
    me: bool,
    /// Only jobs in these states (e.g. running,pending, or Slurm's codes: R,PD); naming an
    /// ended one (CD, F, ...) or `all` shows ended jobs too, as --all does.
    #[arg(short = 't', long, visible_alias = "states", value_delimiter = ',')]
    state: Vec<String>,
    /// Only these users' jobs (squeue -u): names or uids; a name this host does not know is
    /// refused.
    #[arg(short, long, value_delimiter = ',', value_name = "USER")]
    user: Vec<String>,
    /// Only these jobs (squeue -j): ids, an array's id for all its tasks, or ID_TASK.
    #[arg(short, long, value_delimiter = ',', value_name = "ID", value_parser = super::job_arg)]
    jobs: Vec<String>,
    /// Only jobs in these partitions (squeue -p); a job that names none is in the default one.
    #[arg(short = 'p', long, value_delimiter = ',', value_name = "PARTITION")]
    partition: Vec<String>,
    /// Pending jobs' priorities factor by factor (Slurm's sprio): each factor times its
    /// weight, as the last scheduling pass computed them, highest first (the multifactor
    /// policy still takes a higher partition tier first, and FCFS and EASY go by submit
    /// time).
    #[arg(long, conflicts_with_all = ["all", "limit"])]
    priority: bool,
    /// Print JSON.
    #[arg(long)]
    json: bool,
    /// No header line (squeue -h; help is --help here).
    #[arg(short = 'h', long)]
    noheader: bool,
    /// Lines of squeue's `%` fields, e.g. "%.18i %.9P %.8j %.8u %.2t %.10M %.6D %R": %i id
    /// (ARRAYID_TASK), %A own id, %F array id, %K task id, %j name, %u user, %P partition, %t
    /// state code, %T state, %M time used, %l limit, %D nodes, %C CPUs, %m memory per node,
    /// %b GPUs per node, %N nodes, %r reason, %R reason or nodes, %S start; %[.]N sizes a
    /// field (cut to N, `.` to the right), %% is %.
    #[arg(short = 'o', long, value_name = "FORMAT", conflicts_with_all = ["json", "priority"])]
    format: Option<String>,
    /// Print help.
    #[arg(long, action = clap::ArgAction::Help)]
    help: Option<bool>,
}

/// The lines `-o FORMAT` makes of `rows`, after its header line when `header`: written as
/// they are made, unless a `%#` field needs every row first.
fn print_lines(f: &format::Format, rows: &[JobRow], now: u64, header: bool) {
    let header = header.then(|| f.header()).into_iter();
    f.print(header.chain(rows.iter().map(|j| f.row(j, now))));
}

/// Whether `-t` asks for ended jobs: squeue's `all` (every state: the filter is dropped), or
/// an ended state named (CD, F, ...), which only ended jobs can be in.
fn takes_ended(states: &mut Vec<String>) -> bool {
    let every = |s: &String| s.trim().eq_ignore_ascii_case("all");
    let ended = |s: &String| JobState::parse(s).is_some_and(JobState::is_terminal);
    let with_ended = states.iter().any(|s| every(s) || ended(s));
    if states.iter().any(every) {
        states.clear();
    }
    with_ended
}

/// Fetches jobs as the CLI shows them; `brief` leaves their specs out. Those `picked` keeps
/// by partition, and of the ended jobs those it keeps (the controller filters them before it
/// takes the `finished` most recent, so an old one named is found behind newer ones).
pub(crate) async fn fetch(
    client: &Client,
    finished: u32,
    me: bool,
    brief: bool,
    picked: Option<&Picked>,
) -> Result<Vec<JobRecord>> {
    let mut path = format!("/v1/jobs?finished={finished}&brief={brief}");
    if let Some(p) = picked {
        path.push_str(&p.query(finished > 0)?);
    }
    if me {
        let who: WhoAmI = client.get("/v1/whoami").await?;
        path.push_str(&format!("&user={}", who.owner.uid));
    }
    Ok(client.get::<JobList>(&path).await?.jobs)
}

/// A listing's answer: rows from a controller that makes them, whole records from an older
/// one (which ignores `rows=true`).
#[derive(serde::Deserialize)]
struct Listing<'a> {
    #[serde(borrow, default)]
    rows: Option<Vec<JobRow<'a>>>,
    #[serde(default)]
    jobs: Option<Vec<JobRecord>>,
}

/// Runs the command.
pub async fn run(socket: &str, mut args: Args) -> Result<i32> {
    let client = Client::new(Endpoint::parse(socket), None);
    let with_ended = takes_ended(&mut args.state);
    let picked = Picked::new(&args.state, &args.user, &args.jobs, &args.partition)?;
    if args.priority {
        return priorities(&client, args.me, args.json, &picked).await;
    }
    let finished = if args.all || with_ended {
        args.limit
    } else {
        0
    };
    if args.json {
        // --json gives the whole records.
        let mut jobs = fetch(&client, finished, args.me, false, Some(&picked)).await?;
        let within = in_partitions(&client, finished, args.me, &picked).await?;
        jobs.retain(|j| {
            picked.keeps(
                j.id,
                j.array.map(|a| (a.job_id, a.task_id)),
                &j.owner.user,
                j.state,
            ) && within.as_ref().is_none_or(|ids| ids.contains(&j.id))
        });
        println!("{}", serde_json::to_string_pretty(&JobList { jobs })?);
        return Ok(0);
    }
    let format = args
        .format
        .as_deref()
        .map(format::Format::parse)
        .transpose()?;
    // The table shows no part of a spec: rows of what it shows are enough.
    with_rows(&client, finished, args.me, &picked, |rows| {
        let now = wharf_controller::now_ms();
        match &format {
            Some(f) => print_lines(f, &rows, now, !args.noheader),
            None => output::print_table(&table(&rows, now, !args.noheader)),
        }
    })
    .await?;
    Ok(0)
}

/// Calls `f` with the listing's rows of the jobs `picked` keeps (`finished` ended ones, the
/// caller's only with `me`), made from whole records where the controller sends those (one
/// older than rows). With partitions named, checked that the controller picked by them: one
/// older than partition filters ignores them, and every job would be taken for theirs.
pub(crate) async fn with_rows<T>(
    client: &Client,
    finished: u32,
    me: bool,
    picked: &Picked,
    f: impl for<'a> FnOnce(Vec<JobRow<'a>>) -> T,
) -> Result<T> {
    let body = client
        .get_bytes(&rows_path(client, finished, me, picked).await?)
        .await?;
    let listing: Listing = serde_json::from_slice(&body)
        .map_err(|e| anyhow::anyhow!("talking to the controller: bad answer: {e}"))?;
    if listing.rows.is_none() && !picked.partitions.is_empty() {
        anyhow::bail!(
            "-p: the controller answers no listing rows: it is older than partition filters; \
             upgrade it, or leave -p out"
        );
    }
    let records = listing.jobs.unwrap_or_default();
    let mut rows = match listing.rows {
        Some(rows) => rows,
        None => records.iter().map(|j| JobRow::of(j, &j.pulling)).collect(),
    };
    picked.check_partitions(&rows)?;
    rows.retain(|j| picked.keeps(j.id, j.array, &j.user, j.state));
    Ok(f(rows))
}

/// The path of the listing's rows: `finished` ended jobs, the caller's only with `me`, those
/// `picked` asks the controller for.
async fn rows_path(client: &Client, finished: u32, me: bool, picked: &Picked) -> Result<String> {
    let mut path = format!("/v1/jobs?finished={finished}&brief=true&rows=true");
    path.push_str(&picked.query(finished > 0)?);
    if me {
        let who: WhoAmI = client.get("/v1/whoami").await?;
        path.push_str(&format!("&user={}", who.owner.uid));
    }
    Ok(path)
}

/// The ids of the jobs in `picked`'s partitions, from the listing's rows, which name every
/// job's partition (a record of another user's job does not); `None` when it names none.
async fn in_partitions(
    client: &Client,
    finished: u32,
    me: bool,
    picked: &Picked,
) -> Result<Option<std::collections::BTreeSet<u64>>> {
    if picked.partitions.is_empty() {
        return Ok(None);
    }
    let ids = with_rows(client, finished, me, picked, |rows| {
        rows.iter().map(|r| r.id).collect()
    });
    Ok(Some(ids.await?))
}

/// The jobs the filters keep; an empty filter keeps all.
pub(crate) struct Picked {
    states: Vec<JobState>,
    users: Vec<String>,
    /// Job ids, array ids (all their tasks) or one task.
    jobs: Vec<(u64, Option<u32>)>,
    /// Partitions (the controller filters by them: another user's job's partition is in its
    /// spec, which the client is not shown).
    pub(crate) partitions: Vec<String>,
}

impl Picked {
    /// The filters of `-t` (states by name or Slurm's code), `-u` (user names or uids) and `-j` (job
    /// ids, array ids, `ID_TASK`, each already checked by the `job_arg` value parser).
    pub(crate) fn new(
        states: &[String],
        users: &[String],
        jobs: &[String],
        partitions: &[String],
    ) -> Result<Picked> {
        if partitions.iter().any(|p| p.trim().is_empty()) {
            anyhow::bail!("-p: an empty partition name; give names, comma-separated (-p gpu,cpu)");
        }
        let mut parsed = Vec::new();
        for s in states {
            parsed.push(JobState::parse(s).ok_or_else(|| {
                anyhow::anyhow!(
                    "unknown state {:?}; use one of {}",
                    output::clean(s),
                    JobState::ALL
                        .map(|s| format!("{} ({})", s.as_str(), s.code()))
                        .join(", ")
                )
            })?);
        }
        Ok(Picked {
            states: parsed,
            users: (users.iter())
                .map(|u| super::known_user(u))
                .collect::<Result<_>>()?,
            jobs: (jobs.iter())
                .filter_map(|j| wharf_api::job::parse_job_ref(j))
                .collect(),
            // As the controller takes them: a name's spaces are not its.
            partitions: partitions.iter().map(|p| p.trim().to_string()).collect(),
        })
    }

    /// That `rows` (of a listing asked for with these filters) are all in the partitions
    /// named: a controller older than partition filters ignores them, answers rows without
    /// partitions (or whole records), and every job would be taken for one of them, to list
    /// or to cancel. Refused then, saying so.
    fn check_partitions(&self, rows: &[JobRow]) -> Result<()> {
        if self.partitions.is_empty() {
            return Ok(());
        }
        let kept = |r: &&JobRow| self.partitions.iter().any(|p| *p == r.partition);
        if let Some(r) = rows.iter().find(|r| !kept(r)) {
            anyhow::bail!(
                "-p: the controller did not pick by partition (job {} is in {:?}): it is older \
                 than partition filters; upgrade it, or leave -p out",
                r.id,
                crate::output::clean(&r.partition)
            );
        }
        Ok(())
    }

    /// The listing's query parameters that ask the controller for the jobs in these
    /// partitions (`&partitions=...`) and, with `ended`, the ended jobs these filters keep
    /// (`&states=...&users=...&jobs=...`); empty when none filters.
    fn query(&self, ended: bool) -> Result<String> {
        let join = |words: Vec<String>| (!words.is_empty()).then(|| words.join(","));
        let mut q = vec![("partitions", join(self.partitions.clone()))];
        if ended {
            let jobs = (self.jobs.iter()).map(|(id, task)| match task {
                Some(t) => format!("{id}_{t}"),
                None => id.to_string(),
            });
            q.extend([
                (
                    "states",
                    join(self.states.iter().map(|s| s.as_str().to_string()).collect()),
                ),
                ("users", join(self.users.clone())),
                ("jobs", join(jobs.collect())),
            ]);
        }
        let q: Vec<(&str, String)> = q.into_iter().filter_map(|(k, v)| Some((k, v?))).collect();
        if q.is_empty() {
            return Ok(String::new());
        }
        Ok(format!("&{}", serde_urlencoded::to_string(q)?))
    }

    fn keeps(&self, id: u64, array: Option<(u64, u32)>, user: &str, state: JobState) -> bool {
        let named = |&n: &(u64, Option<u32>)| wharf_api::job::job_ref_names(n, id, array);
        (self.states.is_empty() || self.states.contains(&state))
            && (self.users.is_empty() || self.users.iter().any(|u| u == user))
            && (self.jobs.is_empty() || self.jobs.iter().any(named))
    }
}

/// One pending job's priority, for `--priority --json`.
#[derive(serde::Serialize)]
struct JobPriority<'a> {
    id: u64,
    job: String,
    user: &'a str,
    #[serde(flatten)]
    priority: PriorityView,
}

/// `wharf queue --priority`: pending jobs that have been through a scheduling pass, highest
/// priority first (ties by id), each factor times its weight.
async fn priorities(client: &Client, me: bool, json: bool, picked: &Picked) -> Result<i32> {
    let mut jobs = fetch(client, 0, me, true, Some(picked)).await?;
    let within = in_partitions(client, 0, me, picked).await?;
    jobs.retain(|j| {
        let array = j.array.map(|a| (a.job_id, a.task_id));
        picked.keeps(j.id, array, &j.owner.user, j.state)
            && within.as_ref().is_none_or(|ids| ids.contains(&j.id))
    });
    let ranked = ranked(&jobs);
    if json {
        let list: Vec<JobPriority> = ranked
            .iter()
            .map(|(j, p)| JobPriority {
                id: j.id,
                job: j.label(),
                user: &j.owner.user,
                priority: *p,
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&list)?);
        return Ok(0);
    }
    output::print_table(&priority_table(&ranked));
    Ok(0)
}

/// The pending jobs of `jobs` that have been through a scheduling pass, highest priority
/// first, ties by id.
fn ranked(jobs: &[JobRecord]) -> Vec<(&JobRecord, PriorityView)> {
    let mut ranked: Vec<(&JobRecord, PriorityView)> = jobs
        .iter()
        .filter(|j| j.state == JobState::Pending)
        .filter_map(|j| Some((j, j.priority?)))
        .collect();
    ranked.sort_by_key(|(j, p)| (std::cmp::Reverse(p.total), j.id));
    ranked
}

/// The `--priority` table.
fn priority_table(ranked: &[(&JobRecord, PriorityView)]) -> output::Table {
    let mut t = output::table(&[
        "JOBID",
        "USER",
        "PRIORITY",
        "AGE",
        "FAIRSHARE",
        "JOBSIZE",
        "WIDTH",
        "PARTITION",
        "QOS",
        "NICE",
    ]);
    for (j, p) in ranked {
        t.cell(&j.label());
        t.cell(&j.owner.user);
        if p.fixed {
            t.cell_fmt(format_args!("{} (set)", p.total));
        } else {
            t.cell_fmt(format_args!("{}", p.total));
        }
        for f in [p.age, p.fairshare, p.job_size, p.width, p.partition, p.qos] {
            t.cell_fmt(format_args!("{f}"));
        }
        t.cell_fmt(format_args!("{}", p.nice));
        t.end_row();
    }
    t
}

/// The text of the last value formatted.
#[derive(Default)]
struct Memo(Option<(u64, String)>);

impl Memo {
    fn get(&mut self, value: u64, format: fn(u64) -> String) -> &str {
        if self.0.as_ref().is_none_or(|(v, _)| *v != value) {
            self.0 = Some((value, format(value)));
        }
        self.0.as_ref().map_or("", |(_, text)| text)
    }
}

/// The table of `rows` at `now` (ms since the epoch).
fn table(rows: &[JobRow], now: u64, header: bool) -> output::Table {
    const COLUMNS: [&str; 12] = [
        "JOBID",
        "PARTITION",
        "NAME",
        "USER",
        "STATE",
        "TIME",
        "LIMIT",
        "CPUS",
        "MEM",
        "GPUS",
        "NODES",
        "NODELIST(REASON)",
    ];
    let mut t = match header {
        true => output::table(&COLUMNS),
        false => output::Table::default(),
    };
    t.reserve(rows.len(), 12, 8);
    // Most jobs of a long queue share their limit, memory and (pending: none) time.
    let (mut time, mut limit, mut mem) = (Memo::default(), Memo::default(), Memo::default());
    for j in rows {
        match j.array {
            Some((job, task)) => t.cell_fmt(format_args!("{job}_{task}")),
            None => t.cell_fmt(format_args!("{}", j.id)),
        }
        t.cell(if j.partition.is_empty() {
            "-"
        } else {
            &j.partition
        });
        t.cell(
            j.name
                .char_indices()
                .nth(20)
                .map_or(&j.name, |(at, _)| &j.name[..at]),
        );
        t.cell(&j.user);
        t.cell(j.state.as_str());
        t.cell(time.get(j.elapsed_ms(now) / 1000, format_duration));
        t.cell(limit.get(j.time_limit, format_duration));
        t.cell_fmt(format_args!("{}", j.resources.cpus));
        t.cell(mem.get(j.resources.memory, format_memory));
        t.cell_fmt(format_args!("{}", j.resources.gpus));
        t.cell_fmt(format_args!("{}", j.nodes));
        match j.state {
            JobState::Pending => {
                let code = j.reason.as_deref().unwrap_or("");
                match j.expected_start {
                    // Slurm's `squeue --start`, in one column.
                    Some(at) => t.cell_fmt(format_args!(
                        "{code}, starts in {}",
                        format_duration(at.saturating_sub(now) / 1000)
                    )),
                    None => t.cell(code),
                }
            }
            _ if j.nodelist.is_empty() => t.cell("-"),
            // How far its image's pull has come, on the node that is furthest behind.
            JobState::Starting if j.pull.is_some() => t.cell_fmt(format_args!(
                "{} (pulling: {})",
                j.nodelist,
                j.pull.map(|p| p.counts()).unwrap_or_default()
            )),
            _ => t.cell(&j.nodelist),
        }
        t.end_row();
    }
    t
}

#[cfg(test)]
pub(super) mod tests {
    use std::borrow::Cow;

    use wharf_api::listing::{JobRow, PullCounts};
    use wharf_api::{JobState, Resources};

    use super::Picked;

    #[test]
    fn naming_an_ended_state_or_all_asks_for_ended_jobs() {
        let states = |given: &[&str]| {
            let mut v: Vec<String> = given.iter().map(|s| s.to_string()).collect();
            let ended = super::takes_ended(&mut v);
            (ended, v)
        };
        assert_eq!(states(&["PD", "R"]), (false, vec!["PD".into(), "R".into()]));
        assert_eq!(states(&["CD"]), (true, vec!["CD".into()]));
        assert_eq!(states(&["failed"]), (true, vec!["failed".into()]));
        assert_eq!(states(&["R", "all"]), (true, vec![]));
        assert_eq!(states(&[]), (false, vec![]));
    }

    #[test]
    fn only_pending_jobs_with_a_priority_are_ranked_highest_first() {
        use wharf_api::{JobRecord, Owner, PriorityView};
        let owner = Owner {
            uid: 1000,
            gid: 1000,
            user: "ann".into(),
        };
        let job = |id, state, total: Option<u64>| {
            let mut j = JobRecord::pending(owner.clone(), "j".into(), Resources::default(), 60, 0);
            j.id = id;
            j.state = state;
            j.priority = total.map(|total| PriorityView {
                total,
                ..PriorityView::default()
            });
            j
        };
        let jobs = vec![
            job(1, JobState::Pending, Some(10)),
            job(2, JobState::Running, Some(99)),
            job(3, JobState::Pending, None),
            job(4, JobState::Pending, Some(50)),
            job(5, JobState::Pending, Some(10)),
        ];
        let order: Vec<u64> = super::ranked(&jobs).iter().map(|(j, _)| j.id).collect();
        assert_eq!(order, vec![4, 1, 5]);
    }

    #[test]
    fn filters_by_state_code_user_and_job_as_squeue_does() {
        use wharf_api::JobState::{Pending, Running};
        assert_eq!(JobState::parse("pd"), Some(Pending));
        assert_eq!(JobState::parse("R"), Some(Running));
        assert_eq!(JobState::parse("running"), Some(Running));
        assert_eq!(JobState::parse("X"), None);
        let picked = Picked {
            states: vec![Pending],
            users: vec!["ann".into()],
            jobs: vec![(10, None), (20, Some(3))],
            partitions: vec!["gpu".into()],
        };
        // Job 10, a task of array 10, and task 3 of array 20, pending and ann's.
        assert!(picked.keeps(10, None, "ann", Pending));
        assert!(picked.keeps(12, Some((10, 2)), "ann", Pending));
        assert!(picked.keeps(23, Some((20, 3)), "ann", Pending));
        assert!(!picked.keeps(22, Some((20, 2)), "ann", Pending));
        assert!(!picked.keeps(11, None, "ann", Pending));
        assert!(!picked.keeps(10, None, "bob", Pending));
        assert!(!picked.keeps(10, None, "ann", Running));
        // The partitions go to the controller, for active jobs too; the rest for ended ones.
        assert_eq!(picked.query(false).unwrap(), "&partitions=gpu");
        assert_eq!(
            picked.query(true).unwrap(),
            "&partitions=gpu&states=PENDING&users=ann&jobs=10%2C20_3"
        );
        let all = Picked {
            states: vec![],
            users: vec![],
            jobs: vec![],
            partitions: vec![],
        };
        assert!(all.keeps(99, None, "zed", Running));
        assert_eq!(all.query(true).unwrap(), "");
        // Rows of another partition, or without one (a controller that ignored -p), are
        // refused rather than taken for the partition's.
        let gpu = row(1, Pending);
        assert!(picked.check_partitions(std::slice::from_ref(&gpu)).is_ok());
        let old = JobRow {
            partition: "".into(),
            ..row(2, Pending)
        };
        let e = picked
            .check_partitions(&[gpu, old])
            .unwrap_err()
            .to_string();
        assert!(e.contains("older than partition filters"), "{e}");
        assert!(all.check_partitions(&[row(3, Running)]).is_ok());
        // Names are trimmed, as the controller trims them (`-p "gpu, debug"`): a row of
        // debug is debug's.
        let spaced = Picked::new(&[], &[], &[], &["gpu".into(), " debug".into()]).unwrap();
        let debug = JobRow {
            partition: "debug".into(),
            ..row(4, Pending)
        };
        assert!(spaced.check_partitions(&[debug]).is_ok());
        // An empty name is said to be one, not taken for no filter (and then for an old
        // controller's ignoring of it).
        for names in [vec!["".to_string()], vec!["gpu".into(), " ".into()]] {
            let e = Picked::new(&[], &[], &[], &names)
                .err()
                .unwrap()
                .to_string();
            assert!(e.contains("an empty partition name"), "{e}");
        }
    }

    #[test]
    fn priorities_show_each_weighted_factor_and_a_fixed_one_says_so() {
        use wharf_api::{JobRecord, Owner, PriorityView};
        let owner = Owner {
            uid: 1000,
            gid: 1000,
            user: "ann".into(),
        };
        let mut a = JobRecord::pending(owner.clone(), "a".into(), Resources::default(), 60, 0);
        a.id = 7;
        let mut b = JobRecord::pending(owner, "b".into(), Resources::default(), 60, 0);
        b.id = 8;
        b.array = Some(wharf_api::array::ArrayTask {
            job_id: 5,
            task_id: 3,
            throttle: None,
            shape: Default::default(),
        });
        let computed = PriorityView {
            total: 11_200,
            age: 500,
            fairshare: 8_000,
            job_size: 750,
            width: 50,
            partition: 0,
            qos: 2_000,
            nice: 100,
            fixed: false,
        };
        let fixed = PriorityView {
            total: 90_000,
            fixed: true,
            ..PriorityView::default()
        };
        let mut out = Vec::new();
        super::priority_table(&[(&b, fixed), (&a, computed)])
            .write(&mut out)
            .unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "JOBID  USER  PRIORITY     AGE  FAIRSHARE  JOBSIZE  WIDTH  PARTITION  QOS   NICE\n\
             5_3    ann   90000 (set)  0    0          0        0      0          0     0\n\
             7      ann   11200        500  8000       750      50     0          2000  100\n"
        );
    }

    pub(super) fn row(id: u64, state: JobState) -> JobRow<'static> {
        JobRow {
            id,
            array: None,
            name: Cow::Borrowed("train"),
            user: Cow::Borrowed("alice"),
            state,
            reason: None,
            start_time: None,
            end_time: None,
            time_limit: 3600,
            resources: Resources {
                cpus: 4,
                memory: 3 << 29,
                gpus: 1,
            },
            nodes: 1,
            nodelist: Cow::Borrowed(""),
            expected_start: None,
            pull: None,
            partition: Cow::Borrowed("gpu"),
        }
    }

    #[test]
    fn the_table_shows_each_state_as_squeue_does() {
        let now = 100_000_000;
        let held = JobRow {
            array: Some((40, 2)),
            name: "a name longer than twenty, cut\x1b[2J".into(),
            reason: Some("JobHeldUser".into()),
            ..row(42, JobState::Pending)
        };
        let soon = JobRow {
            name: "日本語".into(),
            reason: Some("Resources".into()),
            expected_start: Some(now + 90_000),
            ..row(43, JobState::Pending)
        };
        let pulling = JobRow {
            start_time: Some(now - 5_000),
            nodes: 2,
            nodelist: "gpu[01-02]".into(),
            pull: Some(PullCounts {
                layers_done: 3,
                layers: 14,
                bytes_done: 1_800_000_000,
                bytes: 8_400_000_000,
            }),
            ..row(44, JobState::Starting)
        };
        let running = JobRow {
            start_time: Some(now - 90_061_000),
            nodelist: "gpu03".into(),
            ..row(45, JobState::Running)
        };
        let ended = JobRow {
            start_time: Some(now - 61_000),
            end_time: Some(now - 1_000),
            time_limit: 2 * 86400,
            partition: "".into(),
            ..row(46, JobState::Failed)
        };
        let bare = super::table(std::slice::from_ref(&held), now, false);
        let mut text = Vec::new();
        bare.write(&mut text).unwrap();
        let text = String::from_utf8(text).unwrap();
        assert_eq!(text.lines().count(), 1, "no header line: {text}");
        assert!(!text.contains("JOBID"), "{text}");
        let t = super::table(&[held, soon, pulling, running, ended], now, true);
        let mut shown = Vec::new();
        t.write(&mut shown).unwrap();
        assert_eq!(
            String::from_utf8(shown).unwrap(),
            "JOBID  PARTITION  NAME                  USER   STATE     TIME        LIMIT       CPUS  MEM   GPUS  NODES  NODELIST(REASON)\n\
             40_2   gpu        a name longer than t  alice  PENDING   00:00:00    01:00:00    4     1.5G  1     1      JobHeldUser\n\
             43     gpu        日本語                alice  PENDING   00:00:00    01:00:00    4     1.5G  1     1      Resources, starts in 00:01:30\n\
             44     gpu        train                 alice  STARTING  00:00:05    01:00:00    4     1.5G  1     2      gpu[01-02] (pulling: 1.8 of 8.4 GB, 3 of 14 layers)\n\
             45     gpu        train                 alice  RUNNING   1-01:01:01  01:00:00    4     1.5G  1     1      gpu03\n\
             46     -          train                 alice  FAILED    00:01:00    2-00:00:00  4     1.5G  1     1      -\n"
        );
    }
}
