//! Properties of the contract's parsers over generated inputs: the path validator and the
//! request bodies never panic, and nothing outside the grammar is ever accepted.

use nfsprov_api_types::{
    ArchivePath, ArchiveRequest, CreateVolumeRequest, MAX_COMPONENT_BYTES, MAX_COMPONENTS,
    MAX_PATH_BYTES, Mode, ResizeVolumeRequest, VolumePath,
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

/// Whether `raw` is an archive id, checked independently of the validator: a path of the
/// grammar, then `@`, a time the `time` crate reads as a real instant, and an optional
/// counter from 1 to 99.
fn archive_in_grammar(raw: &str) -> bool {
    const STAMP: &[time::format_description::BorrowedFormatItem<'static>] = time::macros::format_description!(
        "[year][month][day]T[hour][minute][second].[subsecond digits:9]Z"
    );
    let Some((volume, entry)) = raw.rsplit_once('/') else {
        return false;
    };
    let Some(entry) = entry.strip_prefix('@') else {
        return false;
    };
    let (Some(stamp), Some(counter)) = (entry.get(..26), entry.get(26..)) else {
        return false;
    };
    // time 0.3.55 subtracts b'0' from each digit before checking it, which overflows (and
    // panics in a debug build) on any byte below '0' where a digit belongs; so only
    // strings with digits where the format wants digits are handed to it.
    let plausible = stamp
        .bytes()
        .enumerate()
        .all(|(i, b)| matches!(i, 8 | 15 | 25) || b.is_ascii_digit());
    in_grammar(volume)
        && plausible
        && time::PrimitiveDateTime::parse(stamp, STAMP).is_ok()
        && (counter.is_empty() || (1..=99).any(|n| counter == format!("-{n}")))
}

/// Archive ids and near misses: a path-like volume, then an entry built from fields in
/// and just out of range, with and without a counter, sometimes with a stray character.
fn archive_like() -> impl Strategy<Value = String> {
    let stamp = (
        0u32..=9999,
        0u32..=13,
        0u32..=32,
        0u32..=24,
        0u32..=60,
        0u32..=60,
        0u32..1_000_000_000,
    )
        .prop_map(|(y, mo, d, h, mi, s, n)| {
            format!("{y:04}{mo:02}{d:02}T{h:02}{mi:02}{s:02}.{n:09}Z")
        });
    let counter = prop_oneof![
        3 => Just(String::new()),
        2 => (0u32..=101).prop_map(|n| format!("-{n}")),
        1 => "-0[0-9]|-|--1|-1a|-99[0-9]",
    ];
    let stray = prop_oneof![
        6 => Just(String::new()),
        1 => r"[/@.\\\-Tz0 %\x00é]",
    ];
    (
        prop_oneof![3 => valid_path(), 1 => path_like()],
        prop_oneof![8 => Just("@"), 1 => Just(""), 1 => Just("@@")],
        stamp,
        counter,
        stray,
        0usize..40,
    )
        .prop_map(|(volume, at, stamp, counter, stray, position)| {
            let mut raw = format!("{volume}/{at}{stamp}{counter}");
            let position = raw.len().saturating_sub(position);
            if raw.is_char_boundary(position) {
                raw.insert_str(position, &stray);
            }
            raw
        })
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
                    Just("retention_days".to_owned()),
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
        let _ = serde_json::from_slice::<ArchivePath>(&body);
        let _ = serde_json::from_slice::<ArchiveRequest>(&body);
    }

    #[test]
    fn archive_ids_are_accepted_exactly_in_the_grammar(raw in archive_like()) {
        let parsed = ArchivePath::parse(&raw);
        prop_assert_eq!(parsed.is_ok(), archive_in_grammar(&raw), "{:?} -> {:?}", raw, parsed);
        if let Ok(id) = parsed {
            prop_assert_eq!(id.to_string(), raw.as_str());
            prop_assert!(id.volume().components().all(|c| c != "." && c != ".."));
            let json = serde_json::to_string(&id).unwrap();
            prop_assert_eq!(serde_json::from_str::<ArchivePath>(&json).unwrap(), id);
        }
    }

    #[test]
    fn arbitrary_strings_are_never_archive_ids_outside_the_grammar(raw in any::<String>()) {
        if ArchivePath::parse(&raw).is_ok() {
            prop_assert!(archive_in_grammar(&raw), "{:?}", raw);
        }
    }

    #[test]
    fn archive_bodies_never_panic_and_never_ask_for_zero_days(value in json_value()) {
        let body = serde_json::to_vec(&value).unwrap();
        if let Ok(request) = serde_json::from_slice::<ArchiveRequest>(&body) {
            prop_assert_ne!(request.retention_days, Some(0));
        }
    }

    #[test]
    fn octal_modes_parse_exactly_when_in_range(bits in 0u32..0o200000) {
        let text = format!("{bits:o}");
        let parsed = Mode::parse_octal(&text);
        prop_assert_eq!(parsed.is_ok(), bits <= Mode::MAX, "{} -> {:?}", text, parsed);
    }
}
