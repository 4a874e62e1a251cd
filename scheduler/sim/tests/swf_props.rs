//! Properties of the SWF parser: it never panics, whatever the bytes, and every well-formed
//! job line it is given comes back with the values written.

use proptest::prelude::*;
use wharf_sim::swf::{parse, SwfError, FIELDS};

/// A field as archive traces write it: -1, a whole number, or a number with a fraction.
fn field() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("-1".to_string()),
        (0u64..10_000_000).prop_map(|n| n.to_string()),
        (0u32..100_000, 0u32..100).prop_map(|(a, b)| format!("{a}.{b:02}")),
    ]
}

fn job_line() -> impl Strategy<Value = (u64, u64, Vec<String>)> {
    (
        1u64..1_000_000,
        0u64..100_000_000,
        prop::collection::vec(field(), FIELDS - 2),
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn never_panics_on_any_text(text in ".{0,400}") {
        let _ = parse(&text);
    }

    #[test]
    fn never_panics_on_near_swf(lines in prop::collection::vec(
        prop_oneof![
            Just("; MaxNodes: 128".to_string()),
            Just("; MaxProcs: x".to_string()),
            Just(";".to_string()),
            prop::collection::vec(prop_oneof![
                field(),
                Just("-7".to_string()),
                Just("nan".to_string()),
                Just("1e400".to_string()),
                Just("-1.0".to_string()),
                Just("18446744073709551616".to_string()),
            ], 0..22).prop_map(|f| f.join(" ")),
        ], 0..20)) {
        let text = lines.join("\n");
        match parse(&text) {
            Ok(t) => prop_assert!(t.jobs.len() <= lines.len()),
            // Every error names a line that exists.
            Err(e) => {
                let line = match e {
                    SwfError::FieldCount { line, .. }
                    | SwfError::NotANumber { line, .. }
                    | SwfError::OutOfRange { line, .. }
                    | SwfError::NoSubmitTime { line, .. }
                    | SwfError::DuplicateJob { line, .. }
                    | SwfError::BadHeader { line, .. } => line,
                };
                prop_assert!(line >= 1 && line <= lines.len());
                let prefix = format!("line {}:", line);
                prop_assert!(e.to_string().starts_with(&prefix));
            }
        }
    }

    #[test]
    fn well_formed_lines_round_trip(mut jobs in prop::collection::vec(job_line(), 1..30)) {
        // Job numbers are unique in a trace.
        for (k, job) in jobs.iter_mut().enumerate() {
            job.0 = job.0 * 100 + k as u64;
        }
        let mut text = String::from("; Version: 2\n; MaxProcs: 512\n");
        for (id, submit, rest) in &jobs {
            text.push_str(&format!("{id} {submit} {}\n", rest.join("  ")));
        }
        let t = parse(&text).unwrap();
        prop_assert_eq!(t.header.max_procs, Some(512));
        prop_assert_eq!(t.jobs.len(), jobs.len());
        for (j, (id, submit, rest)) in t.jobs.iter().zip(&jobs) {
            prop_assert_eq!(j.id, *id);
            prop_assert_eq!(j.submit_time, *submit);
            // Field 4 (run time) is rest[1].
            let want = if rest[1] == "-1" { None } else {
                Some(rest[1].parse::<f64>().unwrap().round() as u64)
            };
            prop_assert_eq!(j.run_time, want);
        }
    }
}
