//! Job arrays, as Slurm's `--array` writes them: one submit, one job record per task.
//!
//! ```text
//! --array 0-99        tasks 0 to 99
//! --array 1,3,5       tasks 1, 3 and 5
//! --array 0-15:4      tasks 0, 4, 8, 12
//! --array 0-99%8      at most 8 of them running at once
//! ```
//!
//! Each task runs with `WHARF_ARRAY_JOB_ID`/`WHARF_ARRAY_TASK_ID`, the array's
//! `WHARF_ARRAY_TASK_COUNT`/`_MIN`/`_MAX`/`_STEP` ([`ArrayShape`]) (and the `SLURM_` names) set,
//! and `%A`/`%a` in its output paths are the array job id and the task id.

use serde::{Deserialize, Serialize};

use crate::job::JobId;

/// Largest task id accepted by the parser; sites lower it with `[limits] max_array_size`.
pub const MAX_TASK_ID: u32 = 4_000_000;

/// The tasks of an array, as the user wrote them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct ArraySpec {
    /// Task ids, ascending, each once.
    pub tasks: Vec<u32>,
    /// Most tasks running at once (`%N`).
    pub throttle: Option<u32>,
}

/// One task of an array.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArrayTask {
    /// The array job's id: the id of its first task.
    pub job_id: JobId,
    /// This task's id.
    pub task_id: u32,
    /// Most tasks of the array running at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub throttle: Option<u32>,
    /// The whole array's task count and range (all zero in records kept before it was).
    #[serde(default, skip_serializing_if = "ArrayShape::is_unknown")]
    pub shape: ArrayShape,
}

/// An array's task count, lowest and highest task id, and the step between its task ids:
/// Slurm's `SLURM_ARRAY_TASK_COUNT`, `_MIN`, `_MAX` and `_STEP`. The step is the common
/// difference when the ids are evenly spaced (`0-15:4`: 4), else 1, as Slurm gives it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ArrayShape {
    /// Tasks in the array.
    pub count: u32,
    /// Lowest task id.
    pub min: u32,
    /// Highest task id.
    pub max: u32,
    /// Step between task ids.
    pub step: u32,
}

impl ArrayShape {
    /// True for a record kept before the shape was (no array has no task).
    pub fn is_unknown(&self) -> bool {
        self.count == 0
    }

    /// Where `task` is among the array's tasks (0 for the first), when the array is evenly
    /// spaced and `task` one of its ids: its tasks are stored in that order from the array's
    /// id, so task `task` is job `id + place`. `None` otherwise (not one of its ids, or an
    /// array whose ids are not evenly spaced, whose place can only be searched for).
    pub fn place(&self, task: u32) -> Option<u32> {
        let spaced = self.step > 0
            && u64::from(self.max.saturating_sub(self.min))
                == u64::from(self.step) * u64::from(self.count.saturating_sub(1));
        (spaced && (self.min..=self.max).contains(&task) && (task - self.min) % self.step == 0)
            .then(|| (task - self.min) / self.step)
    }
}

impl ArraySpec {
    /// The array's count, range and step.
    pub fn shape(&self) -> ArrayShape {
        let (Some(&min), Some(&max)) = (self.tasks.first(), self.tasks.last()) else {
            return ArrayShape::default();
        };
        let gaps: Vec<u32> = self.tasks.windows(2).map(|w| w[1] - w[0]).collect();
        let step = match gaps.first() {
            Some(&g) if gaps.iter().all(|&x| x == g) => g,
            _ => 1,
        };
        ArrayShape {
            count: u32::try_from(self.tasks.len()).unwrap_or(u32::MAX),
            min,
            max,
            step,
        }
    }
}

impl ArrayTask {
    /// `ARRAYID_TASKID`, as `squeue` shows it.
    pub fn label(&self) -> String {
        format!("{}_{}", self.job_id, self.task_id)
    }
}

/// Parses `--array` (see the module documentation).
pub fn parse_array(text: &str) -> Result<ArraySpec, String> {
    // The whole value is named unless the reason already quotes it.
    let bad = |why: String| {
        let whole = format!("{:?}", text.trim());
        let at = if why.contains(&whole) {
            String::new()
        } else {
            format!(" in {whole}")
        };
        format!("--array: {why}{at}; write e.g. 0-99, 1,3,5, 0-15:4 or 0-99%8")
    };
    let t = text.trim();
    let (list, throttle) = match t.split_once('%') {
        Some((l, n)) => {
            let n: u32 = n
                .trim()
                .parse()
                .ok()
                .filter(|&n| n > 0)
                .ok_or_else(|| bad(format!("%{n} is not a whole number of at least 1")))?;
            (l, Some(n))
        }
        None => (t, None),
    };
    // Digits only: `+5` is no task id. The cluster's own bound (`[limits] max_array_size`)
    // is checked by the controller, which knows it.
    let id = |s: &str| -> Result<u32, String> {
        let s = s.trim();
        if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad(format!(
                "{s:?} is not a task id (a whole number from 0)"
            )));
        }
        s.parse::<u32>()
            .ok()
            .filter(|&v| v <= MAX_TASK_ID)
            .ok_or_else(|| {
                bad(format!(
                    "task id {s} is over {MAX_TASK_ID}, the most Wharf allows (the \
                     cluster's max_array_size may be lower)"
                ))
            })
    };
    let mut tasks = Vec::new();
    for part in list.split(',') {
        let (range, step) = match part.split_once(':') {
            Some((r, s)) => {
                let s = id(s)?;
                if s == 0 {
                    return Err(bad("a step of 0".into()));
                }
                (r, s)
            }
            None => (part, 1),
        };
        let (lo, hi) = match range.split_once('-') {
            Some((a, b)) => (id(a)?, id(b)?),
            None if step != 1 => {
                return Err(bad(format!(
                    "{:?} has a step but no range before it",
                    part.trim()
                )))
            }
            None => (id(range)?, id(range)?),
        };
        if lo > hi {
            return Err(bad(format!("{lo}-{hi} runs backwards")));
        }
        tasks.extend((lo..=hi).step_by(step as usize));
        if tasks.len() > MAX_TASK_ID as usize {
            return Err(bad("too many tasks".into()));
        }
    }
    tasks.sort_unstable();
    tasks.dedup();
    Ok(ArraySpec { tasks, throttle })
}

impl TryFrom<String> for ArraySpec {
    type Error = String;
    fn try_from(text: String) -> Result<ArraySpec, String> {
        parse_array(&text)
    }
}

impl From<ArraySpec> for String {
    fn from(a: ArraySpec) -> String {
        a.to_string()
    }
}

impl std::fmt::Display for ArraySpec {
    /// Evenly spaced runs as `A-B` or `A-B:STEP`, the rest one by one: `0-3,7,9-21:4%2`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let t = &self.tasks;
        let mut parts: Vec<String> = Vec::new();
        let mut i = 0;
        while i < t.len() {
            let step = t.get(i + 1).map_or(0, |n| n - t[i]);
            let mut j = i;
            while step > 0 && j + 1 < t.len() && t[j + 1] - t[j] == step {
                j += 1;
            }
            let run = j - i + 1;
            if step == 1 && run >= 2 {
                parts.push(format!("{}-{}", t[i], t[j]));
            } else if step > 1 && run >= 3 {
                parts.push(format!("{}-{}:{step}", t[i], t[j]));
            } else {
                parts.push(t[i].to_string());
                j = i;
            }
            i = j + 1;
        }
        f.write_str(&parts.join(","))?;
        if let Some(n) = self.throttle {
            write!(f, "%{n}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_task_has_a_place_in_an_evenly_spaced_array_only() {
        let place = |spec: &str, task| parse_array(spec).unwrap().shape().place(task);
        assert_eq!(place("0-12:4", 0), Some(0));
        assert_eq!(place("0-12:4", 8), Some(2));
        assert_eq!(place("0-12:4", 12), Some(3));
        assert_eq!(place("0-12:4", 5), None, "not one of its ids");
        assert_eq!(place("0-12:4", 16), None, "past its last");
        assert_eq!(place("3-9", 3), Some(0));
        assert_eq!(place("3-9", 2), None);
        // Not evenly spaced: searched for, never guessed.
        assert_eq!(place("1,2,7", 2), None);
        assert_eq!(place("1,2,7", 7), None);
        assert_eq!(
            ArrayShape::default().place(0),
            None,
            "a record from before shapes"
        );
    }

    #[test]
    fn an_arrays_shape_is_its_count_range_and_even_step_else_one() {
        let shape = |t: &str| {
            let s = parse_array(t).unwrap().shape();
            (s.count, s.min, s.max, s.step)
        };
        assert_eq!(shape("0-6:3"), (3, 0, 6, 3));
        assert_eq!(shape("1,3,5%2"), (3, 1, 5, 2));
        assert_eq!(shape("1,2,5"), (3, 1, 5, 1));
        assert_eq!(shape("7"), (1, 7, 7, 1));
        assert!(ArrayShape::default().is_unknown());
        // Records kept before the shape was read as unknown, and stay so when written back.
        let old: ArrayTask = serde_json::from_str(r#"{"job_id":5,"task_id":2}"#).unwrap();
        assert!(old.shape.is_unknown());
        assert!(!serde_json::to_string(&old).unwrap().contains("shape"));
    }

    #[test]
    fn slurm_forms() {
        assert_eq!(parse_array("0-3").unwrap().tasks, vec![0, 1, 2, 3]);
        assert_eq!(parse_array("1,3,5").unwrap().tasks, vec![1, 3, 5]);
        assert_eq!(parse_array("0-15:4").unwrap().tasks, vec![0, 4, 8, 12]);
        let a = parse_array("0-99%8").unwrap();
        assert_eq!((a.tasks.len(), a.throttle), (100, Some(8)));
        assert_eq!(parse_array("5,1-2,2").unwrap().tasks, vec![1, 2, 5]);
        assert_eq!(
            parse_array("0-3,7,9-10%2").unwrap().to_string(),
            "0-3,7,9-10%2"
        );
        for bad in [
            "",
            "a",
            "3-1",
            "0-9%0",
            "0-9%",
            "1:2",
            "0-9:0",
            "-1",
            "0-99999999",
            "1,,2",
        ] {
            let e = parse_array(bad).unwrap_err();
            assert!(
                e.starts_with("--array:") && e.contains("0-99%8"),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn errors_name_no_wrong_limit_refuse_signs_and_say_things_once() {
        for (bad, says) in [
            ("+5", "\"+5\" is not a task id"),
            ("0-+5", "\"+5\" is not a task id"),
            ("1:+2", "\"+2\" is not a task id"),
            ("1:2", "\"1:2\" has a step but no range"),
            (
                "0-3,1:2",
                "\"1:2\" has a step but no range before it in \"0-3,1:2\"",
            ),
            ("0-99999999", "task id 99999999 is over 4000000"),
        ] {
            let e = parse_array(bad).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
            assert!(!e.contains("(0 to"), "{bad}: {e}");
            assert_eq!(e.matches(&format!("{bad:?}")).count(), 1, "{bad}: {e}");
        }
        assert!(parse_array("99999999")
            .unwrap_err()
            .contains("max_array_size may be lower"));
    }
}
