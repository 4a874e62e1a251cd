//! Property tests of host lists: expanding what [`compress`] wrote gives back the same set of
//! names, zero padding included; the order of the input does not matter; no text makes the
//! parser panic or build more hosts than its limit.

mod common;

use common::config;
use proptest::prelude::*;
use wharf_api::hostlist::{compress, expand, HostList, HostlistError};

/// Host names as clusters name them: a short prefix, often a number (padded or not), at times
/// a suffix after it.
fn host() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-c]{1,2}[0-9]{1,3}",
        "[a-c]{1,2}0[0-9]{1,2}",
        "[a-c]{1,2}",
        "[a-c][0-9]{1,2}-ib",
        "[0-9]{1,2}",
    ]
}

fn sorted(mut v: Vec<String>) -> Vec<String> {
    v.sort();
    v.dedup();
    v
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn compressed_lists_expand_to_the_same_names(names in prop::collection::vec(host(), 0..40)) {
        let text = compress(&names);
        if names.is_empty() {
            prop_assert_eq!(text, "");
            return Ok(());
        }
        let back = expand(&text, 1000).unwrap();
        prop_assert_eq!(sorted(back.clone()), sorted(names.clone()), "{}", text);
        // Each name once, and compressing again writes the same text.
        prop_assert_eq!(back.len(), sorted(names.clone()).len(), "{}", text);
        prop_assert_eq!(compress(&back), text.clone());
        let mut reversed = names.clone();
        reversed.reverse();
        prop_assert_eq!(compress(&reversed), text.clone());
        let list = HostList::parse(&text).unwrap();
        prop_assert_eq!(list.names(), &back[..]);
        prop_assert_eq!(list.to_string(), text);
    }

    #[test]
    fn any_text_is_refused_or_bounded(text in prop_oneof![
        "[a-c0-9\\[\\],\\- ]{0,30}",
        any::<String>(),
    ], max in 1usize..200) {
        match expand(&text, max) {
            Ok(names) => {
                prop_assert!(!names.is_empty() && names.len() <= max);
                prop_assert!(names.iter().all(|n| !n.is_empty()));
            }
            Err(HostlistError::TooMany { count, .. }) => prop_assert!(count > max as u128),
            Err(e) => prop_assert!(e.to_string().starts_with("host list "), "{e}"),
        }
    }
}
