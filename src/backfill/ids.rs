//! `_id` values as partition bounds: type brackets, ordering, encoding, split points.
//!
//! A MongoDB range query on `_id` only matches values of the bound's type bracket (numbers of
//! every width compare with each other; strings, ObjectIds and binary each stand alone), so
//! each bracket present in a collection is partitioned on its own, and each partition's
//! filter starts at the bracket's floor. Orders here are MongoDB's within a bracket (simple
//! collation): numbers by value, strings by UTF-8 bytes, ObjectIds by bytes, binary by length,
//! then subtype, then bytes.

use std::cmp::Ordering;

use mongodb::bson::spec::BinarySubtype;
use mongodb::bson::{doc, oid::ObjectId, Binary, Bson, Document};

/// An `_id` type bracket that reshard partitions by (the routable key types).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Bracket {
    Number,
    String,
    ObjectId,
    Binary,
}

impl Bracket {
    pub const ALL: [Bracket; 4] = [
        Bracket::Number,
        Bracket::String,
        Bracket::ObjectId,
        Bracket::Binary,
    ];

    /// The bracket of a value; `None` for types reshard cannot route.
    pub fn of(id: &Bson) -> Option<Bracket> {
        match id {
            Bson::Int32(_) | Bson::Int64(_) | Bson::Double(_) | Bson::Decimal128(_) => {
                Some(Bracket::Number)
            }
            Bson::String(_) => Some(Bracket::String),
            Bson::ObjectId(_) => Some(Bracket::ObjectId),
            Bson::Binary(_) => Some(Bracket::Binary),
            _ => None,
        }
    }

    /// The name stored with a partition (MongoDB's `$type` alias of the bracket).
    pub fn name(self) -> &'static str {
        match self {
            Bracket::Number => "number",
            Bracket::String => "string",
            Bracket::ObjectId => "objectId",
            Bracket::Binary => "binData",
        }
    }

    pub fn parse(name: &str) -> Option<Bracket> {
        Bracket::ALL.into_iter().find(|b| b.name() == name)
    }

    /// The smallest value of the bracket: `{$gte: floor}` matches exactly the bracket.
    pub fn floor(self) -> Bson {
        match self {
            Bracket::Number => Bson::Double(f64::NEG_INFINITY),
            Bracket::String => Bson::String(String::new()),
            Bracket::ObjectId => Bson::ObjectId(ObjectId::from_bytes([0; 12])),
            Bracket::Binary => Bson::Binary(Binary {
                subtype: BinarySubtype::Generic,
                bytes: Vec::new(),
            }),
        }
    }
}

/// MongoDB's order of `_id`s: the router's listing order ([`crate::router::compare_ids`]).
pub use crate::router::compare_ids as compare;

/// An `_id` as stored in Postgres (partition bounds, checkpoints, dead letters): the BSON of
/// `{"v": id}`, so every type round-trips exactly.
pub fn encode(id: &Bson) -> Vec<u8> {
    mongodb::bson::to_vec(&doc! { "v": id.clone() }).expect("a BSON value encodes")
}

pub fn decode(bytes: &[u8]) -> Result<Bson, String> {
    let d: Document =
        mongodb::bson::from_slice(bytes).map_err(|e| format!("stored _id unreadable: {e}"))?;
    d.get("v")
        .cloned()
        .ok_or_else(|| "stored _id unreadable: no value".to_owned())
}

/// An `_id` as an operator types it and sees it: strings bare, numbers as digits, others in
/// relaxed extended JSON (`{"$oid": "..."}`).
pub fn text(id: &Bson) -> String {
    match id {
        Bson::String(s) => s.clone(),
        Bson::Int32(i) => i.to_string(),
        Bson::Int64(i) => i.to_string(),
        other => other.clone().into_relaxed_extjson().to_string(),
    }
}

/// `parts - 1` split points (fewer when the sample has fewer distinct values) that cut
/// `sorted` (sorted by [`compare`]) into `parts` runs of about equal size. Each point is the
/// inclusive lower bound of the next partition; the points are strictly increasing.
pub fn split_points(sorted: &[Bson], parts: usize) -> Vec<Bson> {
    let mut points: Vec<Bson> = Vec::new();
    if parts < 2 || sorted.is_empty() {
        return points;
    }
    for k in 1..parts {
        let candidate = &sorted[k * sorted.len() / parts];
        let above_last = points
            .last()
            .is_none_or(|last| compare(candidate, last) == Ordering::Greater);
        // The first value of the sample is no use as a bound: it would leave an empty
        // partition below it only by accident of sampling.
        if above_last && compare(candidate, &sorted[0]) == Ordering::Greater {
            points.push(candidate.clone());
        }
    }
    points
}

/// The `_id` condition of a partition's scan: from `lower` (inclusive) or after `resume`
/// (exclusive), below `upper`, within `bracket`.
pub fn range_filter(
    bracket: Bracket,
    lower: Option<&Bson>,
    resume_after: Option<&Bson>,
    upper: Option<&Bson>,
) -> Document {
    let mut cond = match resume_after {
        Some(after) => doc! { "$gt": after.clone() },
        None => doc! { "$gte": lower.cloned().unwrap_or_else(|| bracket.floor()) },
    };
    if let Some(upper) = upper {
        cond.insert("$lt", upper.clone());
    }
    doc! { "_id": cond }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn brackets_and_floors() {
        assert_eq!(Bracket::of(&Bson::Int32(1)), Some(Bracket::Number));
        assert_eq!(Bracket::of(&Bson::Double(1.5)), Some(Bracket::Number));
        assert_eq!(Bracket::of(&Bson::Boolean(true)), None);
        for b in Bracket::ALL {
            assert_eq!(Bracket::of(&b.floor()), Some(b));
            assert_eq!(Bracket::parse(b.name()), Some(b));
        }
    }

    #[test]
    fn numbers_compare_across_widths_and_binary_by_length_first() {
        assert_eq!(compare(&Bson::Int32(5), &Bson::Int64(5)), Ordering::Equal);
        assert_eq!(
            compare(&Bson::Int64(i64::MAX), &Bson::Int64(i64::MAX - 1)),
            Ordering::Greater
        );
        assert_eq!(compare(&Bson::Double(2.5), &Bson::Int32(3)), Ordering::Less);
        let bin = |b: &[u8]| {
            Bson::Binary(Binary {
                subtype: BinarySubtype::Generic,
                bytes: b.to_vec(),
            })
        };
        assert_eq!(compare(&bin(&[9]), &bin(&[0, 0])), Ordering::Less);
        assert_eq!(
            compare(&Bson::String("Z".into()), &Bson::String("a".into())),
            Ordering::Less
        );
    }

    #[test]
    fn encoding_round_trips_every_bracket() {
        for id in [
            Bson::Int32(-4),
            Bson::Int64(1 << 40),
            Bson::String("ord-1".into()),
            Bson::ObjectId(ObjectId::new()),
            Bracket::Binary.floor(),
        ] {
            assert_eq!(decode(&encode(&id)).unwrap(), id);
        }
        assert!(decode(b"junk").is_err());
    }

    #[test]
    fn ids_read_as_operators_type_them() {
        assert_eq!(text(&Bson::String("o-1".into())), "o-1");
        assert_eq!(text(&Bson::Int64(7)), "7");
        let oid = ObjectId::from_bytes([1; 12]);
        assert_eq!(
            text(&Bson::ObjectId(oid)),
            format!("{{\"$oid\":\"{oid}\"}}")
        );
    }

    #[test]
    fn range_filters_resume_after_the_checkpoint() {
        let f = range_filter(Bracket::String, None, None, Some(&Bson::String("m".into())));
        assert_eq!(f, doc! { "_id": { "$gte": "", "$lt": "m" } });
        let f = range_filter(
            Bracket::Number,
            Some(&Bson::Int32(10)),
            Some(&Bson::Int32(15)),
            None,
        );
        assert_eq!(f, doc! { "_id": { "$gt": 15 } });
    }

    proptest! {
        #[test]
        fn split_points_increase_and_cut_evenly(
            mut values in proptest::collection::vec(0i64..1_000, 1..400),
            parts in 1usize..12,
        ) {
            values.sort();
            let sorted: Vec<Bson> = values.iter().map(|v| Bson::Int64(*v)).collect();
            let points = split_points(&sorted, parts);
            prop_assert!(points.len() < parts.max(1));
            for w in points.windows(2) {
                prop_assert_eq!(compare(&w[0], &w[1]), Ordering::Less);
            }
            if let Some(first) = points.first() {
                prop_assert_eq!(compare(first, &sorted[0]), Ordering::Greater);
            }
            // With distinct values, every run holds at most about len/parts + 1 samples.
            let mut distinct = values.clone();
            distinct.dedup();
            if distinct.len() == values.len() && parts > 1 {
                let mut bounds: Vec<i64> = points.iter().map(|p| p.as_i64().unwrap()).collect();
                bounds.push(i64::MAX);
                let mut lower = i64::MIN;
                for upper in bounds {
                    let n = values.iter().filter(|v| **v >= lower && **v < upper).count();
                    prop_assert!(n <= values.len() / parts + 2, "run of {} in {}", n, values.len());
                    lower = upper;
                }
            }
        }
    }
}
