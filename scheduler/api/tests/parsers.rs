//! Property tests of the parsers that read user input: memory sizes, time limits, mount
//! specs, image names, TOML job files and `#WHARF` lines. None may panic on any input; errors
//! name what is wrong; accepted values read back as they were written. Case counts are kept
//! small so that the suite runs in seconds.

mod common;

use common::config;
use proptest::prelude::*;
use wharf_api::array::parse_array;
use wharf_api::dependency::parse_dependency;
use wharf_api::forms::{format_utc, parse_begin, Begin};
use wharf_api::job::{parse_limit, parse_mount, reserved_destination, validate_image_name};
use wharf_api::jobfile::{apply_words, parse_job_file};
use wharf_api::resources::{format_duration, format_memory};
use wharf_api::{parse_duration, parse_memory, JobDefaults, JobRequest};

/// Text that looks like what the parsers expect, with every kind of byte mixed in.
fn nearly(pattern: &'static str) -> impl Strategy<Value = String> {
    prop_oneof![
        proptest::string::string_regex(pattern).unwrap(),
        any::<String>(),
        proptest::string::string_regex("[0-9.:\\-a-zA-Z/ \\t\"'#=]{0,40}").unwrap(),
    ]
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn memory_sizes_never_panic_and_say_what_is_wrong(t in nearly("[0-9]{0,25}(\\.[0-9]{0,4})?[ ]?(B|K|M|G|T|KB|MiB|GIB|XB|)")) {
        match parse_memory(&t) {
            Ok(b) => prop_assert!(b >= 1),
            Err(e) => prop_assert!(e.contains("memory"), "{e}"),
        }
        if let Err(e) = parse_limit(&t) {
            prop_assert!(e.contains("unlimited"), "{e}");
        }
    }

    #[test]
    fn memory_sizes_round_trip(n in 1u64..1024, shift in prop::sample::select(vec![0u32, 10, 20, 30, 40])) {
        let bytes = n << shift;
        prop_assert_eq!(parse_memory(&format_memory(bytes)), Ok(bytes));
    }

    #[test]
    fn time_limits_never_panic_and_say_what_is_wrong(t in nearly("([0-9]{1,21}-)?[0-9]{0,21}(:[0-9]{0,21}){0,3}[smhdx]?")) {
        match parse_duration(&t) {
            Ok(s) => prop_assert!(s >= 1),
            Err(e) => prop_assert!(e.contains("time limit"), "{e}"),
        }
    }

    #[test]
    fn time_limits_round_trip(secs in 1u64..400 * 86400) {
        prop_assert_eq!(parse_duration(&format_duration(secs)), Ok(secs));
    }

    #[test]
    fn mount_specs_never_panic_and_round_trip(t in nearly("(/[a-z.]{0,6}){0,3}(:(/[a-z.]{0,6}){0,3})?(:ro|:rw|:x)?"), alone in any::<bool>()) {
        match parse_mount(&t, alone) {
            Ok(m) => {
                for p in [&m.source, &m.destination] {
                    prop_assert!(p.starts_with('/') && p != "/" && !p.contains('\0'));
                    prop_assert!(!p.split('/').any(|c| c == ".."));
                }
                // Nothing is ever bound onto what the sandbox makes itself.
                prop_assert_eq!(reserved_destination(&m.destination), None);
                let again = format!(
                    "{}:{}{}",
                    m.source,
                    m.destination,
                    if m.read_only { ":ro" } else { "" }
                );
                prop_assert_eq!(parse_mount(&again, false), Ok(m));
            }
            Err(e) => prop_assert!(
                (e.contains("is not") && e.contains("absolute paths"))
                    || (e.contains("cannot be mounted at") && e.contains("mount it elsewhere")),
                "{e}"
            ),
        }
    }

    #[test]
    fn image_names_are_checked_by_the_job_spec(t in nearly("[a-z0-9./:@_-]{0,30}")) {
        match validate_image_name(&t) {
            Ok(()) => {
                prop_assert!(!t.is_empty() && t.len() <= 255);
                // `#` separates a registry from its path, Pyxis-style (`nvcr.io#nvidia/pytorch`).
                prop_assert!(t.chars().all(|c| c.is_ascii_alphanumeric() || "._-:/@#".contains(c)));
                prop_assert!(t.matches('#').count() <= 1);
                prop_assert!(!t.split('/').any(|c| c == ".." || c == "."));
            }
            Err(e) => prop_assert!(e.contains("`image`"), "{e}"),
        }
        let req = JobRequest {
            image: Some(t.clone()),
            command: Some(vec!["/bin/true".into()]),
            ..Default::default()
        };
        if let Ok(spec) = req.resolve("/home/u", &JobDefaults::default()) {
            prop_assert_eq!(spec.image, t);
        }
    }

    #[test]
    fn toml_job_files_never_panic_and_errors_have_a_line(text in nearly("(name|cpus|memory|time|command|env|gpus) = (\"[^\"]{0,8}\"|[0-9]{1,22}|\\[\"x\"\\])\n{0,2}")) {
        match parse_job_file("job.toml", &text) {
            Ok(_) => {}
            Err(e) => {
                prop_assert!(!e.message.is_empty());
                if let Some(line) = e.line {
                    prop_assert!(line >= 1 && line <= text.lines().count() + 1, "{e}");
                }
            }
        }
    }

    #[test]
    fn toml_job_files_round_trip(
        name in "[a-zA-Z0-9 _.-]{1,20}",
        cpus in 1u32..512,
        memory in 1u64..(1 << 50),
        time in 1u64..10_000_000,
        env in prop::collection::btree_map("[A-Z_][A-Z0-9_]{0,8}", "[ -~]{0,16}", 0..4),
        command in prop::collection::vec("[ -~]{0,12}", 1..4),
    ) {
        let req = JobRequest {
            name: Some(name),
            cpus: Some(cpus),
            memory: Some(memory),
            time: Some(time),
            env,
            command: Some(command),
            ..Default::default()
        };
        let text = toml::to_string(&req).unwrap();
        prop_assert_eq!(parse_job_file("job.toml", &text).unwrap(), req);
    }

    #[test]
    fn wharf_lines_never_panic_and_errors_have_a_line(text in nearly("(#WHARF( --?[a-zJ-]{1,8}(=| )?[0-9a-zA-Z'\"]{0,6}){0,4}\n){0,3}(echo hi\n)?")) {
        match parse_job_file("job.sh", &text) {
            Ok(req) => prop_assert_eq!(req.script.as_deref(), Some(text.as_str())),
            Err(e) => {
                prop_assert!(!e.message.is_empty());
                if let Some(line) = e.line {
                    prop_assert!(line >= 1 && line <= text.lines().count(), "{e}");
                }
            }
        }
    }

    #[test]
    fn option_words_never_panic(words in prop::collection::vec(prop_oneof![
        nearly("--?[a-zJ-]{1,10}(=[0-9a-zA-Z]{0,6})?"),
        // A short option whose letter takes several bytes.
        any::<(char, String)>().prop_map(|(c, rest)| format!("-{c}{rest}")),
    ], 0..6)) {
        let mut req = JobRequest::default();
        if let Err(e) = apply_words(&mut req, &words) {
            prop_assert!(!e.is_empty());
        }
    }

    #[test]
    fn begin_times_never_panic_and_say_what_to_write(t in nearly("(now(\\+[0-9]{0,22}(s|m|h|d|w|y|minutes|)?)?|[0-9]{4}-[0-9]{2}-[0-9]{2}(T[0-9]{2}:[0-9]{2}(:[0-9]{2})?Z?)?)")) {
        match parse_begin(&t) {
            Ok(Begin::AfterSubmit(s)) => prop_assert!(s <= 100 * 365 * 86400),
            Ok(Begin::At(s)) => prop_assert_eq!(parse_begin(&Begin::At(s).to_string()), Ok(Begin::At(s))),
            Ok(Begin::Local(s)) => prop_assert_eq!(parse_begin(&format_utc(s)), Ok(Begin::Local(s))),
            Ok(Begin::TimeOfDay(s)) => prop_assert!(s < 86400),
            Err(e) => prop_assert!(e.starts_with("--begin:") && e.contains("now+1h"), "{e}"),
        }
    }

    #[test]
    fn begin_and_hold_round_trip_through_every_form(
        secs in 0u64..4_000_000_000,
        relative in any::<bool>(),
        hold in any::<bool>(),
    ) {
        let begin = match (relative, secs % 3) {
            (true, _) => Begin::AfterSubmit(secs % (100 * 365 * 86400)),
            (false, 0) => Begin::At(secs),
            (false, 1) => Begin::Local(secs),
            (false, _) => Begin::TimeOfDay((secs % 86400) as u32),
        };
        prop_assert_eq!(parse_begin(&begin.to_string()), Ok(begin));
        let req = JobRequest {
            command: Some(vec!["x".into()]),
            begin: Some(begin),
            hold: Some(hold),
            ..Default::default()
        };
        let text = toml::to_string(&req).unwrap();
        prop_assert_eq!(parse_job_file("job.toml", &text).unwrap(), req);
        let flag = if hold { "--hold" } else { "--hold=no" };
        let script = format!("#!/bin/sh\n#WHARF {flag} --begin {begin}\n#WHARF -c 2\necho hi\n");
        let parsed = parse_job_file("job.sh", &script).unwrap();
        prop_assert_eq!(parsed.begin, Some(begin));
        prop_assert_eq!(parsed.hold, Some(hold));
        prop_assert_eq!(parsed.cpus, Some(2));
    }

    #[test]
    fn dependencies_never_panic_and_accepted_ones_round_trip(t in nearly("((after|afterok|afternotok|afterany|singleton|aftercorr)(:[0-9]{0,21}(_[0-9x]{0,11})?){0,3}[,?]?){0,4}")) {
        match parse_dependency(&t) {
            Ok(d) => {
                let text = d.to_string();
                prop_assert_eq!(parse_dependency(&text), Ok(d.clone()), "{}", text);
                let line = format!("#!/bin/sh\n#WHARF --dependency={text}\ntrue\n");
                prop_assert_eq!(parse_job_file("job.sh", &line).unwrap().dependency, Some(d));
            }
            Err(e) => prop_assert!(e.starts_with("--dependency:") && e.contains("afterok:12"), "{e}"),
        }
    }

    #[test]
    fn arrays_never_panic_and_accepted_ones_round_trip(t in nearly("([0-9]{1,8}(-[0-9]{1,8}(:[0-9]{1,3})?)?,?){0,4}(%[0-9]{0,4})?")) {
        match parse_array(&t) {
            Ok(a) => {
                prop_assert!(a.tasks.windows(2).all(|w| w[0] < w[1]));
                let text = a.to_string();
                prop_assert_eq!(parse_array(&text), Ok(a.clone()), "{}", text);
                // Interleaved steps print long; a job file has its size limit.
                let line = format!("#!/bin/sh\n#WHARF --array={text}\ntrue\n");
                if line.len() <= wharf_api::jobfile::MAX_JOB_FILE {
                    prop_assert_eq!(parse_job_file("job.sh", &line).unwrap().array, Some(a));
                }
            }
            Err(e) => prop_assert!(e.starts_with("--array:") && e.contains("0-99%8"), "{e}"),
        }
    }

    #[test]
    fn wharf_lines_round_trip(
        cpus in 1u32..512,
        mib in 1u64..(1 << 30),
        minutes in 1u64..100_000,
        name in "[a-zA-Z0-9 _.-]{1,20}",
        gpus in 0u32..16,
    ) {
        let text = format!(
            "#!/bin/sh\n#WHARF --cpus={cpus} --mem {mib}M\n#WHARF -t {minutes} -J '{name}' --gpus={gpus}\necho hi\n"
        );
        let req = parse_job_file("job.sh", &text).unwrap();
        prop_assert_eq!(req.cpus, Some(cpus));
        prop_assert_eq!(req.memory, Some(mib << 20));
        prop_assert_eq!(req.time, Some(minutes * 60));
        prop_assert_eq!(req.name.as_deref(), Some(name.as_str()));
        // --gpus is the job's (Slurm's), kept apart from --gpus-per-node until resolved.
        prop_assert_eq!(req.gpus_total, Some(gpus));
        prop_assert_eq!(req.gpus, None);
    }
}
