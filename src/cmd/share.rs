//! `wharf share`: the fair-share tree (Slurm's `sshare`).

use anyhow::Result;
use wharf_api::share::{ShareRow, ShareTree};
use wharf_client::{Client, ClientError, Endpoint};

use crate::output;

/// Arguments.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Every user's line (admins only; others see their own lines and the accounts above
    /// them, admins every account and their own lines).
    #[arg(short, long)]
    all: bool,
    /// Print JSON (the same lines as the table).
    #[arg(long)]
    json: bool,
}

/// Runs the command.
pub async fn run(socket: &str, args: Args) -> Result<i32> {
    let client = Client::new(Endpoint::parse(socket), None);
    let tree: ShareTree = match client.get(&format!("/v1/share?all={}", args.all)).await {
        Ok(t) => t,
        Err(ClientError::Api { error, .. }) => {
            eprintln!("error: {}", output::clean(&error.error));
            return Ok(1);
        }
        Err(e) => return Err(e.into()),
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&tree)?);
        return Ok(0);
    }
    output::print_table(&render(&tree));
    println!(
        "Usage is billing-weighted CPU, memory and GPU seconds, halving every {}; at each \
         level the line with the highest LEVEL_FS (shares over usage, among its siblings) \
         ranks first, and FAIRSHARE is a user's rank among all users (1: first).",
        half_life(tree.half_life_ms)
    );
    Ok(0)
}

/// The table: accounts indented by depth, users under theirs.
fn render(tree: &ShareTree) -> output::Table {
    let mut t = output::table(&[
        "ACCOUNT",
        "USER",
        "SHARES",
        "NORM_SHARES",
        "USAGE",
        "NORM_USAGE",
        "LEVEL_FS",
        "FAIRSHARE",
    ]);
    for r in &tree.rows {
        let ShareRow {
            depth,
            account,
            user,
            ..
        } = r;
        let indent = "  ".repeat(*depth as usize);
        match user {
            Some(u) => {
                t.cell_fmt(format_args!("{indent}"));
                t.cell(u);
            }
            None => {
                t.cell_fmt(format_args!("{indent}{account}"));
                t.cell("");
            }
        }
        t.cell_fmt(format_args!("{}", r.shares));
        t.cell_fmt(format_args!("{:.3}", r.norm_shares));
        t.cell_fmt(format_args!("{:.0}", r.usage));
        t.cell_fmt(format_args!("{:.3}", r.norm_usage));
        match r.level_fs {
            Some(fs) => t.cell_fmt(format_args!("{fs:.3}")),
            None => t.cell("inf"),
        }
        match r.factor {
            Some(f) => t.cell_fmt(format_args!("{f:.4}")),
            None => t.cell(""),
        }
        t.end_row();
    }
    t
}

/// `ms` as days or hours.
fn half_life(ms: u64) -> String {
    if ms == 0 {
        return "never (no decay)".into();
    }
    match ms / 1000 {
        0 => format!("{ms} ms"),
        s if s % 86_400 == 0 => format!("{} days", s / 86_400),
        s if s % 3_600 == 0 => format!("{} hours", s / 3_600),
        s => format!("{s} seconds"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(depth: u32, account: &str, user: Option<&str>, factor: Option<f64>) -> ShareRow {
        ShareRow {
            depth,
            account: account.into(),
            user: user.map(str::to_string),
            shares: 1.0,
            norm_shares: 0.5,
            usage: 7200.0,
            norm_usage: 0.25,
            level_fs: user.map(|_| 2.0),
            factor,
        }
    }

    #[test]
    fn accounts_are_indented_and_users_sit_under_them() {
        let tree = ShareTree {
            half_life_ms: 7 * 86_400_000,
            rows: vec![
                row(0, "physics", None, None),
                row(1, "physics", Some("ann"), Some(0.5)),
                row(1, "physics-lab\u{1b}[2J", None, None),
            ],
        };
        let mut out = Vec::new();
        render(&tree).write(&mut out).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "ACCOUNT             USER  SHARES  NORM_SHARES  USAGE  NORM_USAGE  LEVEL_FS  FAIRSHARE\n\
             physics                   1       0.500        7200   0.250       inf\n\
             \x20                   ann   1       0.500        7200   0.250       2.000     0.5000\n\
             \x20 physics-lab\\e[2J        1       0.500        7200   0.250       inf\n"
        );
        assert_eq!(half_life(7 * 86_400_000), "7 days");
        assert_eq!(half_life(0), "never (no decay)");
        assert_eq!(half_life(5_400_000), "5400 seconds");
        assert_eq!(half_life(500), "500 ms");
    }
}
