//! The agent's log on stderr, text or JSON. In the text log every field is written with
//! its control characters escaped and its length bounded, whatever a message was built
//! from: a name a tenant chose can neither end a line (and forge the next one) nor drive
//! the terminal of whoever reads the log. JSON escapes them by itself.

use std::io::IsTerminal;

use nfsprov_api_types::logsafe;
use tracing_subscriber::field::MakeExt;

use crate::config::LogFormat;

/// The longest field the text log keeps.
const MAX_FIELD_BYTES: usize = 4096;

/// Sets up logging; `RUST_LOG` overrides the default level.
pub fn init_tracing(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // Colours only for a person at a terminal: a journal or a file gets plain text.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
        LogFormat::Text => builder
            .fmt_fields(tracing_subscriber::fmt::format::debug_fn(write_field).delimited(" "))
            .try_init(),
    };
}

/// One field of a text log line. A `Debug` rendering may already hold escapes (a string
/// field is written quoted and escaped), so backslashes are left alone.
fn write_field(
    writer: &mut tracing_subscriber::fmt::format::Writer<'_>,
    field: &tracing::field::Field,
    value: &dyn std::fmt::Debug,
) -> std::fmt::Result {
    let text = format!("{value:?}");
    let text = logsafe::bound(&logsafe::escape_controls(&text), MAX_FIELD_BYTES).into_owned();
    if field.name() == "message" {
        writer.write_str(&text)
    } else {
        write!(writer, "{}={text}", field.name())
    }
}
