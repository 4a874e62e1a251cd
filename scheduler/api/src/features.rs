//! Node features and the `--constraint` expressions that ask for them.
//!
//! A node's admin lists its features (`[agent] features = ["ib", "nvme"]`); a job asks with
//! `--constraint` (`-C`): feature names joined by `&` (all of them) and `|` (any of them), `&`
//! binding tighter, as in Slurm (`ib&nvme|bigmem` is "ib and nvme, or bigmem"). GPU types are
//! not features: they are asked for with `--gpus TYPE:COUNT`.
//!
//! ```
//! use wharf_api::features::Constraint;
//! let c = Constraint::parse("ib&nvme|bigmem").unwrap();
//! assert!(c.matches(&["nvme".into(), "ib".into()]));
//! assert!(c.matches(&["bigmem".into()]));
//! assert!(!c.matches(&["ib".into()]));
//! assert_eq!(c.to_string(), "ib&nvme|bigmem");
//! ```

use std::fmt;

use serde::{Deserialize, Serialize};

/// Most features one node may report.
pub const MAX_FEATURES: usize = 64;
/// Most feature names one constraint may join.
pub const MAX_TERMS: usize = 64;

/// Checks a feature name: 1 to 64 letters, digits, `-`, `_` or `.`.
pub fn validate_feature(name: &str) -> Result<(), String> {
    if crate::job::is_name(name) {
        Ok(())
    } else {
        Err(format!(
            "{:?} is not a feature name: use 1 to 64 letters, digits, '-', '_' or '.'",
            crate::text::bounded(name, 80)
        ))
    }
}

/// Checks the features a node reports: valid names, at most [`MAX_FEATURES`], none twice.
pub fn validate_features(features: &[String]) -> Result<(), String> {
    if features.len() > MAX_FEATURES {
        return Err(format!(
            "{} features; the limit is {MAX_FEATURES}",
            features.len()
        ));
    }
    for (i, f) in features.iter().enumerate() {
        validate_feature(f)?;
        if features[..i].contains(f) {
            return Err(format!("feature {f:?} is listed twice"));
        }
    }
    Ok(())
}

/// A `--constraint`: any one of its alternatives, each a set of features a node must all have.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Constraint {
    any_of: Vec<Vec<String>>,
}

impl Constraint {
    /// Parses `a&b|c`. The error names the bad part.
    pub fn parse(text: &str) -> Result<Constraint, String> {
        let text = text.trim();
        let whole = || crate::text::bounded(text, 80).into_owned();
        if text.is_empty() {
            return Err("--constraint is empty; name a feature, e.g. -C ib".into());
        }
        let mut any_of = Vec::new();
        let mut terms = 0;
        for alt in text.split('|') {
            let mut all_of = Vec::new();
            for name in alt.split('&') {
                let name = name.trim();
                if name.is_empty() {
                    return Err(format!(
                        "--constraint {:?}: a '&' or '|' has no feature on one side",
                        whole()
                    ));
                }
                validate_feature(name).map_err(|e| {
                    format!(
                        "--constraint {:?}: {e}; join features with & (and) or | (or)",
                        whole()
                    )
                })?;
                terms += 1;
                if !all_of.iter().any(|n| n == name) {
                    all_of.push(name.to_string());
                }
            }
            any_of.push(all_of);
        }
        if terms > MAX_TERMS {
            return Err(format!(
                "--constraint names {terms} features; the limit is {MAX_TERMS}"
            ));
        }
        Ok(Constraint { any_of })
    }

    /// True when a node with `features` satisfies it.
    pub fn matches(&self, features: &[String]) -> bool {
        self.any_of
            .iter()
            .any(|all| all.iter().all(|f| features.contains(f)))
    }

    /// Every feature it names, each once, in the order written.
    pub fn names(&self) -> Vec<&str> {
        let mut out: Vec<&str> = Vec::new();
        for n in self.any_of.iter().flatten() {
            if !out.contains(&n.as_str()) {
                out.push(n);
            }
        }
        out
    }
}

impl fmt::Display for Constraint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let alts: Vec<String> = self.any_of.iter().map(|a| a.join("&")).collect();
        f.write_str(&alts.join("|"))
    }
}

impl TryFrom<String> for Constraint {
    type Error = String;
    fn try_from(text: String) -> Result<Constraint, String> {
        Constraint::parse(&text)
    }
}

impl From<Constraint> for String {
    fn from(c: Constraint) -> String {
        c.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn and_binds_tighter_than_or() {
        let c = Constraint::parse(" ib & nvme | bigmem ").unwrap();
        assert_eq!(c.to_string(), "ib&nvme|bigmem");
        assert_eq!(c.names(), ["ib", "nvme", "bigmem"]);
        let has = |f: &[&str]| c.matches(&f.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        assert!(has(&["ib", "nvme"]));
        assert!(has(&["bigmem", "x"]));
        assert!(!has(&["ib"]));
        assert!(!has(&[]));
    }

    #[test]
    fn bad_constraints_say_why() {
        for (text, why) in [
            ("", "is empty"),
            ("ib&", "no feature on one side"),
            ("|ib", "no feature on one side"),
            ("(ib)", "is not a feature name"),
            ("ib,nvme", "is not a feature name"),
            ("gpu*2", "is not a feature name"),
        ] {
            let err = Constraint::parse(text).unwrap_err();
            assert!(err.contains(why), "{text}: {err}");
        }
        let many = vec!["f"; MAX_TERMS + 1].join("&");
        assert!(Constraint::parse(&many)
            .unwrap_err()
            .contains("the limit is"));
    }

    #[test]
    fn node_features_are_checked() {
        assert!(validate_features(&["ib".into(), "nvme".into()]).is_ok());
        assert!(validate_features(&["ib".into(), "ib".into()])
            .unwrap_err()
            .contains("twice"));
        assert!(validate_features(&["a b".into()])
            .unwrap_err()
            .contains("is not a feature name"));
        let many: Vec<String> = (0..=MAX_FEATURES).map(|i| format!("f{i}")).collect();
        assert!(validate_features(&many).unwrap_err().contains("the limit"));
    }
}
