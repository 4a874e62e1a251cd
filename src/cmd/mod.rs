//! One module per command.

pub mod acct;
pub mod admin;
pub mod agent;
pub mod cancel;
pub mod controller;
pub mod dev;
pub mod eff;
pub mod hold;
pub mod image;
pub mod nodes;
pub mod prepull;
pub mod queue;
pub mod report;
pub mod requeue;
pub mod run;
pub mod share;
pub mod shim;
pub mod show;
pub mod srun;
pub mod step;
pub mod submit;
pub mod update;

/// A job id argument (`wharf show 12`, `wharf cancel 12_3`), checked before it goes into a
/// request's path: `ID` or `ARRAYID_TASKID`, digits only.
pub fn job_arg(text: &str) -> Result<String, String> {
    match wharf_api::job::parse_job_ref(text) {
        Some(_) => Ok(text.to_string()),
        None => Err(format!(
            "{:?} is not a job id: write ID, or ARRAYID_TASKID for one task of an array (12, 12_3)",
            crate::output::clean(text)
        )),
    }
}

#[cfg(test)]
mod tests {
    /// What reaches a request's path is a job id and nothing else: before, `'1 '` failed with
    /// "invalid uri character", `'1?x=1'` and `%31` showed job 1, and `'186/cancel'` got a
    /// bare HTTP 405.
    #[test]
    fn a_job_argument_is_digits_or_an_array_task() {
        for ok in ["1", "12_3", "18446744073709551615"] {
            assert_eq!(super::job_arg(ok).as_deref(), Ok(ok));
        }
        for bad in [
            "",
            "1 ",
            "+5",
            "%31",
            "1?x=1",
            "186/cancel",
            "1_",
            "_1",
            "1_2_3",
            "a\u{7}",
        ] {
            let err = super::job_arg(bad).unwrap_err();
            assert!(err.contains("is not a job id"), "{bad:?}: {err}");
            assert!(!err.contains('\u{7}'), "{err}");
        }
    }
}
