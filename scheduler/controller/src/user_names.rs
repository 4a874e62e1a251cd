//! The names of the users who call, by uid, kept for a few seconds ([`crate::kept`]).
//!
//! Every request over the Unix socket names its caller by the uid the kernel gives with the
//! connection, and the controller needs the user's name (their jobs, their accounts). Looking
//! it up reads the system's user database each time (with plain files, opening and parsing
//! `/etc/passwd`): a twentieth of the controller's work under a flood of submits.

use std::time::Instant;

use crate::kept::Kept;

/// Users' names by uid.
#[derive(Debug, Default)]
pub struct UserNames(Kept<u32, String>);

impl UserNames {
    /// The name of `uid` (its number, for a uid with no user entry, which is not kept).
    pub fn of(&self, uid: u32) -> String {
        (self
            .0
            .get_or(&uid, Instant::now(), |&uid| lookup(uid).ok_or(())))
        .unwrap_or_else(|()| uid.to_string())
    }
}

/// The name of `uid` in the system's user database, if it has an entry there.
fn lookup(uid: u32) -> Option<String> {
    nix::unistd::User::from_uid(uid.into())
        .ok()
        .flatten()
        .map(|u| u.name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_is_named_from_the_user_database_and_a_uid_without_an_entry_by_its_number() {
        let names = UserNames::default();
        assert_eq!(names.of(0), "root");
        assert_eq!(names.of(u32::MAX - 7), (u32::MAX - 7).to_string());
        assert_eq!(names.0.count(), 1, "only the name found is kept");
    }
}
