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
mod percent;
pub mod prepull;
pub mod queue;
pub mod report;
pub mod requeue;
pub mod run;
pub mod share;
pub mod shim;
pub mod show;
pub mod sinfo;
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

/// Most tasks one `ID_[LIST]` argument may name.
const MAX_LISTED_TASKS: usize = 10_000;

/// An array's tasks named as scancel names them, `ID_[LIST]` (LIST as `--array` takes it:
/// `6-10`, `1,3,5`, `0-15:4`), each as `ID_TASK`; `None` when `text` is not of that form.
pub fn task_list(text: &str) -> Option<Result<Vec<String>, String>> {
    let (id, rest) = text.split_once("_[")?;
    let list = rest.strip_suffix(']')?;
    if wharf_api::job::parse_job_ref(id).is_none() || id.contains('_') {
        return Some(Err(format!(
            "{:?}: write ARRAYID_[LIST], e.g. 20_[6-10] or 20_[1,3]",
            crate::output::clean(text)
        )));
    }
    let tasks = match wharf_api::array::parse_array(list) {
        Ok(a) if a.throttle.is_some() => Err("a %N throttle names no task".to_string()),
        Ok(a) if a.tasks.len() > MAX_LISTED_TASKS => Err(format!(
            "{} tasks; at most {MAX_LISTED_TASKS} may be named at once",
            a.tasks.len()
        )),
        Ok(a) => Ok(a.tasks),
        Err(e) => Err(e),
    };
    Some(
        tasks
            .map(|t| t.iter().map(|t| format!("{id}_{t}")).collect())
            .map_err(|e| format!("{}: {e}", crate::output::clean(text))),
    )
}

/// A job or step argument of `wharf cancel`: [`job_arg`]'s forms, `ID_[LIST]` for some tasks
/// of an array ([`task_list`]), or `JOB.STEP` for one step of a job (`12.0`, `12_3.1`), as
/// scancel takes them.
pub fn job_or_step_arg(text: &str) -> Result<String, String> {
    if let Some(listed) = task_list(text) {
        return listed.map(|_| text.to_string());
    }
    match text.rsplit_once('.') {
        Some((job, step)) if wharf_api::job::parse_job_ref(job).is_some() => {
            match step.parse::<u32>() {
                Ok(_) if step.bytes().all(|b| b.is_ascii_digit()) => Ok(text.to_string()),
                _ => Err(format!(
                    "{:?} is not a step: write JOB.STEP with the step's number (12.0); the \
                     batch step is the job itself (cancel JOB)",
                    crate::output::clean(text)
                )),
            }
        }
        _ => job_arg(text),
    }
}

/// A user a filter names (`-u`): a name as it is, or a uid as Slurm's tools take one, as the
/// name this host knows for it (a name of digits that is a user's stays a name).
pub fn user_name(word: &str) -> String {
    use nix::unistd::{Uid, User};
    let word = word.trim();
    let digits = !word.is_empty() && word.bytes().all(|b| b.is_ascii_digit());
    if digits && !matches!(User::from_name(word), Ok(Some(_))) {
        let uid = word.parse().ok().map(Uid::from_raw);
        if let Some(Ok(Some(u))) = uid.map(User::from_uid) {
            return u.name;
        }
    }
    word.to_string()
}

/// [`user_name`] for the jobs of now (`wharf queue -u`, `wharf cancel -u`): a name this host
/// does not know is refused, as squeue refuses it ("Invalid user"), since it matches no job
/// and an empty answer would read as "no jobs" rather than "no such user". A uid no one has
/// stays as written: the controller lists such a user's jobs under the number. (`wharf acct`
/// takes names as written: accounting outlives users.)
pub fn known_user(word: &str) -> anyhow::Result<String> {
    use nix::unistd::User;
    let name = user_name(word);
    let digits = !name.is_empty() && name.bytes().all(|b| b.is_ascii_digit());
    match User::from_name(&name) {
        Ok(Some(_)) => Ok(name),
        _ if digits => Ok(name),
        Ok(None) => anyhow::bail!(
            "invalid user: {:?}: this host knows no user of that name; give a user name or \
             uid that `id` knows here",
            crate::output::clean(&name)
        ),
        Err(e) => anyhow::bail!(
            "invalid user: {:?}: looking it up failed ({e}); give a uid instead",
            crate::output::clean(&name)
        ),
    }
}

#[cfg(test)]
mod tests {
    /// What reaches a request's path is a job id and nothing else: before, `'1 '` failed with
    /// "invalid uri character", `'1?x=1'` and `%31` showed job 1, and `'186/cancel'` got a
    /// bare HTTP 405.
    #[test]
    fn an_arrays_tasks_are_listed_in_brackets_as_scancel_takes_them() {
        let listed = |t: &str| super::task_list(t).map(|r| r.map_err(|e| e.to_string()));
        assert_eq!(
            listed("20_[6-8,10]"),
            Some(Ok(vec![
                "20_6".into(),
                "20_7".into(),
                "20_8".into(),
                "20_10".into()
            ]))
        );
        assert_eq!(listed("20_3"), None);
        assert_eq!(listed("20"), None);
        for bad in ["20_[]", "20_[1-3%2]", "x_[1]", "20_1_[2]", "20_[0-99999]"] {
            assert!(matches!(listed(bad), Some(Err(_))), "{bad}");
            assert!(super::job_or_step_arg(bad).is_err(), "{bad}");
        }
        assert_eq!(
            super::job_or_step_arg("20_[1,3]").as_deref(),
            Ok("20_[1,3]")
        );
    }

    #[test]
    fn a_user_is_named_by_name_or_by_uid() {
        assert_eq!(super::user_name("0"), "root");
        assert_eq!(super::user_name(" root "), "root");
        assert_eq!(super::user_name("ann"), "ann");
        // A uid no one has stays as written: it matches no job.
        assert_eq!(super::user_name("4294967000"), "4294967000");
        let known = |w: &str| super::known_user(w).map_err(|e| e.to_string());
        assert_eq!(known(" 0").as_deref(), Ok("root"));
        assert_eq!(known("root").as_deref(), Ok("root"));
        assert_eq!(known("4294967000").as_deref(), Ok("4294967000"));
        // A name no one has is refused, naming it, as squeue's "Invalid user".
        let e = known("no-such-user-wharf").unwrap_err();
        assert!(
            e.contains("invalid user: \"no-such-user-wharf\": this host knows no user"),
            "{e}"
        );
    }

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

    /// `wharf cancel` also takes `JOB.STEP`, whose both halves reach the path checked.
    #[test]
    fn a_step_argument_is_a_job_and_a_steps_number() {
        for ok in ["1", "12_3", "12.0", "12_3.15"] {
            assert_eq!(super::job_or_step_arg(ok).as_deref(), Ok(ok));
        }
        for bad in ["12.batch", "12.", "12.+1", "12.0/x", "12.99999999999"] {
            let err = super::job_or_step_arg(bad).unwrap_err();
            assert!(err.contains("is not a step"), "{bad:?}: {err}");
        }
        for bad in [".0", "a.0", "12 .0", "12.1.2"] {
            let err = super::job_or_step_arg(bad).unwrap_err();
            assert!(err.contains("is not a job id"), "{bad:?}: {err}");
        }
    }
}
