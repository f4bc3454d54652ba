//! Aligned plain-text tables and the human spelling of sizes, as kubectl prints them.

/// Rows under upper-case headers; columns are padded to their widest cell.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Table {
    headers: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub(crate) fn new(headers: &[&str]) -> Self {
        Self {
            headers: headers.iter().map(|h| h.to_uppercase()).collect(),
            rows: Vec::new(),
        }
    }

    /// Adds a row; missing cells are printed empty and extra ones are dropped, so a
    /// mistake shows as a gap instead of a shifted column.
    pub(crate) fn row<S: Into<String>>(&mut self, cells: impl IntoIterator<Item = S>) {
        let mut cells: Vec<String> = cells.into_iter().map(Into::into).collect();
        cells.resize(self.headers.len(), String::new());
        self.rows.push(cells);
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// Three spaces between columns as kubectl does; no trailing spaces, so the output
    /// can be compared and grepped line by line.
    pub(crate) fn render(&self) -> String {
        let mut widths: Vec<usize> = self.headers.iter().map(|h| h.chars().count()).collect();
        for row in &self.rows {
            for (width, cell) in widths.iter_mut().zip(row) {
                *width = (*width).max(cell.chars().count());
            }
        }
        let mut out = String::new();
        for line in std::iter::once(&self.headers).chain(&self.rows) {
            let mut text = String::new();
            for (i, (cell, width)) in line.iter().zip(&widths).enumerate() {
                if i > 0 {
                    text.push_str("   ");
                }
                text.push_str(cell);
                text.extend(std::iter::repeat_n(' ', width - cell.chars().count()));
            }
            out.push_str(text.trim_end());
            out.push('\n');
        }
        out
    }
}

/// Bytes in binary units as Kubernetes quantities are usually written (`1Gi`, `1.5Gi`).
pub(crate) fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["Ki", "Mi", "Gi", "Ti", "Pi", "Ei"];
    if bytes < 1024 {
        return format!("{bytes}B");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    let rounded = (value * 10.0).round() / 10.0;
    if rounded.fract() == 0.0 {
        format!("{rounded:.0}{}", UNITS[unit])
    } else {
        format!("{rounded:.1}{}", UNITS[unit])
    }
}

/// How long ago, coarsely, as kubectl's AGE column.
pub(crate) fn human_age(seconds: i64) -> String {
    match seconds {
        s if s < 0 => "in the future".to_owned(),
        s if s < 120 => format!("{s}s"),
        s if s < 2 * 3600 => format!("{}m", s / 60),
        s if s < 2 * 86400 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86400),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_are_aligned_to_the_widest_cell() {
        let mut table = Table::new(&["name", "agent", "used"]);
        table.row(["data-a", "nfs1", "1Gi"]);
        table.row(["b", "a-long-agent-name", ""]);
        table.row(["short"]);
        assert_eq!(
            table.render(),
            "NAME     AGENT               USED\n\
             data-a   nfs1                1Gi\n\
             b        a-long-agent-name\n\
             short\n"
        );
    }

    #[test]
    fn wide_characters_count_once_and_extra_cells_are_dropped() {
        let mut table = Table::new(&["a", "b"]);
        table.row(["ü", "x", "dropped"]);
        table.row(["abc", "y"]);
        assert_eq!(table.render(), "A     B\nü     x\nabc   y\n");
    }

    #[test]
    fn an_empty_table_is_its_header() {
        let table = Table::new(&["claim", "pv"]);
        assert!(table.is_empty());
        assert_eq!(table.render(), "CLAIM   PV\n");
    }

    #[test]
    fn sizes_read_like_quantities() {
        assert_eq!(human_bytes(0), "0B");
        assert_eq!(human_bytes(1023), "1023B");
        assert_eq!(human_bytes(1024), "1Ki");
        assert_eq!(human_bytes(1536), "1.5Ki");
        assert_eq!(human_bytes(1 << 30), "1Gi");
        assert_eq!(human_bytes(3 * (1 << 30) / 2), "1.5Gi");
        assert_eq!(human_bytes(1 << 40), "1Ti");
        assert_eq!(human_bytes(u64::MAX), "16Ei");
    }

    #[test]
    fn ages_are_coarse() {
        assert_eq!(human_age(5), "5s");
        assert_eq!(human_age(600), "10m");
        assert_eq!(human_age(3 * 3600), "3h");
        assert_eq!(human_age(5 * 86400), "5d");
        assert_eq!(human_age(-1), "in the future");
    }
}
