//! A test that cannot do its real part (not root, a tool or kernel feature missing, an
//! API server absent) must not count as passed. libtest has no runtime skip, so such a
//! test calls [`skip`] and returns: the line goes to stderr and, when the suite runner
//! set [`REPORT_VARIABLE`], to that file, which `tests/run` counts and names in its
//! closing line as skipped instead of passed.

use std::io::Write;

/// Names the file that collects one `test: reason` line per skipped test.
pub const REPORT_VARIABLE: &str = "NFSPROV_SKIP_REPORT";
/// Longest reason written, in bytes; the test's own output has the rest.
const REASON_LIMIT: usize = 160;

/// Records that `test` did not run its real part, and why.
pub fn skip(test: &str, reason: &str) {
    // One short line, no matter what the reason holds, so the report stays countable
    // and the closing line readable.
    let mut reason = reason.replace(['\n', '\r'], " ");
    if reason.len() > REASON_LIMIT {
        let mut cut = REASON_LIMIT;
        while !reason.is_char_boundary(cut) {
            cut -= 1;
        }
        reason.truncate(cut);
        reason.push_str("...");
    }
    let line = format!("{test}: {reason}\n");
    // Straight to stderr: libtest swallows the captured output of a passing test.
    let _ = std::io::stderr().write_all(format!("skipped {line}").as_bytes());
    if let Some(report) = std::env::var_os(REPORT_VARIABLE) {
        // O_APPEND with one write per line: lines of concurrent tests never interleave.
        let written = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&report)
            .and_then(|mut file| file.write_all(line.as_bytes()));
        if let Err(e) = written {
            // A skip that cannot be recorded would be counted as passed: refuse that.
            panic!("{test} was skipped ({reason}) but cannot be reported to {report:?}: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_skip_is_appended_as_one_line_per_test() {
        let dir = std::env::temp_dir().join(format!("nfsprov-skip-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let report = dir.join("report");
        // SAFETY: this crate's only test; nothing else reads the environment meanwhile.
        #[allow(unsafe_code)]
        unsafe {
            std::env::set_var(REPORT_VARIABLE, &report)
        };
        skip("first", "no root");
        skip("second", "two\nlines");
        skip("third", &"é".repeat(100));
        let text = std::fs::read_to_string(&report).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[..2], ["first: no root", "second: two lines"]);
        assert_eq!(lines[2], format!("third: {}...", "é".repeat(80)));
        assert_eq!(lines.len(), 3);
    }
}
