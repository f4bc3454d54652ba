//! Tests of the output parsing, on lines as `zfs get -H -p` prints them.

use super::*;

#[test]
fn user_properties_count_only_when_set_on_the_dataset() {
    assert_eq!(
        parse_property_line("nfsprov:path\tns/a\tlocal"),
        Some(("nfsprov:path".into(), "ns/a".into()))
    );
    assert_eq!(
        parse_property_line("nfsprov:path\tns/a\tinherited from tank/v"),
        None
    );
    assert_eq!(parse_property_line("nfsprov:volume\t-\t-"), None);
    // Native properties are taken whatever their source.
    assert_eq!(
        parse_property_line("mounted\tyes\t-"),
        Some(("mounted".into(), "yes".into()))
    );
    assert_eq!(parse_property_line("no tabs here"), None);
}

#[test]
fn children_are_grouped_by_name_without_snapshots_or_grandchildren() {
    let output = "\
tank/v\tmounted\tyes\t-
tank/v/ns:a\tmounted\tyes\t-
tank/v/ns:a\tnfsprov:path\tns/a\tlocal
tank/v/ns:a@snap\tmounted\t-\t-
tank/v/ns:a/deeper\tmounted\tyes\t-
tank/v/:archive:42\tnfsprov:path\tns/b\tlocal
";
    let children = parse_children(output, "tank/v").unwrap();
    let names: Vec<&str> = children.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["tank/v/:archive:42", "tank/v/ns:a"]);
    assert_eq!(children[0].kind, ChildKind::Archived);
    assert!(children[1].is_ours() && children[1].is_mounted());
    assert!(parse_children("no-tab-line", "tank/v").is_err());
}

#[test]
fn origins_are_snapshots_only() {
    let output = "\
tank/v\torigin\t-\t-
tank/v/a\torigin\t-\t-
tank/v/a\tnfsprov:path\ta\tlocal
tank/v/b\torigin\ttank/v/a@nfsprov-clone-1-0\t-
tank/v/b\tnfsprov:path\tb\tlocal
";
    let children = parse_children(output, "tank/v").unwrap();
    assert_eq!(children[0].origin(), None);
    assert_eq!(children[1].origin(), Some("tank/v/a@nfsprov-clone-1-0"));
}

#[test]
fn snapshots_are_read_oldest_first_without_the_dataset_or_its_children() {
    let output = "\
tank/v/a\tcreatetxg\t10\t-
tank/v/a@late\tcreatetxg\t67\t-
tank/v/a@early\tcreatetxg\t49\t-
tank/v/ab@other\tcreatetxg\t12\t-
tank/v/a/child\tcreatetxg\t11\t-
";
    assert_eq!(
        parse_snapshots(output, "tank/v/a").unwrap(),
        [
            Snapshot {
                name: "tank/v/a@early".into(),
                createtxg: 49
            },
            Snapshot {
                name: "tank/v/a@late".into(),
                createtxg: 67
            },
        ]
    );
    assert!(parse_snapshots("tank/v/a@x\tcreatetxg\tmany\t-\n", "tank/v/a").is_err());
    assert!(parse_snapshots("no-tabs\n", "tank/v/a").is_err());
}
