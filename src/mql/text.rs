//! Values as MongoDB's messages quote them: `typeName` (`"int"`, `"objectId"`, ...) and the
//! shell-like rendering of `BSONElement::toString` (`{ a: 1, b: "x" }`,
//! `ObjectId('...')`), so that a message the front composes reads like the server's.

use bson::Bson;

/// MongoDB's name of a value's BSON type, as its messages and `$type` write it.
pub fn type_name(value: &Bson) -> &'static str {
    match value {
        Bson::Double(_) => "double",
        Bson::String(_) => "string",
        Bson::Document(_) => "object",
        Bson::Array(_) => "array",
        Bson::Binary(_) => "binData",
        Bson::Undefined => "undefined",
        Bson::ObjectId(_) => "objectId",
        Bson::Boolean(_) => "bool",
        Bson::DateTime(_) => "date",
        Bson::Null => "null",
        Bson::RegularExpression(_) => "regex",
        Bson::DbPointer(_) => "dbPointer",
        Bson::JavaScriptCode(_) => "javascript",
        Bson::Symbol(_) => "symbol",
        Bson::JavaScriptCodeWithScope(_) => "javascriptWithScope",
        Bson::Int32(_) => "int",
        Bson::Timestamp(_) => "timestamp",
        Bson::Int64(_) => "long",
        Bson::Decimal128(_) => "decimal",
        Bson::MinKey => "minKey",
        Bson::MaxKey => "maxKey",
    }
}

/// A value as MongoDB's messages print it (`BSONElement::toString` without the field name).
pub fn shell(value: &Bson) -> String {
    let mut out = String::new();
    write(value, &mut out);
    out
}

/// `name: value`, as MongoDB prints an element.
pub(crate) fn element(name: &str, value: &Bson) -> String {
    format!("{name}: {}", shell(value))
}

fn write(value: &Bson, out: &mut String) {
    match value {
        Bson::Double(d) => out.push_str(&double(*d)),
        Bson::String(s) | Bson::Symbol(s) => {
            out.push('"');
            out.push_str(s);
            out.push('"');
        }
        Bson::Document(d) => {
            if d.is_empty() {
                out.push_str("{}");
                return;
            }
            out.push_str("{ ");
            for (i, (k, v)) in d.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                out.push_str(k);
                out.push_str(": ");
                write(v, out);
            }
            out.push_str(" }");
        }
        Bson::Array(a) => {
            if a.is_empty() {
                out.push_str("[]");
                return;
            }
            out.push_str("[ ");
            for (i, v) in a.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write(v, out);
            }
            out.push_str(" ]");
        }
        Bson::Int32(i) => out.push_str(&i.to_string()),
        Bson::Int64(i) => out.push_str(&i.to_string()),
        Bson::Boolean(b) => out.push_str(if *b { "true" } else { "false" }),
        Bson::Null => out.push_str("null"),
        Bson::Undefined => out.push_str("undefined"),
        Bson::ObjectId(o) => out.push_str(&format!("ObjectId('{o}')")),
        Bson::DateTime(d) => out.push_str(&format!("new Date({})", d.timestamp_millis())),
        Bson::Timestamp(t) => out.push_str(&format!("Timestamp({}, {})", t.time, t.increment)),
        Bson::RegularExpression(r) => out.push_str(&format!("/{}/{}", r.pattern, r.options)),
        Bson::Decimal128(d) => out.push_str(&format!("NumberDecimal(\"{d}\")")),
        Bson::MinKey => out.push_str("MinKey"),
        Bson::MaxKey => out.push_str("MaxKey"),
        Bson::Binary(b) => out.push_str(&format!(
            "BinData({}, {})",
            u8::from(b.subtype),
            hex::encode_upper(&b.bytes)
        )),
        other => out.push_str(&other.clone().into_relaxed_extjson().to_string()),
    }
}

/// A double as the shell prints it: whole numbers keep a `.0`.
fn double(d: f64) -> String {
    if d.is_nan() {
        "nan.0".to_owned()
    } else if d.is_infinite() {
        if d > 0.0 { "inf.0" } else { "-inf.0" }.to_owned()
    } else if d == d.trunc() && d.abs() < 1e15 {
        format!("{d:.1}")
    } else {
        format!("{d}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::{doc, oid::ObjectId};

    #[test]
    fn values_print_as_mongodb_messages_print_them() {
        let d = Bson::Document(doc! { "a": 1, "b": "x", "c": [1.5, 2.0], "d": {} });
        assert_eq!(shell(&d), r#"{ a: 1, b: "x", c: [ 1.5, 2.0 ], d: {} }"#);
        let oid = ObjectId::from_bytes([1; 12]);
        assert_eq!(
            shell(&Bson::ObjectId(oid)),
            "ObjectId('010101010101010101010101')"
        );
        assert_eq!(element("_id", &Bson::Int64(7)), "_id: 7");
        assert_eq!(type_name(&Bson::Int64(7)), "long");
        assert_eq!(type_name(&Bson::Document(doc! {})), "object");
    }
}
