//! Text a client or a tenant chose (a file name, a request id, a path), made fit for a log
//! line or a Kubernetes event: control and other invisible characters are shown escaped,
//! so no name can end a line, forge the next one or drive the terminal of whoever reads
//! the log, and the length is bounded.

use std::borrow::Cow;
use std::fmt;

/// Whether `c` is written escaped: a backslash (so an escape in the output is never
/// ambiguous), a control character, or anything else Rust's `escape_debug` would not
/// print as it is (format characters such as bidirectional overrides, unassigned code
/// points). Quotes stay as they are: they end nothing in a log line.
fn needs_escape(c: char) -> bool {
    !matches!(c, '"' | '\'') && c.escape_debug().len() > 1
}

/// `text` with characters that need escaping written the way Rust writes them (`\n`,
/// `\u{1b}`, `\\`); printable text is kept as it is.
pub fn escape(text: &str) -> Cow<'_, str> {
    escape_if(text, needs_escape)
}

/// As [`escape`], but a backslash is kept as it is: for text that may already hold
/// escapes (a `Debug` rendering), which must not be escaped twice.
pub fn escape_controls(text: &str) -> Cow<'_, str> {
    escape_if(text, |c| c != '\\' && needs_escape(c))
}

fn escape_if(text: &str, escaped: impl Fn(char) -> bool) -> Cow<'_, str> {
    if !text.chars().any(&escaped) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if escaped(c) {
            out.extend(c.escape_debug());
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// `text` cut to at most `max_bytes` (on a character boundary), marked with its length
/// when it was cut.
pub fn bound(text: &str, max_bytes: usize) -> Cow<'_, str> {
    if text.len() <= max_bytes {
        return Cow::Borrowed(text);
    }
    let mut end = max_bytes;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    Cow::Owned(format!("{}…[{} bytes]", &text[..end], text.len()))
}

/// [`escape`]d, then [`bound`]ed to `max_bytes`.
pub fn clean(text: &str, max_bytes: usize) -> String {
    bound(&escape(text), max_bytes).into_owned()
}

/// Displays its text [`clean`]ed to [`MAX_MESSAGE_BYTES`]: for messages built around a
/// name someone else chose.
#[derive(Debug, Clone, Copy)]
pub struct Clean<'a>(pub &'a str);

/// The longest message kept of one built around names someone else chose.
pub const MAX_MESSAGE_BYTES: usize = 2048;

impl fmt::Display for Clean<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&bound(&escape(self.0), MAX_MESSAGE_BYTES))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn lines_terminals_and_bidi_are_escaped_and_plain_text_is_kept() {
        assert_eq!(
            escape("a\nINFO audit: forged\x1b[2J\u{202e}\\"),
            "a\\nINFO audit: forged\\u{1b}[2J\\u{202e}\\\\"
        );
        let plain = "tenants/ns-1/pvc-0d1e \"quoted\" 'x' é 中";
        assert!(matches!(escape(plain), Cow::Borrowed(_)));
        assert_eq!(escape_controls("\\n\n"), "\\n\\n");
    }

    #[test]
    fn bound_cuts_on_a_character_boundary_and_says_so() {
        assert_eq!(bound("short", 10), "short");
        assert_eq!(bound("ééé", 3), "é…[6 bytes]");
        assert_eq!(clean(&"\n".repeat(100), 8), "\\n\\n\\n\\n…[200 bytes]");
    }

    proptest! {
        #[test]
        fn escaped_text_has_no_control_characters(text in any::<String>()) {
            let escaped = escape(&text);
            prop_assert!(!escaped.chars().any(char::is_control));
            prop_assert!(!escape_controls(&text).chars().any(char::is_control));
            let cleaned = clean(&text, 64);
            prop_assert!(cleaned.len() <= 64 + "…[] bytes".len() + 20);
        }
    }
}
