//! How commands print: a table or key/value lines for people, JSON for programs. Everything
//! printed to stdout goes through here.

use comfy_table::presets::UTF8_BORDERS_ONLY;
use comfy_table::{ContentArrangement, Table};
use serde::Serialize;

use crate::cli::OutputFormat;
use crate::error::{Error, Result};

/// Prints `value` as pretty JSON.
pub fn json<T: Serialize + ?Sized>(value: &T) -> Result<()> {
    let text = encode(value, serde_json::ser::PrettyFormatter::new())?;
    println!("{text}");
    Ok(())
}

/// `value` as one line of JSON (NDJSON: `--watch --output json`).
pub fn json_line<T: Serialize + ?Sized>(value: &T) -> Result<String> {
    encode(value, serde_json::ser::CompactFormatter)
}

fn encode<T: Serialize + ?Sized, F: serde_json::ser::Formatter>(
    value: &T,
    formatter: F,
) -> Result<String> {
    let mut out = Vec::new();
    let mut ser = serde_json::Serializer::with_formatter(&mut out, PositiveZero(formatter));
    value
        .serialize(&mut ser)
        .map_err(|e| Error::failed(format!("cannot encode output as JSON: {e}")))?;
    String::from_utf8(out).map_err(|e| Error::failed(format!("JSON output: {e}")))
}

/// A JSON formatter that writes every negative zero as zero: a sum over nothing (`f64` sums
/// start at `-0.0`) or a rate over a window can come out as `-0.0`, which reads as a bug.
struct PositiveZero<F>(F);

impl<F: serde_json::ser::Formatter> serde_json::ser::Formatter for PositiveZero<F> {
    fn write_f64<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
        value: f64,
    ) -> std::io::Result<()> {
        self.0
            .write_f64(writer, if value == 0.0 { 0.0 } else { value })
    }
    fn write_f32<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
        value: f32,
    ) -> std::io::Result<()> {
        self.0
            .write_f32(writer, if value == 0.0 { 0.0 } else { value })
    }
    // The rest is the wrapped formatter's layout.
    fn begin_array<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.0.begin_array(w)
    }
    fn end_array<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.0.end_array(w)
    }
    fn begin_array_value<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        self.0.begin_array_value(w, first)
    }
    fn end_array_value<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.0.end_array_value(w)
    }
    fn begin_object<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.0.begin_object(w)
    }
    fn end_object<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.0.end_object(w)
    }
    fn begin_object_key<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        self.0.begin_object_key(w, first)
    }
    fn begin_object_value<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.0.begin_object_value(w)
    }
    fn end_object_value<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.0.end_object_value(w)
    }
}

pub use crate::estimate::not_negative;

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

/// Rows a long table shows on the terminal unless `--all` asks for every one.
pub const TOP_ROWS: usize = 20;

/// Prints the first [`TOP_ROWS`] of `rows` (every row with `all`), then a line counting the
/// rest of them (`what`: "tenants", "strata", ...) and how to see them. JSON output always
/// carries every row.
pub fn table_top<R, C>(header: &[&str], rows: R, all: bool, what: &str)
where
    R: IntoIterator<Item = C>,
    C: IntoIterator<Item = String>,
{
    let mut rows = rows.into_iter();
    let shown: Vec<C> = if all {
        rows.by_ref().collect()
    } else {
        rows.by_ref().take(TOP_ROWS).collect()
    };
    table(header, shown);
    let rest = rows.count();
    if rest > 0 {
        println!("... and {rest} more {what} (--all shows every row)");
    }
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

/// [`emit`] of a command that changes state: with `dry_run`, the JSON is the same value with
/// `"dry_run": true` beside its keys (an array or a scalar is wrapped as
/// `{"dry_run": true, "would": ...}`), and the text starts with `dry run: would` and says
/// that nothing changed. `done` is the text of the change made; `would` of the change a dry
/// run found it would make.
pub fn emit_change<T: Serialize + ?Sized>(
    format: OutputFormat,
    dry_run: bool,
    value: &T,
    done: impl FnOnce(),
    would: impl FnOnce() -> String,
) -> Result<()> {
    if !dry_run {
        return emit(format, value, done);
    }
    let value = serde_json::to_value(value).map_err(|e| Error::failed(e.to_string()))?;
    let marked = match value {
        serde_json::Value::Object(mut map) => {
            map.insert("dry_run".into(), serde_json::Value::Bool(true));
            serde_json::Value::Object(map)
        }
        other => serde_json::json!({ "dry_run": true, "would": other }),
    };
    emit(format, &marked, || {
        println!("dry run: would {}; nothing changed", would())
    })
}

pub fn or_dash<T: ToString>(value: Option<T>) -> String {
    value.map_or_else(|| "-".to_owned(), |v| v.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_negative_zero_reaches_json() {
        let empty: f64 = Vec::<f64>::new().into_iter().sum();
        assert!(empty.is_sign_negative(), "the sum of nothing is -0.0");
        assert_eq!(serde_json::to_string(&empty).unwrap(), "-0.0");
        let v = serde_json::json!({ "rate": empty, "rates": [empty, 1.5], "n": 0 });
        let text = json_line(&v).unwrap();
        assert_eq!(text, r#"{"rate":0.0,"rates":[0.0,1.5],"n":0}"#);
        assert_eq!(format!("{:.0}", not_negative(empty)), "0");
        assert_eq!(not_negative(-3.0), 0.0);
        assert_eq!(not_negative(2.5), 2.5);
    }
}
