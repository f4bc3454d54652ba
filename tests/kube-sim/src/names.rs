//! The naming rules of the API server (RFC 1123 labels and subdomains, qualified names,
//! label values), with its exact messages; every validator of the simulator uses them.

use crate::resources::Kind;

pub const SUBDOMAIN_MSG: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";
pub const LABEL_MSG: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')";
pub const QUALIFIED_MSG: &str = "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')";

fn dns_label_ok(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

pub fn is_dns1123_label(s: &str) -> bool {
    dns_label_ok(s)
}

pub fn is_dns1123_subdomain(s: &str) -> bool {
    // The real regex does not cap each label at 63, only the whole at 253.
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|l| {
            !l.is_empty()
                && l.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        })
}

fn qualified_name_part_ok(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
        && s.as_bytes()[0].is_ascii_alphanumeric()
        && s.as_bytes()[s.len() - 1].is_ascii_alphanumeric()
}

/// `prefix/name` or `name`, as label keys, annotation keys and finalizers must be.
pub fn qualified_name_errors(s: &str) -> Option<String> {
    let (prefix, name) = match s.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, s),
    };
    if let Some(p) = prefix
        && !is_dns1123_subdomain(p)
    {
        return Some(format!("prefix part {SUBDOMAIN_MSG}"));
    }
    if name.contains('/') {
        return Some("a qualified name must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]') with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')".into());
    }
    if !qualified_name_part_ok(name) {
        return Some(QUALIFIED_MSG.into());
    }
    None
}

pub fn label_value_ok(s: &str) -> bool {
    s.is_empty() || (s.len() <= 63 && qualified_name_part_ok(s))
}

/// The name rule each kind's registry uses.
pub fn name_errors(kind: Kind, name: &str) -> Option<&'static str> {
    match kind {
        Kind::Namespace => (!is_dns1123_label(name)).then_some(LABEL_MSG),
        _ => (!is_dns1123_subdomain(name)).then_some(SUBDOMAIN_MSG),
    }
}
