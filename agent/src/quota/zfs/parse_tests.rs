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
