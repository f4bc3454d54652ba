//! The kernel's mount table (`/proc/self/mountinfo`) as text: the fields it escapes.

/// mountinfo writes space, tab, newline and backslash in names as octal escapes (`\040`).
pub(crate) fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let escape = bytes
            .get(i + 1..i + 4)
            .filter(|digits| bytes[i] == b'\\' && digits.iter().all(|d| (b'0'..=b'7').contains(d)));
        match escape {
            Some(digits) => {
                let value = digits
                    .iter()
                    .fold(0u32, |value, d| value * 8 + u32::from(d - b'0'));
                out.push(value as u8);
                i += 4;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The mount point field (the fifth) of each line of a mount table, unescaped.
pub(crate) fn mount_points(table: &str) -> impl Iterator<Item = std::path::PathBuf> + '_ {
    table
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .map(|field| std::path::PathBuf::from(unescape(field)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_escapes_are_decoded() {
        assert_eq!(unescape(r"/a\040b\011c\134d"), "/a b\tc\\d");
        assert_eq!(unescape(r"/plain\09"), r"/plain\09");
        assert_eq!(unescape("/end\\"), "/end\\");
    }
}
