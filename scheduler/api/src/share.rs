//! The fair-share tree as `wharf share` shows it (Slurm's `sshare`): every account and every
//! user with jobs or usage, in tree order, with its shares and decayed usage next to its
//! siblings', its level fair share, and each user's fair-share factor (the one priority uses).

use serde::{Deserialize, Serialize};

/// One line of the tree: an account, or a user in an account.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ShareRow {
    /// How deep in the tree: 0 for the root's children.
    pub depth: u32,
    /// The account (for a user's line, the account it is in).
    pub account: String,
    /// The user, on a user's line.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// Shares as configured (a user or account not configured has 1).
    pub shares: f64,
    /// Shares as a fraction of its siblings' (0 to 1).
    pub norm_shares: f64,
    /// Usage: billing-weighted TRES-seconds, decayed by the half-life, running jobs' use so
    /// far included; an account's is its subtree's.
    pub usage: f64,
    /// Usage as a fraction of its siblings' (0 to 1; 0 when none of them has used any).
    pub norm_usage: f64,
    /// Its level fair share, `norm_shares / norm_usage`: siblings are ranked by it, highest
    /// first. `None` where it has used nothing (infinite: first among its siblings).
    pub level_fs: Option<f64>,
    /// A user's fair-share factor, 0 to 1: its rank among every user, as priority takes it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub factor: Option<f64>,
}

/// `GET /v1/share`: the whole tree, as the next scheduling pass would rank it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ShareTree {
    /// Usage halves every this many ms (0: never decays).
    pub half_life_ms: u64,
    /// Depth first: each account, its users by name, then its sub-accounts by name.
    pub rows: Vec<ShareRow>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_account_line_has_no_user_or_factor_and_an_infinite_level_is_null() {
        let row = ShareRow {
            depth: 0,
            account: "bio".into(),
            user: None,
            shares: 2.0,
            norm_shares: 0.5,
            usage: 0.0,
            norm_usage: 0.0,
            level_fs: None,
            factor: None,
        };
        let json = serde_json::to_value(&row).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"depth": 0, "account": "bio", "shares": 2.0, "norm_shares": 0.5,
                "usage": 0.0, "norm_usage": 0.0, "level_fs": null})
        );
        assert_eq!(serde_json::from_value::<ShareRow>(json).unwrap(), row);
    }
}
