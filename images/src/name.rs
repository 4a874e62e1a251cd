//! Image names: what a user may call an image in the store.
//!
//! Names are only ever hashed to find an image's directory, never used as paths, but they are
//! shown in listings and logs and typed in job files, so they stay plain: registry-like
//! references such as `nvcr.io/nvidia/pytorch:24.01-py3` or `alpine@sha256:...` are fine.

use crate::error::{ImageError, Result};

/// Longest accepted name, in bytes.
pub const MAX_NAME_LEN: usize = 255;

/// The name a job uses to run on the node's own filesystem; no stored image may take it.
pub const RESERVED_HOST: &str = "host";

/// Checks that `name` can name an image: 1 to 255 characters among ASCII letters, digits and
/// `. _ - : / @`, no `.` or `..` path component, and not the reserved `host`.
///
/// Errors: [`ErrorKind::InvalidInput`](crate::ErrorKind::InvalidInput), saying what is wrong.
pub fn validate_name(name: &str) -> Result<()> {
    if name.is_empty() {
        return Err(ImageError::invalid("image name is empty"));
    }
    if name.len() > MAX_NAME_LEN {
        return Err(ImageError::invalid(format!(
            "image name is {} bytes long; the limit is {MAX_NAME_LEN}",
            name.len()
        )));
    }
    if let Some(bad) = name.chars().find(|c| !allowed(*c)) {
        return Err(ImageError::invalid(format!(
            "image name {name:?} contains {bad:?}; use letters, digits and . _ - : / @"
        )));
    }
    if name.split('/').any(|part| part == "." || part == "..") {
        return Err(ImageError::invalid(format!(
            "image name {name:?} has a '.' or '..' component"
        )));
    }
    if name == RESERVED_HOST {
        return Err(ImageError::invalid(
            "image name \"host\" is reserved: it runs jobs on the node's own filesystem",
        ));
    }
    Ok(())
}

fn allowed(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | ':' | '/' | '@')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_registry_references() {
        for name in [
            "alpine",
            "ubuntu:24.04",
            "nvcr.io/nvidia/pytorch:24.01-py3",
            "localhost:5000/team/app@sha256:0123abcd",
            "a_b-c.d",
            "hosts",
        ] {
            assert!(validate_name(name).is_ok(), "{name}");
        }
        assert!(validate_name(&"x".repeat(MAX_NAME_LEN)).is_ok());
    }

    #[test]
    fn rejects_bad_names() {
        let long = "x".repeat(MAX_NAME_LEN + 1);
        for name in [
            "", "host", "a b", "a/../b", "..", ".", "./a", "a/.", "é", "a\0b", "a;b", &long,
        ] {
            let err = validate_name(name).expect_err(name);
            assert_eq!(err.kind, crate::ErrorKind::InvalidInput, "{name}");
        }
    }
}
