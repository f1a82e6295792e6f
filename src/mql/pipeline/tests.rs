use super::*;
use bson::doc;

fn stages(list: Vec<Document>) -> Stages {
    Stages::parse(&list.into_iter().map(Bson::Document).collect::<Vec<_>>()).unwrap()
}

fn refusal(stage: Document) -> MqlError {
    Stages::parse(&[Bson::Document(stage)]).unwrap_err()
}

fn run(list: Vec<Document>, docs: Vec<Document>) -> Vec<Document> {
    stages(list).run(docs).unwrap()
}

/// The manual's $group examples run on its "sales" collection.
fn sales() -> Vec<Document> {
    vec![
        doc! { "_id": 1, "item": "abc", "price": 10, "quantity": 2 },
        doc! { "_id": 2, "item": "jkl", "price": 20, "quantity": 1 },
        doc! { "_id": 3, "item": "xyz", "price": 5, "quantity": 10 },
        doc! { "_id": 4, "item": "xyz", "price": 5.5, "quantity": 20 },
        doc! { "_id": 5, "item": "abc", "price": 10, "quantity": 10 },
    ]
}

#[test]
fn sort_skip_limit_and_project_run_in_order() {
    let out = run(
        vec![
            doc! { "$sort": { "quantity": -1 } },
            doc! { "$skip": 1 },
            doc! { "$limit": 2 },
            doc! { "$project": { "item": 1, "_id": 0 } },
        ],
        sales(),
    );
    assert_eq!(out, vec![doc! { "item": "xyz" }, doc! { "item": "abc" }]);
    let out = run(vec![doc! { "$unset": ["price", "quantity"] }], sales());
    assert_eq!(out[0], doc! { "_id": 1, "item": "abc" });
    let out = run(
        vec![doc! { "$unset": "item" }, doc! { "$limit": 1_i64 }],
        sales(),
    );
    assert_eq!(out, vec![doc! { "_id": 1, "price": 10, "quantity": 2 }]);
}

#[test]
fn group_by_a_field_with_accumulators() {
    let out = run(
        vec![doc! { "$group": {
            "_id": "$item",
            "n": { "$sum": 1 },
            "quantity": { "$sum": "$quantity" },
            "avg": { "$avg": "$price" },
            "min": { "$min": "$price" },
            "max": { "$max": "$price" },
            "first": { "$first": "$_id" },
            "last": { "$last": "$_id" },
            "prices": { "$push": "$price" },
            "distinct": { "$addToSet": "$price" },
            "count": { "$count": {} },
        } }],
        sales(),
    );
    // Groups come in the order of their first document.
    assert_eq!(
        out,
        vec![
            doc! { "_id": "abc", "n": 2, "quantity": 12, "avg": 10.0, "min": 10, "max": 10, "first": 1, "last": 5, "prices": [10, 10], "distinct": [10], "count": 2 },
            doc! { "_id": "jkl", "n": 1, "quantity": 1, "avg": 20.0, "min": 20, "max": 20, "first": 2, "last": 2, "prices": [20], "distinct": [20], "count": 1 },
            doc! { "_id": "xyz", "n": 2, "quantity": 30, "avg": 5.25, "min": 5, "max": 5.5, "first": 3, "last": 4, "prices": [5, 5.5], "distinct": [5, 5.5], "count": 2 },
        ]
    );
}

#[test]
fn group_keys_null_constant_and_documents() {
    let total = run(
        vec![doc! { "$group": { "_id": null, "total": { "$sum": { "$literal": 2 } } } }],
        sales(),
    );
    assert_eq!(total, vec![doc! { "_id": null, "total": 10 }]);
    assert!(stages(vec![doc! { "$group": { "_id": "x", "n": { "$sum": 1 } } }]).single_result());
    assert!(!stages(vec![doc! { "$group": { "_id": "$a" } }]).single_result());
    assert!(stages(vec![doc! { "$count": "n" }]).single_result());
    let docs = vec![
        doc! { "a": 1, "b": 1 },
        doc! { "a": 1.0, "b": 1_i64 },
        doc! { "a": 1 },
        doc! { "b": 2 },
    ];
    let out = run(
        vec![doc! { "$group": { "_id": { "a": "$a", "b": "$b" }, "n": { "$sum": 1 } } }],
        docs.clone(),
    );
    // {a: 1, b: 1} and {a: 1.0, b: 1L} are one key (the first seen); a missing field is left
    // out of the key.
    assert_eq!(
        out,
        vec![
            doc! { "_id": { "a": 1, "b": 1 }, "n": 2 },
            doc! { "_id": { "a": 1 }, "n": 1 },
            doc! { "_id": { "b": 2 }, "n": 1 },
        ]
    );
    // A single "$path" _id groups a missing field with null.
    let out = run(
        vec![doc! { "$group": { "_id": "$a" } }],
        vec![doc! {}, doc! { "a": null }, doc! { "a": [1] }],
    );
    assert_eq!(out, vec![doc! { "_id": null }, doc! { "_id": [1] }]);
}

#[test]
fn sums_widen_and_skip_non_numbers_and_empty_accumulators_are_null() {
    let docs = vec![
        doc! { "v": i32::MAX },
        doc! { "v": 1 },
        doc! { "v": "x" },
        doc! { "v": null },
        doc! { "w": [1, 2] },
    ];
    let out = run(
        vec![doc! { "$group": {
            "_id": 0,
            "sum": { "$sum": "$v" },
            "arr": { "$sum": "$w" },
            "avg": { "$avg": "$nothing" },
            "min": { "$min": "$v" },
            "max": { "$max": "$nothing" },
            "first": { "$first": "$w" },
            "pushed": { "$push": "$w" },
        } }],
        docs,
    );
    assert_eq!(
        out,
        vec![doc! {
            "_id": 0,
            "sum": i64::from(i32::MAX) + 1,
            "arr": 0,
            "avg": null,
            "min": 1,
            "max": null,
            "first": null,
            "pushed": [[1, 2]],
        }]
    );
    let out = run(
        vec![doc! { "$group": { "_id": null, "s": { "$sum": "$v" } } }],
        vec![doc! { "v": i64::MAX }, doc! { "v": 1 }],
    );
    assert_eq!(
        out[0].get("s"),
        Some(&Bson::Double(9_223_372_036_854_775_808.0))
    );
}

#[test]
fn count_counts_and_gives_nothing_for_nothing() {
    assert_eq!(
        run(vec![doc! { "$count": "n" }], sales()),
        vec![doc! { "n": 5 }]
    );
    assert_eq!(
        run(vec![doc! { "$count": "n" }], vec![]),
        Vec::<Document>::new()
    );
    assert_eq!(refusal(doc! { "$count": "" }).code, 40157);
    assert_eq!(refusal(doc! { "$count": "$n" }).code, 40158);
    assert_eq!(refusal(doc! { "$count": "a.b" }).code, 40160);
    assert_eq!(refusal(doc! { "$count": 1 }).code, 40156);
}

#[test]
fn stage_specifications_are_checked_before_any_document_is_read() {
    let e = refusal(doc! { "$foo": {} });
    assert_eq!(
        (e.code, e.code_name, e.message.as_str()),
        (
            40324,
            "Location40324",
            "Unrecognized pipeline stage name: '$foo'"
        )
    );
    for stage in ["$lookup", "$unwind", "$addFields", "$facet"] {
        let e = refusal(doc! { stage: {} });
        assert_eq!(e.code, 238, "{stage}");
        assert!(
            e.message.contains(stage) && e.message.contains("$group"),
            "{}",
            e.message
        );
    }
    let e = refusal(doc! { "$match": { "a": 1 } });
    assert!(e.message.contains("first stage"), "{}", e.message);
    assert_eq!(
        Stages::parse(&[Bson::Document(doc! { "$sort": { "a": 1 }, "$limit": 1 })])
            .unwrap_err()
            .code,
        40323
    );
    assert_eq!(Stages::parse(&[Bson::Int32(1)]).unwrap_err().code, 14);
    assert_eq!(refusal(doc! { "$sort": {} }).code, 15976);
    assert_eq!(refusal(doc! { "$sort": 1 }).code, 15973);
    assert_eq!(refusal(doc! { "$sort": { "a": 2 } }).code, 15975);
    assert_eq!(
        refusal(doc! { "$limit": 0 }).message,
        "the limit must be positive"
    );
    assert_eq!(refusal(doc! { "$limit": -1 }).code, 5107201);
    assert_eq!(refusal(doc! { "$skip": -1 }).code, 5107200);
    assert_eq!(
        refusal(doc! { "$skip": -1 }).message,
        "invalid argument to $skip stage: Expected a non-negative number in: $skip: -1"
    );
    assert_eq!(refusal(doc! { "$skip": 1.5 }).code, 5107200);
    assert_eq!(
        refusal(doc! { "$limit": "a" }).message,
        r#"invalid argument to $limit stage: Expected a number in: $limit: "a""#
    );
    assert_eq!(refusal(doc! { "$project": {} }).code, 51272);
    assert_eq!(refusal(doc! { "$unset": 1 }).code, 31002);
    assert_eq!(refusal(doc! { "$unset": [1] }).code, 31120);
    let group = |spec: Document| refusal(doc! { "$group": spec });
    assert_eq!(
        group(doc! { "n": { "$sum": 1 } }).message,
        "a group specification must include an _id"
    );
    assert_eq!(group(doc! { "_id": null, "n": 1 }).code, 40234);
    assert_eq!(
        group(doc! { "_id": null, "n": { "$sum": 1, "$avg": 1 } }).code,
        40238
    );
    assert_eq!(
        group(doc! { "_id": null, "n": { "$foo": 1 } }).message,
        "unknown group operator '$foo'"
    );
    assert_eq!(
        group(doc! { "_id": null, "n": { "$sum": [1, 2] } }).code,
        40237
    );
    assert_eq!(
        group(doc! { "_id": null, "a.b": { "$sum": 1 } }).code,
        40235
    );
    assert_eq!(
        group(doc! { "_id": null, "n": { "$count": 1 } }).code,
        4544702
    );
    assert_eq!(
        group(doc! { "_id": null, "n": { "$stdDevPop": "$a" } }).code,
        238
    );
    assert_eq!(group(doc! { "_id": { "$toUpper": "$a" } }).code, 238);
    assert_eq!(group(doc! { "_id": "$$NOW" }).code, 238);
    assert_eq!(group(doc! { "_id": "$" }).code, 16872);
    // A document _id of expressions takes no inclusion flags.
    let e = group(doc! { "_id": { "a": "$a", "b": 1 } });
    assert_eq!(
        (e.code, e.message.as_str()),
        (17390, "$group does not support inclusion-style expressions")
    );
}

#[test]
fn a_leading_match_is_split_off_for_the_servers() {
    let pipeline = vec![
        Bson::Document(doc! { "$match": { "a": 1 } }),
        Bson::Document(doc! { "$count": "n" }),
    ];
    let (filter, rest) = split_leading_match(&pipeline);
    assert_eq!(filter, Some(&doc! { "a": 1 }));
    assert_eq!(rest.len(), 1);
    assert!(Stages::parse(rest).is_ok());
    let (filter, rest) = split_leading_match(&pipeline[1..]);
    assert_eq!((filter, rest.len()), (None, 1));
}

#[test]
fn root_pushes_whole_documents() {
    let out = run(
        vec![doc! { "$group": { "_id": "$k", "docs": { "$push": "$$ROOT" } } }],
        vec![doc! { "k": 1, "v": 2 }],
    );
    assert_eq!(out, vec![doc! { "_id": 1, "docs": [{ "k": 1, "v": 2 }] }]);
}
