//! What every command answers with, and how it is printed.

use clap::ValueEnum;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    Table,
    Json,
}

/// A command's answer: a table for people, JSON for scripts.
pub(crate) trait Report: serde::Serialize {
    fn table(&self) -> String;
    /// The process's exit status once printed.
    fn exit_code(&self) -> i32 {
        0
    }
}

/// Prints the report; the exit status it asks for.
pub(crate) fn print(report: &impl Report, output: Output) -> anyhow::Result<i32> {
    match output {
        Output::Table => print!("{}", report.table()),
        Output::Json => println!("{}", serde_json::to_string_pretty(report)?),
    }
    Ok(report.exit_code())
}
