//! Properties of the contract's parsers over generated inputs: the path validator and the
//! request bodies never panic, and nothing outside the grammar is ever accepted.

use nfsprov_api_types::{
    CreateVolumeRequest, MAX_COMPONENT_BYTES, MAX_COMPONENTS, MAX_PATH_BYTES, Mode,
    ResizeVolumeRequest, VolumePath,
};
use proptest::prelude::*;

/// Whether `path` is in the grammar, checked independently of the validator.
fn in_grammar(path: &str) -> bool {
    let components: Vec<&str> = path.split('/').collect();
    !path.is_empty()
        && path.len() <= MAX_PATH_BYTES
        && components.len() <= MAX_COMPONENTS
        && components.iter().all(|c| {
            !c.is_empty()
                && c.len() <= MAX_COMPONENT_BYTES
                && !c.starts_with('.')
                && c.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        })
}

/// Strings built from the characters that matter to the validator: the allowed ones, the
/// separator, dots, and a few that must never pass (NUL, backslash, space, non-ASCII).
fn path_like() -> impl Strategy<Value = String> {
    proptest::collection::vec(
        prop_oneof![
            4 => proptest::char::ranges(vec!['a'..='z', 'A'..='Z', '0'..='9'].into()),
            2 => Just('/'),
            2 => Just('.'),
            1 => Just('_'),
            1 => Just('-'),
            1 => prop_oneof![
                Just('\0'),
                Just('\\'),
                Just(' '),
                Just('%'),
                Just('\n'),
                Just('é'),
                Just('\u{202e}'),
            ],
        ],
        0..40,
    )
    .prop_map(|chars| chars.into_iter().collect())
}

/// Paths of the grammar, including the longest ones.
fn valid_path() -> impl Strategy<Value = String> {
    let component = "[A-Za-z0-9_-][A-Za-z0-9._-]{0,254}";
    proptest::collection::vec(component, 1..=MAX_COMPONENTS)
        .prop_map(|components| components.join("/"))
        .prop_filter("the whole path fits", |p| p.len() <= MAX_PATH_BYTES)
}

/// Arbitrary JSON values, nested a few levels.
fn json_value() -> impl Strategy<Value = serde_json::Value> {
    let leaf = prop_oneof![
        Just(serde_json::Value::Null),
        any::<bool>().prop_map(serde_json::Value::from),
        any::<i64>().prop_map(serde_json::Value::from),
        any::<u64>().prop_map(serde_json::Value::from),
        any::<f64>().prop_map(serde_json::Value::from),
        ".{0,20}".prop_map(serde_json::Value::from),
        "0?[0-7]{1,6}".prop_map(serde_json::Value::from),
    ];
    leaf.prop_recursive(4, 64, 8, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(serde_json::Value::from),
            proptest::collection::btree_map(
                prop_oneof![
                    Just("mode".to_owned()),
                    Just("uid".to_owned()),
                    Just("gid".to_owned()),
                    Just("capacity_bytes".to_owned()),
                    Just("owner".to_owned()),
                    Just("quota".to_owned()),
                    Just("pvc_namespace".to_owned()),
                    Just("pvc_name".to_owned()),
                    Just("pv_name".to_owned()),
                    "[a-z_]{1,12}",
                ],
                inner,
                0..6
            )
            .prop_map(|map| serde_json::Value::Object(map.into_iter().collect())),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn the_validator_accepts_exactly_the_grammar(raw in path_like()) {
        let parsed = VolumePath::parse(&raw);
        prop_assert_eq!(parsed.is_ok(), in_grammar(&raw), "{:?} -> {:?}", raw, parsed);
        if let Ok(path) = parsed {
            prop_assert_eq!(path.as_str(), raw.as_str());
            prop_assert!(path.components().all(|c| c != "." && c != ".."));
        }
    }

    #[test]
    fn arbitrary_strings_never_pass_outside_the_grammar(raw in any::<String>()) {
        if let Ok(path) = VolumePath::parse(&raw) {
            prop_assert!(in_grammar(path.as_str()), "{:?}", raw);
        }
    }

    #[test]
    fn every_path_of_the_grammar_is_accepted_and_round_trips(raw in valid_path()) {
        let path = VolumePath::parse(&raw).unwrap();
        prop_assert_eq!(path.file_name(), raw.rsplit('/').next().unwrap());
        let json = serde_json::to_string(&path).unwrap();
        let back: VolumePath = serde_json::from_str(&json).unwrap();
        prop_assert_eq!(back, path);
    }

    #[test]
    fn create_bodies_never_panic_and_keep_modes_in_range(value in json_value()) {
        let body = serde_json::to_vec(&value).unwrap();
        if let Ok(request) = serde_json::from_slice::<CreateVolumeRequest>(&body) {
            prop_assert!(request.mode.bits() <= Mode::MAX);
        }
        let _ = serde_json::from_slice::<ResizeVolumeRequest>(&body);
    }

    #[test]
    fn raw_bytes_as_bodies_never_panic(body in proptest::collection::vec(any::<u8>(), 0..256)) {
        let _ = serde_json::from_slice::<CreateVolumeRequest>(&body);
        let _ = serde_json::from_slice::<ResizeVolumeRequest>(&body);
        let _ = serde_json::from_slice::<VolumePath>(&body);
    }

    #[test]
    fn octal_modes_parse_exactly_when_in_range(bits in 0u32..0o200000) {
        let text = format!("{bits:o}");
        let parsed = Mode::parse_octal(&text);
        prop_assert_eq!(parsed.is_ok(), bits <= Mode::MAX, "{} -> {:?}", text, parsed);
    }
}
