//! MongoDB's comparison order of BSON values under the simple collation: the one total order
//! that sorts, `$min`/`$max`, `$group` keys and equality (`1 == 1.0 == NumberLong(1)`) use.
//!
//! Values of different type classes ([`crate::ids::Class`]: every number together, strings
//! with symbols) follow the classes' order whatever their values. Within a class: numbers by
//! exact value ([`super::number::compare`]); strings by their UTF-8 bytes; documents field by
//! field (the type class of the values, then the field name by bytes, then the value,
//! recursively; a document that runs out first is smaller); arrays element by element, the
//! shorter first when one is a prefix of the other; binary data by length, then subtype, then
//! bytes; ObjectIds by bytes; `false < true`; dates as signed milliseconds; timestamps as
//! unsigned (seconds, increment); regular expressions by pattern then flags; DBPointers by
//! namespace length, namespace, then ObjectId; JavaScript by code (and then scope). MinKey,
//! MaxKey, null and undefined are each one value.
//!
//! This is the order of whole values. A sort on a path that reaches arrays, or a query
//! comparison (type bracketing), is not this comparison alone: see [`super::sort`].

use std::cmp::Ordering;

use bson::{Bson, Document};

use crate::ids::Class;

/// MongoDB's total order of two values.
pub fn compare(a: &Bson, b: &Bson) -> Ordering {
    let (ca, cb) = (Class::of(a), Class::of(b));
    if ca != cb {
        return ca.cmp(&cb);
    }
    if let Some(order) = super::number::compare(a, b) {
        return order;
    }
    match (a, b) {
        (Bson::String(x) | Bson::Symbol(x), Bson::String(y) | Bson::Symbol(y)) => {
            x.as_bytes().cmp(y.as_bytes())
        }
        (Bson::Document(x), Bson::Document(y)) => compare_documents(x, y),
        (Bson::Array(x), Bson::Array(y)) => compare_arrays(x, y),
        (Bson::Binary(x), Bson::Binary(y)) => x
            .bytes
            .len()
            .cmp(&y.bytes.len())
            .then(u8::from(x.subtype).cmp(&u8::from(y.subtype)))
            .then_with(|| x.bytes.cmp(&y.bytes)),
        (Bson::ObjectId(x), Bson::ObjectId(y)) => x.bytes().cmp(&y.bytes()),
        (Bson::Boolean(x), Bson::Boolean(y)) => x.cmp(y),
        (Bson::DateTime(x), Bson::DateTime(y)) => x.timestamp_millis().cmp(&y.timestamp_millis()),
        (Bson::Timestamp(x), Bson::Timestamp(y)) => {
            (x.time, x.increment).cmp(&(y.time, y.increment))
        }
        (Bson::RegularExpression(x), Bson::RegularExpression(y)) => x
            .pattern
            .as_bytes()
            .cmp(y.pattern.as_bytes())
            .then_with(|| x.options.as_bytes().cmp(y.options.as_bytes())),
        (Bson::JavaScriptCode(x), Bson::JavaScriptCode(y)) => x.as_bytes().cmp(y.as_bytes()),
        (Bson::JavaScriptCodeWithScope(x), Bson::JavaScriptCodeWithScope(y)) => x
            .code
            .as_bytes()
            .cmp(y.code.as_bytes())
            .then_with(|| compare_documents(&x.scope, &y.scope)),
        (Bson::DbPointer(_), Bson::DbPointer(_)) => {
            let (xn, xi) = db_pointer(a);
            let (yn, yi) = db_pointer(b);
            xn.len()
                .cmp(&yn.len())
                .then_with(|| xn.as_bytes().cmp(yn.as_bytes()))
                .then_with(|| xi.cmp(&yi))
        }
        // MinKey, MaxKey, null and undefined: one value each.
        _ => Ordering::Equal,
    }
}

/// MongoDB's equality: [`compare`] finds the values equal (`1`, `1.0` and `NumberLong(1)` are
/// equal; `{a: 1, b: 2}` and `{b: 2, a: 1}` are not).
pub fn equal(a: &Bson, b: &Bson) -> bool {
    compare(a, b) == Ordering::Equal
}

/// Two documents field by field: each pair by type class, then field name, then value.
pub fn compare_documents(x: &Document, y: &Document) -> Ordering {
    let mut left = x.iter();
    let mut right = y.iter();
    loop {
        match (left.next(), right.next()) {
            (None, None) => return Ordering::Equal,
            (None, Some(_)) => return Ordering::Less,
            (Some(_), None) => return Ordering::Greater,
            (Some((kx, vx)), Some((ky, vy))) => {
                let order = Class::of(vx)
                    .cmp(&Class::of(vy))
                    .then_with(|| kx.as_bytes().cmp(ky.as_bytes()))
                    .then_with(|| compare(vx, vy));
                if order != Ordering::Equal {
                    return order;
                }
            }
        }
    }
}

fn compare_arrays(x: &[Bson], y: &[Bson]) -> Ordering {
    for (vx, vy) in x.iter().zip(y) {
        let order = compare(vx, vy);
        if order != Ordering::Equal {
            return order;
        }
    }
    x.len().cmp(&y.len())
}

/// A DBPointer's namespace and ObjectId bytes (the `bson` crate keeps its fields private; its
/// extended JSON names both).
fn db_pointer(value: &Bson) -> (String, Vec<u8>) {
    let json = value.clone().into_canonical_extjson();
    let pointer = &json["$dbPointer"];
    let namespace = pointer["$ref"].as_str().unwrap_or_default().to_owned();
    let id = pointer["$id"]["$oid"].as_str().unwrap_or_default();
    (namespace, hex::decode(id).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::spec::BinarySubtype;
    use bson::{doc, oid::ObjectId, Binary, DateTime, Decimal128, Regex, Timestamp};
    use proptest::prelude::*;
    use std::str::FromStr;

    /// One value of each class and several within classes, in MongoDB's order (the manual's
    /// "Comparison/Sort Order" page).
    fn ascending() -> Vec<Bson> {
        vec![
            Bson::MinKey,
            Bson::Null,
            Bson::Double(f64::NAN),
            Bson::Double(f64::NEG_INFINITY),
            Bson::Int64(i64::MIN),
            Bson::Int32(-1),
            Bson::Decimal128(Decimal128::from_str("-0.5").unwrap()),
            Bson::Int32(0),
            Bson::Double(0.5),
            Bson::Int64(1 << 53),
            Bson::Int64((1 << 53) + 1),
            Bson::Double(f64::INFINITY),
            Bson::String(String::new()),
            Bson::String("B".into()),
            Bson::String("a".into()),
            Bson::String("ab".into()),
            Bson::String("é".into()),
            Bson::Document(doc! {}),
            Bson::Document(doc! { "a": 1 }),
            Bson::Document(doc! { "a": 1, "b": 1 }),
            Bson::Document(doc! { "b": 0 }),
            Bson::Document(doc! { "a": "x" }),
            Bson::Array(vec![]),
            Bson::Array(vec![Bson::Int32(1)]),
            Bson::Array(vec![Bson::Int32(1), Bson::Int32(0)]),
            Bson::Array(vec![Bson::Int32(2)]),
            Bson::Binary(Binary {
                subtype: BinarySubtype::UserDefined(0x80),
                bytes: vec![9],
            }),
            Bson::Binary(Binary {
                subtype: BinarySubtype::Generic,
                bytes: vec![0, 0],
            }),
            Bson::Binary(Binary {
                subtype: BinarySubtype::Uuid,
                bytes: vec![0, 0],
            }),
            Bson::ObjectId(ObjectId::from_bytes([0; 12])),
            Bson::ObjectId(ObjectId::from_bytes([1; 12])),
            Bson::Boolean(false),
            Bson::Boolean(true),
            Bson::DateTime(DateTime::from_millis(-1)),
            Bson::DateTime(DateTime::from_millis(5)),
            Bson::Timestamp(Timestamp {
                time: 1,
                increment: 9,
            }),
            Bson::Timestamp(Timestamp {
                time: u32::MAX,
                increment: 0,
            }),
            Bson::RegularExpression(Regex {
                pattern: "a".into(),
                options: "".into(),
            }),
            Bson::RegularExpression(Regex {
                pattern: "a".into(),
                options: "i".into(),
            }),
            Bson::JavaScriptCode("x".into()),
            Bson::MaxKey,
        ]
    }

    #[test]
    fn values_follow_mongodbs_comparison_order() {
        let values = ascending();
        for (i, a) in values.iter().enumerate() {
            for (j, b) in values.iter().enumerate() {
                assert_eq!(compare(a, b), i.cmp(&j), "{a} vs {b}");
            }
        }
    }

    #[test]
    fn numbers_are_equal_across_types() {
        assert!(equal(&Bson::Int32(1), &Bson::Double(1.0)));
        assert!(equal(&Bson::Int32(1), &Bson::Int64(1)));
        assert!(equal(
            &Bson::Decimal128(Decimal128::from_str("1.000").unwrap()),
            &Bson::Int64(1)
        ));
        assert!(equal(&Bson::Double(-0.0), &Bson::Int32(0)));
        assert!(!equal(&Bson::Int32(1), &Bson::String("1".into())));
        // Documents compare their fields in order: the same fields in another order differ.
        assert!(!equal(
            &Bson::Document(doc! { "a": 1, "b": 2 }),
            &Bson::Document(doc! { "b": 2, "a": 1 })
        ));
        assert!(equal(
            &Bson::Document(doc! { "a": 1, "b": [2.0] }),
            &Bson::Document(doc! { "a": 1_i64, "b": [2] })
        ));
        assert!(equal(&Bson::Symbol("s".into()), &Bson::String("s".into())));
    }

    #[test]
    fn a_field_of_a_lower_type_sorts_first_whatever_its_name() {
        // {b: 1} < {a: "x"}: the values' type classes are compared before the field names.
        assert_eq!(
            compare(
                &Bson::Document(doc! { "b": 1 }),
                &Bson::Document(doc! { "a": "x" })
            ),
            Ordering::Less
        );
    }

    fn leaf() -> impl Strategy<Value = Bson> {
        prop_oneof![
            Just(Bson::Null),
            Just(Bson::MinKey),
            Just(Bson::MaxKey),
            any::<bool>().prop_map(Bson::Boolean),
            (-3i32..3).prop_map(Bson::Int32),
            prop_oneof![Just(i64::MAX), Just(i64::MIN), -3i64..3].prop_map(Bson::Int64),
            prop_oneof![
                Just(f64::NAN),
                Just(-0.0),
                Just(0.5),
                Just(f64::INFINITY),
                Just(9_223_372_036_854_775_808.0),
                -3.0f64..3.0
            ]
            .prop_map(Bson::Double),
            prop_oneof![
                Just("1"),
                Just("-0.5"),
                Just("0.50"),
                Just("NaN"),
                Just("-Infinity"),
                Just("9223372036854775807"),
                Just("1E-400")
            ]
            .prop_map(|s| Bson::Decimal128(Decimal128::from_str(s).unwrap())),
            "[ab]{0,2}".prop_map(Bson::String),
            (0u8..3).prop_map(|b| Bson::ObjectId(ObjectId::from_bytes([b; 12]))),
        ]
    }

    fn value() -> impl Strategy<Value = Bson> {
        leaf().prop_recursive(2, 8, 3, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..3).prop_map(Bson::Array),
                proptest::collection::vec(("[ab]", inner), 0..3)
                    .prop_map(|fields| Bson::Document(fields.into_iter().collect())),
            ]
        })
    }

    proptest! {
        #[test]
        fn compare_is_a_total_order_consistent_with_equal(a in value(), b in value(), c in value()) {
            let ab = compare(&a, &b);
            prop_assert_eq!(ab, compare(&b, &a).reverse(), "antisymmetric: {} {}", a, b);
            prop_assert_eq!(compare(&a, &a), Ordering::Equal);
            prop_assert_eq!(equal(&a, &b), ab == Ordering::Equal);
            let bc = compare(&b, &c);
            if ab != Ordering::Greater && bc != Ordering::Greater {
                prop_assert_ne!(compare(&a, &c), Ordering::Greater, "transitive: {} {} {}", a, b, c);
            }
            if ab == Ordering::Equal {
                prop_assert_eq!(compare(&a, &c), bc, "equal values compare alike: {} {} {}", a, b, c);
            }
        }
    }
}
