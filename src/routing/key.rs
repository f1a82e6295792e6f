//! Routing key values: the tenant key and the id of a document, reduced to the
//! few BSON types that route.
//!
//! A key has to be hashed identically by this crate, by the router library and by
//! applications written in other languages, so the set of types is deliberately
//! small and each type has exactly one byte encoding (see [`KeyValue::encode`]).
//! Everything else (doubles, dates, documents, …) is refused with a clear error
//! instead of being hashed in some ad-hoc way that another implementation would
//! have to reverse-engineer.
//!
//! The same values also have to be typed by operators on the command line
//! (`reshard locate orders int:42 oid:…`) and stored as JSON, so this module owns
//! the CLI text form ([`KeyValue::parse_cli`] / [`Display`]) and the JSON form
//! (`{"type": "string", "value": "cust-1"}`) as well.

use std::fmt;

use bson::spec::BinarySubtype;
use bson::{Binary, Bson};
use serde::{Deserialize, Serialize};

use super::RoutingError;

/// BSON binary subtype of a UUID.
pub const UUID_SUBTYPE: u8 = 4;
/// BSON binary subtype of generic binary data.
pub const GENERIC_BINARY_SUBTYPE: u8 = 0;

/// The CLI prefixes that select a key type; a plain string starting with one of
/// them has to be written with `str:` to stay a string.
const CLI_PREFIXES: [&str; 6] = ["int:", "oid:", "uuid:", "hex:", "bin:", "str:"];

/// The value of a tenant key or of a document id, as far as routing is concerned.
///
/// Only the BSON types that have a routing encoding are representable. BSON
/// `int32` and `int64` both become [`KeyValue::Int`]: the encoding widens every
/// integer to 8 bytes, so a document whose key was written as `int32` routes
/// exactly like one written as `int64` with the same value.
///
/// The JSON form is tagged by `type`:
/// `{"type":"string","value":"cust-1"}`, `{"type":"int","value":42}`,
/// `{"type":"object_id","value":"<24 hex>"}`,
/// `{"type":"binary","subtype":4,"value":"<hex>"}`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "KeyValueJson", into = "KeyValueJson")]
pub enum KeyValue {
    /// A UTF-8 string.
    String(String),
    /// An integer (BSON `int32` or `int64`).
    Int(i64),
    /// A BSON ObjectId.
    ObjectId([u8; 12]),
    /// BSON binary data; a UUID is subtype 4. The subtype does not take part in routing.
    Binary {
        /// The BSON binary subtype.
        subtype: u8,
        /// The raw bytes.
        bytes: Vec<u8>,
    },
}

impl KeyValue {
    /// A UUID key (binary subtype 4).
    pub fn uuid(uuid: uuid::Uuid) -> KeyValue {
        KeyValue::Binary {
            subtype: UUID_SUBTYPE,
            bytes: uuid.as_bytes().to_vec(),
        }
    }

    /// The bytes that are hashed for this key.
    ///
    /// - string: its UTF-8 bytes;
    /// - int: the 8 bytes of the `i64`, little-endian;
    /// - ObjectId: its 12 bytes;
    /// - binary (including UUID): the raw bytes, without the subtype.
    pub fn encode(&self) -> Vec<u8> {
        self.with_encoding(<[u8]>::to_vec)
    }

    /// Feeds the encoding to `consume` without allocating.
    pub(crate) fn with_encoding<R>(&self, consume: impl FnOnce(&[u8]) -> R) -> R {
        match self {
            KeyValue::String(text) => consume(text.as_bytes()),
            KeyValue::Int(value) => consume(&value.to_le_bytes()),
            KeyValue::ObjectId(bytes) => consume(bytes),
            KeyValue::Binary { bytes, .. } => consume(bytes),
        }
    }

    /// Reads a key from a BSON value taken from a document.
    ///
    /// Accepts string, int32 (widened to i64), int64, ObjectId and binary of any
    /// subtype, and a double whose value is a whole number in the int64 range, which reads as
    /// that integer: MongoDB treats `7` and `7.0` as the same value (they collide in a unique
    /// index and `{_id: 7}` finds `{_id: 7.0}`), so they must route alike. (mongosh writes
    /// every number as a double.) Every other type, and a double with a fraction, NaN or an
    /// infinity, is [`RoutingError::UnsupportedKeyType`].
    pub fn from_bson(value: &Bson) -> Result<KeyValue, RoutingError> {
        match value {
            Bson::String(text) => Ok(KeyValue::String(text.clone())),
            Bson::Int32(value) => Ok(KeyValue::Int(i64::from(*value))),
            Bson::Int64(value) => Ok(KeyValue::Int(*value)),
            Bson::Double(value) if whole_number(*value).is_some() => {
                Ok(KeyValue::Int(whole_number(*value).expect("checked")))
            }
            Bson::ObjectId(oid) => Ok(KeyValue::ObjectId(oid.bytes())),
            Bson::Binary(binary) => Ok(KeyValue::Binary {
                subtype: u8::from(binary.subtype),
                bytes: binary.bytes.clone(),
            }),
            other => Err(RoutingError::UnsupportedKeyType {
                bson_type: bson_type_name(other).to_owned(),
            }),
        }
    }

    /// The BSON value to put in a document or a query.
    ///
    /// Integers always become `int64`: the original width is not kept, and does
    /// not need to be, because the routing encoding widens every integer, and
    /// MongoDB matches `int32` and `int64` of the same value in queries.
    pub fn to_bson(&self) -> Bson {
        match self {
            KeyValue::String(text) => Bson::String(text.clone()),
            KeyValue::Int(value) => Bson::Int64(*value),
            KeyValue::ObjectId(bytes) => Bson::ObjectId(bson::oid::ObjectId::from_bytes(*bytes)),
            KeyValue::Binary { subtype, bytes } => Bson::Binary(Binary {
                subtype: BinarySubtype::from(*subtype),
                bytes: bytes.clone(),
            }),
        }
    }

    /// Parses the command-line form of a key.
    ///
    /// | text | key |
    /// |---|---|
    /// | `int:42` | int |
    /// | `oid:<24 hex digits>` | ObjectId |
    /// | `uuid:<canonical uuid>` | binary subtype 4 |
    /// | `hex:<hex bytes>` | binary subtype 0 |
    /// | `bin:<subtype>:<hex bytes>` | binary of any subtype |
    /// | `str:<text>` | string (for text that starts with one of these prefixes) |
    /// | anything else | string |
    pub fn parse_cli(text: &str) -> Result<KeyValue, RoutingError> {
        let invalid = |reason: String| RoutingError::InvalidCliKey {
            input: text.to_owned(),
            reason,
        };
        if let Some(rest) = text.strip_prefix("str:") {
            return Ok(KeyValue::String(rest.to_owned()));
        }
        if let Some(rest) = text.strip_prefix("int:") {
            return rest
                .parse::<i64>()
                .map(KeyValue::Int)
                .map_err(|_| invalid(format!("{rest:?} is not a 64-bit signed integer")));
        }
        if let Some(rest) = text.strip_prefix("oid:") {
            let bytes = hex::decode(rest)
                .ok()
                .and_then(|bytes| <[u8; 12]>::try_from(bytes).ok())
                .ok_or_else(|| invalid(format!("{rest:?} is not 24 hex digits")))?;
            return Ok(KeyValue::ObjectId(bytes));
        }
        if let Some(rest) = text.strip_prefix("uuid:") {
            let uuid = uuid::Uuid::try_parse(rest).map_err(|_| {
                invalid(format!(
                    "{rest:?} is not a UUID like 123e4567-e89b-12d3-a456-426614174000"
                ))
            })?;
            return Ok(KeyValue::uuid(uuid));
        }
        if let Some(rest) = text.strip_prefix("hex:") {
            let bytes = hex::decode(rest)
                .map_err(|_| invalid(format!("{rest:?} is not an even number of hex digits")))?;
            return Ok(KeyValue::Binary {
                subtype: GENERIC_BINARY_SUBTYPE,
                bytes,
            });
        }
        if let Some(rest) = text.strip_prefix("bin:") {
            let (subtype, payload) = rest
                .split_once(':')
                .ok_or_else(|| invalid(format!("{rest:?} is not <subtype>:<hex bytes>")))?;
            let subtype = subtype
                .parse::<u8>()
                .map_err(|_| invalid(format!("{subtype:?} is not a subtype between 0 and 255")))?;
            let bytes = hex::decode(payload)
                .map_err(|_| invalid(format!("{payload:?} is not an even number of hex digits")))?;
            return Ok(KeyValue::Binary { subtype, bytes });
        }
        Ok(KeyValue::String(text.to_owned()))
    }

    /// A short name of the key type, for messages.
    pub fn type_name(&self) -> &'static str {
        match self {
            KeyValue::String(_) => "string",
            KeyValue::Int(_) => "int",
            KeyValue::ObjectId(_) => "object_id",
            KeyValue::Binary { .. } => "binary",
        }
    }
}

/// Prints the [`KeyValue::parse_cli`] form, so that printing and parsing round-trip.
impl fmt::Display for KeyValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeyValue::String(text) => {
                if CLI_PREFIXES.iter().any(|prefix| text.starts_with(prefix)) {
                    write!(f, "str:{text}")
                } else {
                    f.write_str(text)
                }
            }
            KeyValue::Int(value) => write!(f, "int:{value}"),
            KeyValue::ObjectId(bytes) => write!(f, "oid:{}", hex::encode(bytes)),
            KeyValue::Binary { subtype, bytes } => {
                match (*subtype, uuid::Uuid::from_slice(bytes)) {
                    (UUID_SUBTYPE, Ok(uuid)) => write!(f, "uuid:{uuid}"),
                    (GENERIC_BINARY_SUBTYPE, _) => write!(f, "hex:{}", hex::encode(bytes)),
                    _ => write!(f, "bin:{subtype}:{}", hex::encode(bytes)),
                }
            }
        }
    }
}

/// The integer a double equals exactly, when it is a whole number in the int64 range.
fn whole_number(value: f64) -> Option<i64> {
    // -2^63 and 2^63 are exact doubles; every whole double in [-2^63, 2^63) is an i64.
    const TWO_63: f64 = 9_223_372_036_854_775_808.0;
    (value.is_finite() && value.fract() == 0.0 && (-TWO_63..TWO_63).contains(&value))
        .then_some(value as i64)
}

/// The name MongoDB uses for a BSON type, for error messages.
fn bson_type_name(value: &Bson) -> &'static str {
    match value {
        Bson::Double(_) => "double",
        Bson::String(_) => "string",
        Bson::Array(_) => "array",
        Bson::Document(_) => "object",
        Bson::Boolean(_) => "bool",
        Bson::Null => "null",
        Bson::RegularExpression(_) => "regex",
        Bson::JavaScriptCode(_) => "javascript",
        Bson::JavaScriptCodeWithScope(_) => "javascriptWithScope",
        Bson::Int32(_) => "int",
        Bson::Int64(_) => "long",
        Bson::Timestamp(_) => "timestamp",
        Bson::Binary(_) => "binData",
        Bson::ObjectId(_) => "objectId",
        Bson::DateTime(_) => "date",
        Bson::Symbol(_) => "symbol",
        Bson::Decimal128(_) => "decimal",
        Bson::Undefined => "undefined",
        Bson::MaxKey => "maxKey",
        Bson::MinKey => "minKey",
        Bson::DbPointer(_) => "dbPointer",
    }
}

/// The JSON shape of a [`KeyValue`]; bytes are written as lowercase hex.
#[derive(Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum KeyValueJson {
    String { value: String },
    Int { value: i64 },
    ObjectId { value: String },
    Binary { subtype: u8, value: String },
}

impl From<KeyValue> for KeyValueJson {
    fn from(key: KeyValue) -> Self {
        match key {
            KeyValue::String(value) => KeyValueJson::String { value },
            KeyValue::Int(value) => KeyValueJson::Int { value },
            KeyValue::ObjectId(bytes) => KeyValueJson::ObjectId {
                value: hex::encode(bytes),
            },
            KeyValue::Binary { subtype, bytes } => KeyValueJson::Binary {
                subtype,
                value: hex::encode(bytes),
            },
        }
    }
}

impl TryFrom<KeyValueJson> for KeyValue {
    type Error = String;

    fn try_from(json: KeyValueJson) -> Result<Self, Self::Error> {
        match json {
            KeyValueJson::String { value } => Ok(KeyValue::String(value)),
            KeyValueJson::Int { value } => Ok(KeyValue::Int(value)),
            KeyValueJson::ObjectId { value } => hex::decode(&value)
                .ok()
                .and_then(|bytes| <[u8; 12]>::try_from(bytes).ok())
                .map(KeyValue::ObjectId)
                .ok_or_else(|| format!("object_id value {value:?} is not 24 hex digits")),
            KeyValueJson::Binary { subtype, value } => hex::decode(&value)
                .map(|bytes| KeyValue::Binary { subtype, bytes })
                .map_err(|_| format!("binary value {value:?} is not an even number of hex digits")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn oid_bytes() -> [u8; 12] {
        [
            0x65, 0x0f, 0x1a, 0x2b, 0x3c, 0x4d, 0x5e, 0x6f, 0x70, 0x81, 0x92, 0xa3,
        ]
    }

    #[test]
    fn strings_encode_as_utf8() {
        assert_eq!(KeyValue::String("cust-1".into()).encode(), b"cust-1");
        assert_eq!(
            KeyValue::String("Ärger".into()).encode(),
            vec![0xc3, 0x84, b'r', b'g', b'e', b'r']
        );
        assert!(KeyValue::String(String::new()).encode().is_empty());
    }

    #[test]
    fn ints_encode_as_eight_little_endian_bytes() {
        assert_eq!(KeyValue::Int(1).encode(), vec![1, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(KeyValue::Int(-1).encode(), vec![0xff; 8]);
        assert_eq!(
            KeyValue::Int(0x0102_0304_0506_0708).encode(),
            vec![8, 7, 6, 5, 4, 3, 2, 1]
        );
    }

    #[test]
    fn object_ids_and_binaries_encode_as_their_bytes() {
        assert_eq!(
            KeyValue::ObjectId(oid_bytes()).encode(),
            oid_bytes().to_vec()
        );
        let binary = KeyValue::Binary {
            subtype: 4,
            bytes: vec![1, 2, 3],
        };
        assert_eq!(binary.encode(), vec![1, 2, 3]);
    }

    #[test]
    fn int32_and_int64_are_the_same_key() {
        let narrow = KeyValue::from_bson(&Bson::Int32(-7)).unwrap();
        let wide = KeyValue::from_bson(&Bson::Int64(-7)).unwrap();
        assert_eq!(narrow, wide);
        assert_eq!(narrow.to_bson(), Bson::Int64(-7));
    }

    #[test]
    fn from_bson_accepts_the_routing_types() {
        let oid = bson::oid::ObjectId::from_bytes(oid_bytes());
        assert_eq!(
            KeyValue::from_bson(&Bson::ObjectId(oid)).unwrap(),
            KeyValue::ObjectId(oid_bytes())
        );
        let uuid = uuid::Uuid::parse_str("123e4567-e89b-12d3-a456-426614174000").unwrap();
        let bson_uuid = Bson::Binary(Binary {
            subtype: BinarySubtype::Uuid,
            bytes: uuid.as_bytes().to_vec(),
        });
        let key = KeyValue::from_bson(&bson_uuid).unwrap();
        assert_eq!(key, KeyValue::uuid(uuid));
        assert_eq!(key.to_bson(), bson_uuid);
        assert_eq!(
            KeyValue::from_bson(&Bson::String("a".into())).unwrap(),
            KeyValue::String("a".into())
        );
    }

    #[test]
    fn whole_doubles_read_as_the_integer_mongodb_takes_them_for() {
        for (double, int) in [(7.0, 7), (-0.0, 0), (4_611_686_018_427_387_904.0, 1 << 62)] {
            assert_eq!(
                KeyValue::from_bson(&Bson::Double(double)).unwrap(),
                KeyValue::Int(int)
            );
        }
        for refused in [1.5, f64::NAN, f64::INFINITY, 9_223_372_036_854_775_808.0] {
            assert!(
                KeyValue::from_bson(&Bson::Double(refused)).is_err(),
                "{refused}"
            );
        }
    }

    #[test]
    fn from_bson_refuses_other_types_naming_them() {
        let error = KeyValue::from_bson(&Bson::Double(1.5)).unwrap_err();
        assert_eq!(
            error,
            RoutingError::UnsupportedKeyType {
                bson_type: "double".into()
            }
        );
        let message = error.to_string();
        assert!(message.contains("double"), "{message}");
        assert!(message.contains("objectId"), "{message}");
        assert!(
            KeyValue::from_bson(&Bson::Null).is_err()
                && KeyValue::from_bson(&Bson::Document(bson::doc! {})).is_err()
        );
    }

    #[test]
    fn parse_cli_forms() {
        let cases = [
            ("int:42", KeyValue::Int(42)),
            ("int:-9223372036854775808", KeyValue::Int(i64::MIN)),
            (
                "oid:650f1a2b3c4d5e6f708192a3",
                KeyValue::ObjectId(oid_bytes()),
            ),
            (
                "uuid:123e4567-e89b-12d3-a456-426614174000",
                KeyValue::uuid(
                    uuid::Uuid::parse_str("123e4567-e89b-12d3-a456-426614174000").unwrap(),
                ),
            ),
            (
                "hex:00ff",
                KeyValue::Binary {
                    subtype: 0,
                    bytes: vec![0, 0xff],
                },
            ),
            (
                "bin:128:0a",
                KeyValue::Binary {
                    subtype: 128,
                    bytes: vec![0x0a],
                },
            ),
            ("str:int:42", KeyValue::String("int:42".into())),
            ("cust-1", KeyValue::String("cust-1".into())),
            ("", KeyValue::String(String::new())),
            ("42", KeyValue::String("42".into())),
        ];
        for (text, expected) in cases {
            assert_eq!(KeyValue::parse_cli(text).unwrap(), expected, "{text}");
        }
    }

    #[test]
    fn parse_cli_errors_name_the_accepted_forms() {
        for text in [
            "int:4x",
            "int:",
            "oid:1234",
            "oid:zz0f1a2b3c4d5e6f708192a3",
            "uuid:nope",
            "hex:abc",
            "bin:4",
            "bin:300:00",
        ] {
            let error = KeyValue::parse_cli(text).unwrap_err();
            let message = error.to_string();
            assert!(
                matches!(error, RoutingError::InvalidCliKey { .. }),
                "{text}: {error:?}"
            );
            assert!(message.contains("int:<i64>"), "{message}");
            assert!(message.contains("oid:<24 hex digits>"), "{message}");
        }
    }

    #[test]
    fn display_round_trips_through_parse_cli() {
        let keys = [
            KeyValue::String("plain".into()),
            KeyValue::String("int:7".into()),
            KeyValue::String("str:x".into()),
            KeyValue::String(String::new()),
            KeyValue::Int(i64::MAX),
            KeyValue::ObjectId(oid_bytes()),
            KeyValue::uuid(uuid::Uuid::from_u128(0x1234)),
            KeyValue::Binary {
                subtype: 4,
                bytes: vec![1, 2],
            },
            KeyValue::Binary {
                subtype: 0,
                bytes: vec![],
            },
            KeyValue::Binary {
                subtype: 5,
                bytes: vec![9],
            },
        ];
        for key in keys {
            let text = key.to_string();
            assert_eq!(KeyValue::parse_cli(&text).unwrap(), key, "{text}");
        }
        assert_eq!(KeyValue::Int(42).to_string(), "int:42");
        assert_eq!(KeyValue::String("hex:1".into()).to_string(), "str:hex:1");
    }

    #[test]
    fn json_form_is_tagged() {
        let cases = [
            (
                KeyValue::String("cust-1".into()),
                r#"{"type":"string","value":"cust-1"}"#,
            ),
            (KeyValue::Int(42), r#"{"type":"int","value":42}"#),
            (
                KeyValue::ObjectId(oid_bytes()),
                r#"{"type":"object_id","value":"650f1a2b3c4d5e6f708192a3"}"#,
            ),
            (
                KeyValue::Binary {
                    subtype: 4,
                    bytes: vec![0xab, 0x01],
                },
                r#"{"type":"binary","subtype":4,"value":"ab01"}"#,
            ),
        ];
        for (key, json) in cases {
            assert_eq!(serde_json::to_string(&key).unwrap(), json);
            assert_eq!(serde_json::from_str::<KeyValue>(json).unwrap(), key);
        }
        assert!(serde_json::from_str::<KeyValue>(r#"{"type":"object_id","value":"12"}"#).is_err());
        assert!(serde_json::from_str::<KeyValue>(r#"{"type":"double","value":1.5}"#).is_err());
    }
}
