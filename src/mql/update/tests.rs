use super::*;
use bson::{doc, Timestamp};

const NOW: i64 = 1_700_000_000_123;

fn now() -> DateTime {
    DateTime::from_millis(NOW)
}

fn updated(doc: Document, update: Document) -> Document {
    let mut doc = doc;
    apply(&mut doc, &update, false, now()).unwrap();
    doc
}

fn failure(doc: Document, update: Document) -> MqlError {
    let mut d = doc.clone();
    let err = apply(&mut d, &update, false, now()).unwrap_err();
    assert_eq!(d, doc, "a failed update changes nothing");
    err
}

#[test]
fn kinds_are_told_apart_by_the_first_field() {
    assert_eq!(
        kind(&Bson::Document(doc! { "$set": { "a": 1 } })).unwrap(),
        UpdateKind::Operators
    );
    assert_eq!(
        kind(&Bson::Document(doc! { "a": 1 })).unwrap(),
        UpdateKind::Replacement
    );
    assert_eq!(
        kind(&Bson::Document(doc! {})).unwrap(),
        UpdateKind::Replacement
    );
    assert_eq!(kind(&Bson::Array(vec![])).unwrap(), UpdateKind::Pipeline);
    let e = kind(&Bson::Document(doc! { "$set": { "a": 1 }, "b": 2 })).unwrap_err();
    assert_eq!(
        (e.code, e.message.as_str()),
        (
            9,
            "Unknown modifier: b. Expected a valid update modifier or pipeline-style update \
             specified as an array"
        )
    );
    let e = kind(&Bson::Document(doc! { "a": 1, "$set": { "b": 2 } })).unwrap_err();
    assert_eq!((e.code, e.code_name), (52, "DollarPrefixedFieldName"));
    assert_eq!(kind(&Bson::Int32(1)).unwrap_err().code, 9);
}

#[test]
fn set_and_unset_follow_dotted_paths() {
    assert_eq!(
        updated(
            doc! { "_id": 1, "a": { "x": 1 } },
            doc! { "$set": { "a.b.c": 2, "d": [] } }
        ),
        doc! { "_id": 1, "a": { "x": 1, "b": { "c": 2 } }, "d": [] }
    );
    // Numeric components index arrays; past the end the array is padded with nulls.
    assert_eq!(
        updated(
            doc! { "a": [1, 2] },
            doc! { "$set": { "a.1": 9, "a.4": 5 } }
        ),
        doc! { "a": [1, 9, null, null, 5] }
    );
    assert_eq!(
        updated(doc! { "a": [{ "b": 1 }] }, doc! { "$set": { "a.0.b": 2 } }),
        doc! { "a": [{ "b": 2 }] }
    );
    // $unset removes a field and nulls an array element; a missing path is nothing.
    assert_eq!(
        updated(
            doc! { "a": 1, "b": [1, 2], "c": { "d": 1 } },
            doc! { "$unset": { "a": "", "b.0": 1, "c.x.y": 1 } }
        ),
        doc! { "b": [null, 2], "c": { "d": 1 } }
    );
    assert_eq!(
        updated(doc! { "a": 5 }, doc! { "$unset": { "a.b": 1 } }),
        doc! { "a": 5 }
    );
}

#[test]
fn new_fields_come_in_the_order_of_their_names() {
    // MongoDB applies an update field by field in the order of the names (numeric names in
    // numeric order), whatever the update's order.
    assert_eq!(
        updated(
            doc! { "_id": 1 },
            doc! { "$set": { "z": 1, "a": 1 }, "$inc": { "m": 1 } }
        ),
        doc! { "_id": 1, "a": 1, "m": 1, "z": 1 }
    );
    assert_eq!(
        updated(doc! {}, doc! { "$set": { "o.10": 1, "o.9": 2, "o.b": 3 } }),
        doc! { "o": { "9": 2, "10": 1, "b": 3 } }
    );
}

#[test]
fn paths_that_cannot_be_created_are_refused() {
    let e = failure(doc! { "_id": 1, "a": 5 }, doc! { "$set": { "a.b": 1 } });
    assert_eq!(
        (e.code, e.message.as_str()),
        (28, "Cannot create field 'b' in element {a: 5}")
    );
    let e = failure(doc! { "a": [1] }, doc! { "$set": { "a.b": 1 } });
    assert_eq!(e.message, "Cannot create field 'b' in element {a: [ 1 ]}");
    let e = failure(doc! { "a": 5 }, doc! { "$pop": { "a.b": 1 } });
    assert_eq!(
        (e.code, e.message.as_str()),
        (
            28,
            "Cannot use the part (b) of (a.b) to traverse the element ({a: 5})"
        )
    );
}

#[test]
fn conflicting_paths_are_refused_before_anything_is_applied() {
    let e = Update::parse(&doc! { "$set": { "a": 1 }, "$inc": { "a": 1 } }).unwrap_err();
    assert_eq!(
        (e.code, e.code_name, e.message.as_str()),
        (
            40,
            "ConflictingUpdateOperators",
            "Updating the path 'a' would create a conflict at 'a'"
        )
    );
    let e = Update::parse(&doc! { "$set": { "a.b": 1, "a": 2 } }).unwrap_err();
    assert_eq!(
        e.message,
        "Updating the path 'a' would create a conflict at 'a'"
    );
    let e = Update::parse(&doc! { "$set": { "a": 1, "a.b.c": 2 } }).unwrap_err();
    assert_eq!(
        e.message,
        "Updating the path 'a.b.c' would create a conflict at 'a'"
    );
    let e = Update::parse(&doc! { "$rename": { "a": "b" }, "$set": { "b.c": 1 } }).unwrap_err();
    assert_eq!(e.code, 40);
    assert!(Update::parse(&doc! { "$set": { "a.b": 1, "a.c": 2 } }).is_ok());
}

#[test]
fn operator_documents_are_checked_as_mongodb_checks_them() {
    let parse = |u: Document| Update::parse(&u).unwrap_err();
    let e = parse(doc! { "$foo": { "a": 1 } });
    assert_eq!(
        (e.code, e.message.starts_with("Unknown modifier: $foo.")),
        (9, true)
    );
    // An empty operator is no change since MongoDB 5.0 (the manual's $set page).
    assert_eq!(
        updated(doc! { "a": 1 }, doc! { "$set": {}, "$unset": {} }),
        doc! { "a": 1 }
    );
    let e = parse(doc! { "$set": 5 });
    assert_eq!(e.code, 9);
    assert!(e
        .message
        .starts_with("Modifiers operate on fields but we found type int instead"));
    let e = parse(doc! { "$inc": { "a": "x" } });
    assert_eq!(
        (e.code, e.message.as_str()),
        (
            14,
            r#"Cannot increment with non-numeric argument: {a: "x"}"#
        )
    );
    assert_eq!(parse(doc! { "$set": { "": 1 } }).code, 56);
    assert_eq!(parse(doc! { "$set": { "a..b": 1 } }).code, 56);
    assert_eq!(parse(doc! { "$set": { "a.$": 1 } }).code, 238);
    assert_eq!(parse(doc! { "$set": { "a.$[]": 1 } }).code, 238);
    assert_eq!(parse(doc! { "$bit": { "a": { "and": 1 } } }).code, 238);
    assert_eq!(parse(doc! { "$pull": { "a": { "$gt": 1 } } }).code, 238);
    assert_eq!(
        parse(doc! { "$pop": { "a": 2 } }).message,
        "$pop expects 1 or -1, found: 2"
    );
    assert_eq!(
        parse(doc! { "$pullAll": { "a": 1 } }).message,
        "$pullAll requires an array argument but was given a int"
    );
    assert_eq!(parse(doc! { "$push": { "a": { "$each": 1 } } }).code, 2);
    assert_eq!(
        parse(doc! { "$push": { "a": { "$each": [], "$sort": 2 } } }).message,
        "The $sort element value must be either 1 or -1"
    );
    assert_eq!(parse(doc! { "$currentDate": { "a": 5 } }).code, 2);
    assert_eq!(
        parse(doc! { "$rename": { "a": 1 } }).message,
        "The 'to' field for $rename must be a string: a: 1"
    );
    assert_eq!(
        parse(doc! { "$rename": { "a": "a" } }).message,
        r#"The source and target field for $rename must differ: a: "a""#
    );
    assert_eq!(
        parse(doc! { "$rename": { "a": "a.b" } }).message,
        r#"The source and target field for $rename must not be on the same path: a: "a.b""#
    );
}

#[test]
fn arithmetic_keeps_mongodbs_types_and_refuses_non_numbers() {
    assert_eq!(
        updated(
            doc! { "a": 1, "b": i32::MAX, "c": 1.5 },
            doc! { "$inc": { "a": 2, "b": 1, "c": 1, "n": 5_i64 } }
        ),
        doc! { "a": 3, "b": i64::from(i32::MAX) + 1, "c": 2.5, "n": 5_i64 }
    );
    // $mul of a missing field creates a zero of the operand's type.
    assert_eq!(
        updated(
            doc! { "a": 3 },
            doc! { "$mul": { "a": 2.5, "x": 7_i64, "y": 2 } }
        ),
        doc! { "a": 7.5, "x": 0_i64, "y": 0 }
    );
    let e = failure(doc! { "_id": 1, "a": "s" }, doc! { "$inc": { "a": 1 } });
    assert_eq!(
        (e.code, e.message.as_str()),
        (14, "Cannot apply $inc to a value of non-numeric type. {_id: 1} has the field 'a' of non-numeric type string")
    );
    let e = failure(
        doc! { "_id": 1, "a": i64::MAX },
        doc! { "$inc": { "a": 1 } },
    );
    assert_eq!(
        (e.code, e.message.as_str()),
        (2, "Failed to apply $inc operations to current value ((NumberLong)9223372036854775807) for document {_id: 1}")
    );
}

#[test]
fn min_and_max_compare_in_mongodbs_order() {
    assert_eq!(
        updated(
            doc! { "a": 5, "b": 5, "c": "x" },
            doc! { "$min": { "a": 3, "b": 7, "c": 1, "d": 0 } }
        ),
        doc! { "a": 3, "b": 5, "c": 1, "d": 0 }
    );
    // Across types: a string is above every number.
    assert_eq!(
        updated(
            doc! { "a": 5, "b": 5.0 },
            doc! { "$max": { "a": "s", "b": 5 } }
        ),
        doc! { "a": "s", "b": 5.0 }
    );
}

#[test]
fn set_on_insert_applies_only_to_inserts_and_current_date_writes_now() {
    let u = doc! { "$setOnInsert": { "a": 1 }, "$currentDate": { "d": true, "t": { "$type": "timestamp" } } };
    let mut d = doc! { "_id": 1 };
    apply(&mut d, &u, false, now()).unwrap();
    assert_eq!(
        d,
        doc! { "_id": 1, "d": now(), "t": Timestamp { time: (NOW / 1000) as u32, increment: 1 } }
    );
    let mut d = doc! {};
    apply(&mut d, &u, true, now()).unwrap();
    assert_eq!(d.get_i32("a"), Ok(1));
}

#[test]
fn push_with_each_position_sort_and_slice() {
    assert_eq!(
        updated(doc! { "a": [1] }, doc! { "$push": { "a": 2, "n": [3] } }),
        doc! { "a": [1, 2], "n": [[3]] }
    );
    assert_eq!(
        updated(
            doc! { "a": [1, 2] },
            doc! { "$push": { "a": { "$each": [8, 9], "$position": 1 } } }
        ),
        doc! { "a": [1, 8, 9, 2] }
    );
    assert_eq!(
        updated(
            doc! { "a": [1, 2, 3] },
            doc! { "$push": { "a": { "$each": [0], "$position": -1 } } }
        ),
        doc! { "a": [1, 2, 0, 3] }
    );
    // The manual's $push example: $each, $sort by a field, $slice.
    assert_eq!(
        updated(
            doc! { "quizzes": [{ "wk": 1, "score": 10 }, { "wk": 2, "score": 8 }] },
            doc! { "$push": { "quizzes": { "$each": [{ "wk": 5, "score": 8 }, { "wk": 6, "score": 7 }], "$sort": { "score": -1 }, "$slice": 3 } } }
        ),
        doc! { "quizzes": [{ "wk": 1, "score": 10 }, { "wk": 2, "score": 8 }, { "wk": 5, "score": 8 }] }
    );
    assert_eq!(
        updated(
            doc! {},
            doc! { "$push": { "a": { "$each": [3, 1, 2], "$sort": 1, "$slice": -2 } } }
        ),
        doc! { "a": [2, 3] }
    );
    let e = failure(doc! { "_id": 1, "a": 1 }, doc! { "$push": { "a": 2 } });
    assert_eq!(
        (e.code, e.message.as_str()),
        (
            2,
            "The field 'a' must be an array but is of type int in document {_id: 1}"
        )
    );
}

#[test]
fn add_to_set_pop_pull_and_pull_all() {
    assert_eq!(
        updated(
            doc! { "a": [1, 2] },
            doc! { "$addToSet": { "a": { "$each": [2.0, 3, 3] }, "b": 1 } }
        ),
        doc! { "a": [1, 2, 3], "b": [1] }
    );
    let e = failure(doc! { "a": 1 }, doc! { "$addToSet": { "a": 2 } });
    assert_eq!(
        e.message,
        "Cannot apply $addToSet to non-array field. Field named 'a' has non-array type int"
    );
    assert_eq!(
        updated(
            doc! { "a": [1, 2, 3], "b": [1, 2, 3], "c": [] },
            doc! { "$pop": { "a": 1, "b": -1, "c": 1, "d": 1 } }
        ),
        doc! { "a": [1, 2], "b": [2, 3], "c": [] }
    );
    let e = failure(doc! { "a": 1 }, doc! { "$pop": { "a": 1 } });
    assert_eq!(
        (e.code, e.message.as_str()),
        (14, "Path 'a' contains an element of non-array type 'int'")
    );
    assert_eq!(
        updated(
            doc! { "a": [1, 2.0, "2", [2]], "b": [1, 2, 3, 1] },
            doc! { "$pull": { "a": 2 }, "$pullAll": { "b": [1, 3] } }
        ),
        doc! { "a": [1, "2", [2]], "b": [2] }
    );
    assert_eq!(
        failure(doc! { "a": 1 }, doc! { "$pull": { "a": 1 } }).message,
        "Cannot apply $pull to a non-array value"
    );
}

#[test]
fn rename_moves_a_value_and_creates_its_path() {
    assert_eq!(
        updated(
            doc! { "_id": 1, "a": 1, "n": { "x": 2 } },
            doc! { "$rename": { "a": "b.c", "n.x": "y", "none": "z" } }
        ),
        doc! { "_id": 1, "n": {}, "b": { "c": 1 }, "y": 2 }
    );
    let e = failure(
        doc! { "_id": 1, "a": [{ "b": 1 }] },
        doc! { "$rename": { "a.0.b": "c" } },
    );
    assert_eq!(e.code, 2);
    assert!(
        e.message
            .starts_with("The source field cannot be an array element"),
        "{}",
        e.message
    );
}

#[test]
fn id_is_immutable() {
    let e = failure(doc! { "_id": 1, "a": 1 }, doc! { "$set": { "_id": 2 } });
    assert_eq!(
        (e.code, e.code_name, e.message.as_str()),
        (
            66,
            "ImmutableField",
            "Performing an update on the path '_id' would modify the immutable field '_id'"
        )
    );
    assert_eq!(
        failure(doc! { "_id": { "x": 1 } }, doc! { "$set": { "_id.x": 2 } }).code,
        66
    );
    assert_eq!(
        failure(doc! { "_id": 1 }, doc! { "$unset": { "_id": 1 } }).code,
        66
    );
    // Setting the same value is allowed.
    assert_eq!(
        updated(doc! { "_id": 1 }, doc! { "$set": { "_id": 1 } }),
        doc! { "_id": 1 }
    );
    // A document without _id (an upsert's seed without one) may be given one.
    assert_eq!(
        updated(doc! {}, doc! { "$set": { "_id": 5 } }),
        doc! { "_id": 5 }
    );
}

#[test]
fn replacements_keep_the_id() {
    assert_eq!(
        replace(&doc! { "_id": 1, "a": 1 }, &doc! { "b": 2 }).unwrap(),
        doc! { "_id": 1, "b": 2 }
    );
    assert_eq!(
        replace(&doc! { "_id": 1 }, &doc! { "b": 2, "_id": 1 }).unwrap(),
        doc! { "_id": 1, "b": 2 }
    );
    let e = replace(&doc! { "_id": 1 }, &doc! { "_id": 2 }).unwrap_err();
    assert_eq!(
        (e.code, e.message.as_str()),
        (66, "After applying the update, the (immutable) field '_id' was found to have been altered to _id: 2")
    );
}

#[test]
fn upsert_seeds_come_from_the_filters_equalities() {
    // The manual's "Upsert with Operator Expressions": equality fields, then the update.
    assert_eq!(
        seed_from_filter(&doc! { "name": "Andy", "rating": { "$gt": 1 }, "_id": 7 }).unwrap(),
        doc! { "_id": 7, "name": "Andy" }
    );
    assert_eq!(
        seed_from_filter(&doc! { "a.b": 1, "$and": [{ "c": { "$eq": [1, 2] } }, { "$and": [{ "d": { "$in": [4] } }] }] }).unwrap(),
        doc! { "a": { "b": 1 }, "c": [1, 2], "d": 4 }
    );
    assert_eq!(
        seed_from_filter(&doc! { "e": { "$in": [1, 2] }, "f": { "$ne": 1 }, "$or": [{ "g": 1 }, { "h": 1 }], "$comment": "x" }).unwrap(),
        doc! {}
    );
    // DOCS-14158: an upsert's filter may not use $expr.
    let e = seed_from_filter(&doc! { "$and": [{ "$expr": { "$eq": ["$a", 1] } }] }).unwrap_err();
    assert_eq!(
        (e.code, e.code_name, e.message.as_str()),
        (
            224,
            "QueryFeatureNotAllowed",
            "$expr is not allowed in the query predicate for an upsert"
        )
    );
    assert_eq!(
        seed_from_filter(&doc! { "$or": [{ "g": 1 }] }).unwrap(),
        doc! { "g": 1 }
    );
    let e = seed_from_filter(&doc! { "a": 1, "a.b": 2 }).unwrap_err();
    assert_eq!(
        (e.code, e.code_name, e.message.as_str()),
        (
            54,
            "NotSingleValueField",
            "cannot infer query fields to set, both paths 'a.b' and 'a' are matched"
        )
    );
    let e = seed_from_filter(&doc! { "a": 1, "$and": [{ "a": 1 }] }).unwrap_err();
    assert_eq!(
        e.message,
        "cannot infer query fields to set, path 'a' is matched twice"
    );
    assert_eq!(seed_from_filter(&doc! { "$and": 1 }).unwrap_err().code, 2);
}

#[test]
fn upsert_documents_put_the_id_first() {
    let doc = upsert_document(
        &doc! { "x": 1, "_id": 3 },
        &Bson::Document(doc! { "$set": { "a": 1 }, "$setOnInsert": { "b": 2 } }),
        now(),
    )
    .unwrap();
    assert_eq!(doc, doc! { "_id": 3, "x": 1, "a": 1, "b": 2 });
    // A replacement keeps only the filter's _id.
    let doc = upsert_document(
        &doc! { "x": 1, "_id": 3 },
        &Bson::Document(doc! { "y": 2 }),
        now(),
    )
    .unwrap();
    assert_eq!(doc, doc! { "_id": 3, "y": 2 });
    let doc = upsert_document(&doc! { "x": 1 }, &Bson::Document(doc! { "y": 2 }), now()).unwrap();
    assert_eq!(doc, doc! { "y": 2 }, "the caller generates the ObjectId");
    let e = upsert_document(
        &doc! { "_id": 3 },
        &Bson::Document(doc! { "$set": { "_id": 4 } }),
        now(),
    )
    .unwrap_err();
    assert_eq!(e.code, 66);
    let e = upsert_document(
        &doc! { "_id.x": 3 },
        &Bson::Document(doc! { "y": 1 }),
        now(),
    )
    .unwrap_err();
    assert_eq!(e.code, 63);
    assert_eq!(
        upsert_document(&doc! {}, &Bson::Array(vec![]), now())
            .unwrap_err()
            .code,
        238
    );
}
