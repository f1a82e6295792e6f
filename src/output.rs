//! How commands print: a table or key/value lines for people, JSON for programs. Everything
//! printed to stdout goes through here.

use comfy_table::presets::UTF8_BORDERS_ONLY;
use comfy_table::{ContentArrangement, Table};
use serde::Serialize;

use crate::cli::OutputFormat;
use crate::error::{Error, Result};

/// Prints `value` as pretty JSON.
pub fn json<T: Serialize + ?Sized>(value: &T) -> Result<()> {
    let text = serde_json::to_string_pretty(value)
        .map_err(|e| Error::failed(format!("cannot encode output as JSON: {e}")))?;
    println!("{text}");
    Ok(())
}

/// Prints a table with a header row.
pub fn table<R, C>(header: &[&str], rows: R)
where
    R: IntoIterator<Item = C>,
    C: IntoIterator<Item = String>,
{
    let mut table = Table::new();
    table
        .load_preset(UTF8_BORDERS_ONLY)
        .set_content_arrangement(ContentArrangement::Dynamic)
        .set_header(header.iter().copied());
    for row in rows {
        table.add_row(row.into_iter().collect::<Vec<_>>());
    }
    println!("{table}");
}

/// Prints `key: value` lines, aligned.
pub fn fields(pairs: &[(&str, String)]) {
    let width = pairs.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    for (key, value) in pairs {
        println!("{key:<width$}  {value}");
    }
}

/// Prints `value` as JSON, or runs `text` to print it for people.
pub fn emit<T: Serialize + ?Sized>(
    format: OutputFormat,
    value: &T,
    text: impl FnOnce(),
) -> Result<()> {
    match format {
        OutputFormat::Json => json(value),
        OutputFormat::Text => {
            text();
            Ok(())
        }
    }
}

pub fn or_dash<T: ToString>(value: Option<T>) -> String {
    value.map_or_else(|| "-".to_owned(), |v| v.to_string())
}
