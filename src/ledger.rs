//! The application's own record of what it was told: every acknowledged write of a workload,
//! and the check of that record against the final state. Used by `examples/orders_app.rs`
//! and by the tests that run it through a migration.
//!
//! Each id is written by one worker at a time, so the last entry of an id is exactly what a
//! read must return at the end: a document (with the fields the application controls) or
//! nothing (deleted). A read that disagrees is a lost write (nothing where a document should
//! be), a resurrected delete (a document where nothing should be) or wrong content.

use std::collections::BTreeMap;
use std::io::{BufRead, Write};

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// One line of the ledger.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    pub seq: u64,
    pub worker: u32,
    /// `insert`, `update`, `replace`, `delete`, `recreate` or `resync` (the worker re-read
    /// the document after an error whose effect it could not know).
    pub op: String,
    pub tenant: String,
    pub id: String,
    /// The document's application fields after the operation; `None` when it does not exist.
    pub doc: Option<Value>,
}

/// Appends entries as JSON lines.
pub struct LedgerWriter<W: Write> {
    out: W,
}

impl<W: Write> LedgerWriter<W> {
    pub fn new(out: W) -> Self {
        LedgerWriter { out }
    }

    pub fn append(&mut self, entry: &Entry) -> std::io::Result<()> {
        serde_json::to_writer(&mut self.out, entry)?;
        self.out.write_all(b"\n")
    }

    pub fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }
}

/// Reads a ledger; a malformed line is an error naming its line number.
pub fn read(input: impl BufRead) -> Result<Vec<Entry>, String> {
    input
        .lines()
        .enumerate()
        .filter(|(_, l)| !matches!(l, Ok(l) if l.trim().is_empty()))
        .map(|(n, line)| {
            let line = line.map_err(|e| format!("line {}: {e}", n + 1))?;
            serde_json::from_str(&line).map_err(|e| format!("line {}: {e}", n + 1))
        })
        .collect()
}

/// What the final state must be: per id, its tenant and its last recorded document.
pub fn expected(entries: &[Entry]) -> BTreeMap<String, (String, Option<Value>)> {
    let mut sorted: Vec<&Entry> = entries.iter().collect();
    sorted.sort_by_key(|e| e.seq);
    let mut state = BTreeMap::new();
    for e in sorted {
        state.insert(e.id.clone(), (e.tenant.clone(), e.doc.clone()));
    }
    state
}

/// Differences between the ledger and what reads returned.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct CheckReport {
    pub checked: usize,
    pub lost: Vec<String>,
    pub resurrected: Vec<String>,
    pub wrong: Vec<Wrong>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Wrong {
    pub id: String,
    pub expected: Value,
    pub actual: Value,
}

impl CheckReport {
    pub fn anomalies(&self) -> usize {
        self.lost.len() + self.resurrected.len() + self.wrong.len()
    }
}

/// Compares the expected state with `actual` (id -> what a read returned, restricted to the
/// application's fields).
pub fn check(
    expected: &BTreeMap<String, (String, Option<Value>)>,
    actual: &BTreeMap<String, Option<Value>>,
) -> CheckReport {
    let mut report = CheckReport::default();
    for (id, (_, want)) in expected {
        report.checked += 1;
        let got = actual.get(id).cloned().flatten();
        match (want, got) {
            (None, None) => {}
            (Some(_), None) => report.lost.push(id.clone()),
            (None, Some(_)) => report.resurrected.push(id.clone()),
            (Some(w), Some(g)) if *w == g => {}
            (Some(w), Some(g)) => report.wrong.push(Wrong {
                id: id.clone(),
                expected: w.clone(),
                actual: g,
            }),
        }
    }
    report
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn entry(seq: u64, op: &str, id: &str, doc: Option<Value>) -> Entry {
        Entry {
            seq,
            worker: 0,
            op: op.into(),
            tenant: "t".into(),
            id: id.into(),
            doc,
        }
    }

    #[test]
    fn the_last_entry_of_an_id_decides_and_each_kind_of_anomaly_is_named() {
        let entries = vec![
            entry(1, "insert", "a", Some(json!({"qty": 1}))),
            entry(3, "update", "a", Some(json!({"qty": 2}))),
            entry(2, "insert", "b", Some(json!({"qty": 1}))),
            entry(4, "delete", "b", None),
            entry(5, "insert", "c", Some(json!({"qty": 1}))),
            entry(6, "insert", "d", Some(json!({"qty": 1}))),
        ];
        let mut buf = Vec::new();
        let mut w = LedgerWriter::new(&mut buf);
        for e in &entries {
            w.append(e).unwrap();
        }
        let read_back = read(std::io::Cursor::new(buf)).unwrap();
        assert_eq!(read_back, entries);
        let want = expected(&read_back);
        let actual = BTreeMap::from([
            ("a".to_owned(), Some(json!({"qty": 2}))),
            ("b".to_owned(), Some(json!({"qty": 1}))),
            ("c".to_owned(), None),
            ("d".to_owned(), Some(json!({"qty": 9}))),
        ]);
        let report = check(&want, &actual);
        assert_eq!(report.checked, 4);
        assert_eq!(report.lost, ["c"]);
        assert_eq!(report.resurrected, ["b"]);
        assert_eq!(report.wrong.len(), 1);
        assert_eq!(report.wrong[0].id, "d");
        assert_eq!(report.anomalies(), 3);
    }

    #[test]
    fn a_malformed_line_is_named() {
        let err = read(std::io::Cursor::new("{\"seq\":1}\n")).unwrap_err();
        assert!(err.starts_with("line 1:"), "{err}");
    }
}
