//! The figures of one run at one size, read back from the lines the bench prints (its
//! own or an earlier build's), and the table that sets two builds side by side.

use std::fmt::Write as _;

/// What one run printed at one size; `None`: not printed (not measured, or an earlier
/// build that does not measure it).
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Figures {
    /// Making the N exports, one after another: seconds.
    pub make_s: Option<f64>,
    pub make_each_ms: Option<f64>,
    pub add_p50_ms: Option<f64>,
    pub add_p99_ms: Option<f64>,
    pub remove_p50_ms: Option<f64>,
    pub remove_p99_ms: Option<f64>,
    /// A node joins: until the last `Exports::set` returned.
    pub node_change_s: Option<f64>,
    /// A node joins: until ganesha's DisplayExport showed the new client for every export.
    pub node_change_shown_s: Option<f64>,
    pub restore_kept_s: Option<f64>,
    pub ganesha_restart_s: Option<f64>,
    /// The run said it did not measure ganesha's restart at this size.
    pub ganesha_restart_skipped: bool,
    pub restore_lost_s: Option<f64>,
    /// ganesha's own AddExport and RemoveExport of one export with N present, called
    /// directly (no file of the agent's written): its share of an add or a remove.
    pub ganesha_add_p50_ms: Option<f64>,
    pub ganesha_remove_p50_ms: Option<f64>,
    /// ganesha restarted reading none of the exports, until the agent (woken by
    /// ganesha's return to the bus) has it serve all N again.
    pub agent_served_restart_s: Option<f64>,
}

/// The lines the bench prints (and earlier builds printed), each read as the numbers
/// in it, in order.
const MADE: &str = "made ";
const ADD_REMOVE: &str = "with ";
const NODE_CHANGE: &str = "a node change reached ";
const NODE_CHANGE_SHOWN: &str = "a node change shown by ganesha for all ";
const RESTORE_KEPT: &str = "agent start, ganesha serving all ";
const GANESHA_RESTART: &str = "ganesha restarted from the include list: ";
const RESTORE_LOST: &str = "agent start, ganesha serving none: ";
const GANESHA_RESTART_SKIPPED: &str = "ganesha restart not measured: ";
const GANESHA_ALONE: &str = "ganesha alone with ";
const AGENT_SERVED: &str = "ganesha restarted reading none, the agent serving all ";

pub fn made_line(n: usize, seconds: f64) -> String {
    format!(
        "{MADE}{n} exports in {seconds:.2} s ({:.2} ms each)",
        seconds * 1e3 / n.max(1) as f64
    )
}

pub fn add_remove_line(n: usize, samples: usize, ms: [f64; 4]) -> String {
    format!(
        "{ADD_REMOVE}{n} present, {samples} samples: add p50 {:.2} ms p99 {:.2} ms; remove p50 {:.2} ms p99 {:.2} ms",
        ms[0], ms[1], ms[2], ms[3]
    )
}

pub fn node_change_line(n: usize, seconds: f64) -> String {
    format!("{NODE_CHANGE}{n} exports in {seconds:.2} s")
}

pub fn node_change_shown_line(n: usize, seconds: f64, check_seconds: f64) -> String {
    format!(
        "{NODE_CHANGE_SHOWN}{n} exports in {seconds:.2} s (DisplayExport of every id after the last change returned; that check took {check_seconds:.2} s)"
    )
}

pub fn restore_kept_line(n: usize, seconds: f64) -> String {
    format!("{RESTORE_KEPT}{n}: restored in {seconds:.2} s")
}

pub fn ganesha_restart_line(served: usize, seconds: f64) -> String {
    format!("{GANESHA_RESTART}{served} exports served, up in {seconds:.2} s")
}

pub fn ganesha_restart_skipped_line(n: usize, max: usize) -> String {
    format!("{GANESHA_RESTART_SKIPPED}{n} exports is above --ganesha-restart-max {max}")
}

pub fn restore_lost_line(n: usize, seconds: f64) -> String {
    format!("{RESTORE_LOST}{n} restored in {seconds:.2} s")
}

pub fn ganesha_alone_line(n: usize, samples: usize, ms: [f64; 4]) -> String {
    format!(
        "{GANESHA_ALONE}{n} present, {samples} samples: AddExport p50 {:.2} ms p99 {:.2} ms; RemoveExport p50 {:.2} ms p99 {:.2} ms",
        ms[0], ms[1], ms[2], ms[3]
    )
}

pub fn agent_served_line(n: usize, seconds: f64) -> String {
    format!("{AGENT_SERVED}{n} again in {seconds:.2} s")
}

/// The numbers of `line` after `prefix`, in order ("1,000" is not one: the bench
/// prints none so).
fn numbers(line: &str, prefix: &str) -> Option<Vec<f64>> {
    let rest = line.trim().strip_prefix(prefix)?;
    Some(
        rest.split_whitespace()
            .filter_map(|word| {
                word.trim_matches(|c: char| ",;:()".contains(c))
                    .parse()
                    .ok()
            })
            .collect(),
    )
}

impl Figures {
    /// Reads what a run printed; lines it does not know (progress, restore counts,
    /// figures of later builds) are passed over.
    pub fn parse(output: &str) -> Self {
        let mut figures = Figures::default();
        for line in output.lines() {
            // Longest prefix first: "a node change shown" would not match "reached", but
            // keep the more specific lines ahead of the general ones anyway.
            if let Some(n) = numbers(line, NODE_CHANGE_SHOWN) {
                figures.node_change_shown_s = n.get(1).copied();
            } else if let Some(n) = numbers(line, NODE_CHANGE) {
                figures.node_change_s = n.get(1).copied();
            } else if let Some(n) = numbers(line, MADE) {
                figures.make_s = n.get(1).copied();
                figures.make_each_ms = n.get(2).copied();
            } else if let Some(n) = numbers(line, ADD_REMOVE) {
                figures.add_p50_ms = n.get(2).copied();
                figures.add_p99_ms = n.get(3).copied();
                figures.remove_p50_ms = n.get(4).copied();
                figures.remove_p99_ms = n.get(5).copied();
            } else if let Some(n) = numbers(line, RESTORE_KEPT) {
                figures.restore_kept_s = n.get(1).copied();
            } else if let Some(n) = numbers(line, GANESHA_RESTART) {
                figures.ganesha_restart_s = n.get(1).copied();
            } else if line.trim().starts_with(GANESHA_RESTART_SKIPPED) {
                figures.ganesha_restart_skipped = true;
            } else if let Some(n) = numbers(line, RESTORE_LOST) {
                figures.restore_lost_s = n.get(1).copied();
            } else if let Some(n) = numbers(line, GANESHA_ALONE) {
                figures.ganesha_add_p50_ms = n.get(2).copied();
                figures.ganesha_remove_p50_ms = n.get(4).copied();
            } else if let Some(n) = numbers(line, AGENT_SERVED) {
                figures.agent_served_restart_s = n.get(1).copied();
            }
        }
        figures
    }

    /// Each figure with its name and unit, in the order of the table, and whether the
    /// run said it skipped it.
    fn rows(&self) -> [(&'static str, &'static str, Option<f64>, bool); 14] {
        let measured = |(name, unit, value)| (name, unit, value, false);
        [
            measured(("make N", "s", self.make_s)),
            measured(("make N: per export", "ms", self.make_each_ms)),
            measured(("add one: p50", "ms", self.add_p50_ms)),
            measured(("add one: p99", "ms", self.add_p99_ms)),
            measured(("remove one: p50", "ms", self.remove_p50_ms)),
            measured(("remove one: p99", "ms", self.remove_p99_ms)),
            measured((
                "ganesha alone: AddExport p50",
                "ms",
                self.ganesha_add_p50_ms,
            )),
            measured((
                "ganesha alone: RemoveExport p50",
                "ms",
                self.ganesha_remove_p50_ms,
            )),
            measured(("a node joins: last set returned", "s", self.node_change_s)),
            measured((
                "a node joins: DisplayExport shows it for all",
                "s",
                self.node_change_shown_s,
            )),
            measured(("agent start, ganesha kept all", "s", self.restore_kept_s)),
            (
                "ganesha restart from the include list",
                "s",
                self.ganesha_restart_s,
                self.ganesha_restart_skipped,
            ),
            measured(("agent start, ganesha lost all", "s", self.restore_lost_s)),
            measured((
                "ganesha restart reading none, agent serves all",
                "s",
                self.agent_served_restart_s,
            )),
        ]
    }
}

/// What one build gave at one size.
#[derive(Debug, Clone)]
pub enum Run {
    /// Not asked for (no `--before`) or skipped above a size.
    Skipped(String),
    Measured {
        /// What it printed, also when it ended early.
        figures: Box<Figures>,
        /// /proc/loadavg's first three fields before and after the run.
        load_before: String,
        load_after: String,
        /// Why it ended before its last figure, if it did.
        failure: Option<String>,
    },
}

/// One size: the earlier build's run and this one's.
#[derive(Debug, Clone)]
pub struct Turn {
    pub exports: usize,
    pub before: Run,
    pub after: Run,
}

/// Row `row` of a run's figures as a cell of the table.
fn value(run: &Run, row: usize) -> String {
    match run {
        Run::Skipped(_) => "not run".into(),
        Run::Measured { figures, .. } => match figures.rows()[row] {
            (_, unit, Some(v), _) => format!("{} {unit}", format_value(v)),
            (_, _, None, true) => "skipped".into(),
            (_, _, None, false) => "-".into(),
        },
    }
}

fn format_value(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

fn ratio(before: &Run, after: &Run, row: usize) -> String {
    let (Run::Measured { figures: b, .. }, Run::Measured { figures: a, .. }) = (before, after)
    else {
        return String::new();
    };
    match (b.rows()[row].2, a.rows()[row].2) {
        (Some(b), Some(a)) if b > 0.0 => format!("{:.2}", a / b),
        _ => String::new(),
    }
}

fn load(run: &Run) -> String {
    match run {
        Run::Measured {
            load_before,
            load_after,
            ..
        } => format!("{load_before} → {load_after}"),
        Run::Skipped(_) => String::new(),
    }
}

/// A Markdown table: per size and figure, the earlier build's, this one's, and this
/// one's over the earlier one's (below 1: faster now).
pub fn table(turns: &[Turn]) -> String {
    let mut out = String::from(
        "| N | figure | before | after | after / before |\n|---:|---|---:|---:|---:|\n",
    );
    for turn in turns {
        let n = turn.exports;
        for (row, (name, ..)) in Figures::default().rows().into_iter().enumerate() {
            let _ = writeln!(
                out,
                "| {n} | {name} | {} | {} | {} |",
                value(&turn.before, row),
                value(&turn.after, row),
                ratio(&turn.before, &turn.after, row),
            );
        }
        let _ = writeln!(
            out,
            "| {n} | load average (1, 5, 15 min) before → after the run | {} | {} | |",
            load(&turn.before),
            load(&turn.after),
        );
    }
    for turn in turns {
        for (build, run) in [("before", &turn.before), ("after", &turn.after)] {
            match run {
                Run::Skipped(why) => {
                    let _ = writeln!(out, "\n{build}, N = {}: not run ({why})", turn.exports);
                }
                Run::Measured {
                    failure: Some(why), ..
                } => {
                    let _ = writeln!(
                        out,
                        "\n{build}, N = {}: ended early, its figures until then above: {why}",
                        turn.exports
                    );
                }
                Run::Measured { failure: None, .. } => {}
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The lines of the build this bench compares against by default, as it printed
    /// them, with its progress lines between.
    const EARLIER: &str = "  restore: kept 0 added 0 repaired 0 removed 0
made 100 exports in 0.4 s (4.12 ms each)
with 100 present, 200 samples: add p50 3.91 ms p99 9.80 ms; remove p50 2.10 ms p99 5.55 ms
a node change reached 100 exports in 0.3 s
  restore: kept 100 added 0 repaired 0 removed 0
agent start, ganesha serving all 100: restored in 0.01 s
ganesha restarted from the include list: 101 exports served, up in 1.2 s
  restore: kept 0 added 100 repaired 0 removed 0
agent start, ganesha serving none: 100 restored in 0.2 s
";

    #[test]
    fn reads_every_figure_the_earlier_build_prints() {
        let figures = Figures::parse(EARLIER);
        assert_eq!(
            figures,
            Figures {
                make_s: Some(0.4),
                make_each_ms: Some(4.12),
                add_p50_ms: Some(3.91),
                add_p99_ms: Some(9.80),
                remove_p50_ms: Some(2.10),
                remove_p99_ms: Some(5.55),
                node_change_s: Some(0.3),
                node_change_shown_s: None,
                restore_kept_s: Some(0.01),
                ganesha_restart_s: Some(1.2),
                ganesha_restart_skipped: false,
                restore_lost_s: Some(0.2),
                ganesha_add_p50_ms: None,
                ganesha_remove_p50_ms: None,
                agent_served_restart_s: None,
            }
        );
    }

    #[test]
    fn reads_back_what_this_build_prints() {
        let printed = [
            made_line(1000, 3.5),
            add_remove_line(1000, 50, [1.25, 2.5, 0.75, 1.5]),
            node_change_line(1000, 2.25),
            node_change_shown_line(1000, 2.75, 0.5),
            restore_kept_line(1000, 0.05),
            ganesha_restart_line(1001, 4.5),
            restore_lost_line(1000, 1.75),
            ganesha_alone_line(1000, 50, [0.5, 1.0, 0.25, 0.75]),
            agent_served_line(1000, 3.25),
        ]
        .join("\n");
        assert_eq!(
            Figures::parse(&printed),
            Figures {
                make_s: Some(3.5),
                make_each_ms: Some(3.5),
                add_p50_ms: Some(1.25),
                add_p99_ms: Some(2.5),
                remove_p50_ms: Some(0.75),
                remove_p99_ms: Some(1.5),
                node_change_s: Some(2.25),
                node_change_shown_s: Some(2.75),
                restore_kept_s: Some(0.05),
                ganesha_restart_s: Some(4.5),
                ganesha_restart_skipped: false,
                restore_lost_s: Some(1.75),
                ganesha_add_p50_ms: Some(0.5),
                ganesha_remove_p50_ms: Some(0.25),
                agent_served_restart_s: Some(3.25),
            }
        );
    }

    #[test]
    fn the_table_sets_the_builds_side_by_side_and_says_what_did_not_run() {
        let measured = |figures| Run::Measured {
            figures: Box::new(figures),
            load_before: "0.50 0.40 0.30".into(),
            load_after: "1.50 0.60 0.35".into(),
            failure: None,
        };
        let turns = [
            Turn {
                exports: 100,
                before: measured(Figures::parse(EARLIER)),
                after: measured(Figures {
                    make_s: Some(0.2),
                    ..Figures::parse(EARLIER)
                }),
            },
            Turn {
                exports: 30000,
                before: Run::Skipped("above --before-max 10000".into()),
                after: measured(Figures::parse(&ganesha_restart_skipped_line(30000, 10000))),
            },
        ];
        let table = table(&turns);
        assert!(
            table.contains("| 100 | make N | 0.40 s | 0.20 s | 0.50 |"),
            "{table}"
        );
        assert!(
            table.contains(
                "| 100 | ganesha restart from the include list | 1.20 s | 1.20 s | 1.00 |"
            ),
            "{table}"
        );
        assert!(
            table.contains("| 30000 | make N | not run | - |  |"),
            "{table}"
        );
        assert!(
            table.contains(
                "| 30000 | ganesha restart from the include list | not run | skipped |  |"
            ),
            "{table}"
        );
        assert!(table.contains("0.50 0.40 0.30 → 1.50 0.60 0.35"), "{table}");
        assert!(
            table.contains("before, N = 30000: not run (above --before-max 10000)"),
            "{table}"
        );
    }
}
