use super::*;
use bson::doc;
use proptest::prelude::*;

fn spec(d: Document) -> SortSpec {
    SortSpec::parse(&d).unwrap()
}

fn sorted(s: &SortSpec, docs: Vec<Document>) -> Vec<Document> {
    let mut docs = docs;
    s.sort(&mut docs).unwrap();
    docs
}

fn ids(docs: &[Document]) -> Vec<i32> {
    docs.iter().map(|d| d.get_i32("_id").unwrap()).collect()
}

#[test]
fn directions_are_one_or_minus_one_of_any_numeric_type() {
    let s = spec(doc! { "a": 1, "b": -1.0, "c": 1_i64 });
    assert_eq!(
        s.keys(),
        [("a".into(), true), ("b".into(), false), ("c".into(), true)]
    );
    assert_eq!(s.to_document(), doc! { "a": 1, "b": -1, "c": 1 });
    assert!(spec(doc! {}).is_empty());
    // MongoDB 7.0 refuses other numbers (older servers took any positive number).
    for bad in [doc! { "a": 2 }, doc! { "a": 0 }, doc! { "a": 0.5 }] {
        let err = SortSpec::parse(&bad).unwrap_err();
        assert_eq!((err.code, err.code_name), (15975, "Location15975"), "{bad}");
    }
    let err = SortSpec::parse(&doc! { "a": "desc" }).unwrap_err();
    assert_eq!(
        (err.code, err.message.as_str()),
        (15974, r#"Illegal key in $sort specification: a: "desc""#)
    );
    let err = SortSpec::parse(&doc! { "s": { "$meta": "textScore" } }).unwrap_err();
    assert_eq!(err.code, 238);
    assert!(err.message.contains("1 or -1"), "{}", err.message);
    assert_eq!(
        SortSpec::parse(&doc! { "s": { "x": 1 } }).unwrap_err().code,
        17312
    );
    assert_eq!(SortSpec::parse(&doc! { "$a": 1 }).unwrap_err().code, 16410);
    assert_eq!(
        SortSpec::parse(&doc! { "$natural": 1 }).unwrap_err().code,
        238
    );
    assert_eq!(
        SortSpec::parse(&doc! { "a..b": 1 }).unwrap_err().code,
        15998
    );
}

#[test]
fn missing_sorts_as_null_and_types_follow_their_classes() {
    let s = spec(doc! { "a": 1 });
    let docs = vec![
        doc! { "_id": 1, "a": "x" },
        doc! { "_id": 2 },
        doc! { "_id": 3, "a": 5 },
        doc! { "_id": 4, "a": null },
        doc! { "_id": 5, "a": { "b": 1 } },
        doc! { "_id": 6, "a": 2.5 },
    ];
    // {} and {a: null} tie and keep their order.
    assert_eq!(ids(&sorted(&s, docs.clone())), [2, 4, 6, 3, 1, 5]);
    assert_eq!(
        ids(&sorted(&spec(doc! { "a": -1 }), docs)),
        [5, 1, 3, 6, 2, 4]
    );
}

#[test]
fn arrays_sort_by_their_smallest_or_largest_element() {
    // The example of DOCS-2760 (the manual's sort order of arrays), with ids in insertion
    // order: {}, {a: 1}, {a: []}, {a: [1]}, {a: [0, 1]}.
    let docs = vec![
        doc! { "_id": 1 },
        doc! { "_id": 2, "a": 1 },
        doc! { "_id": 3, "a": [] },
        doc! { "_id": 4, "a": [1] },
        doc! { "_id": 5, "a": [0, 1] },
    ];
    // Ascending: [] (undefined) < {} (null) < [0, 1] (0) < 1 = [1].
    assert_eq!(
        ids(&sorted(&spec(doc! { "a": 1 }), docs.clone())),
        [3, 1, 5, 2, 4]
    );
    // Descending: 1 = [1] = [0, 1] (1), then {} (null), then [] (undefined).
    assert_eq!(ids(&sorted(&spec(doc! { "a": -1 }), docs)), [2, 4, 5, 1, 3]);
}

#[test]
fn keys_follow_the_index_key_rules_for_arrays() {
    let key = |s: Document, d: Document| spec(s).key(&d).unwrap().0;
    // Paths through arrays of documents: every element's value; a scalar element gives null.
    assert_eq!(
        key(
            doc! { "a.b": 1 },
            doc! { "a": [{ "b": 3 }, { "b": [2, 7] }] }
        ),
        [Bson::Int32(2)]
    );
    assert_eq!(
        key(
            doc! { "a.b": -1 },
            doc! { "a": [{ "b": 3 }, { "b": [2, 7] }] }
        ),
        [Bson::Int32(7)]
    );
    assert_eq!(
        key(doc! { "a.b": 1 }, doc! { "a": [5, { "b": 3 }] }),
        [Bson::Null]
    );
    assert_eq!(
        key(doc! { "a.b": 1 }, doc! { "a": [{ "c": 1 }, { "b": 3 }] }),
        [Bson::Null]
    );
    // An empty array mid-path gives null, at the end undefined.
    assert_eq!(key(doc! { "a.b": 1 }, doc! { "a": [] }), [Bson::Null]);
    assert_eq!(
        key(doc! { "a.b": 1 }, doc! { "a": { "b": [] } }),
        [Bson::Undefined]
    );
    // Arrays inside arrays are values of their own (the array class, above numbers).
    assert_eq!(
        key(doc! { "a": -1 }, doc! { "a": [[1, 2], 3] }),
        [Bson::Array(vec![Bson::Int32(1), Bson::Int32(2)])]
    );
    assert_eq!(
        key(doc! { "a": 1 }, doc! { "a": [[1, 2], 3] }),
        [Bson::Int32(3)]
    );
    // A numeric component indexes the array.
    assert_eq!(
        key(doc! { "a.1": 1 }, doc! { "a": [9, 4, 1] }),
        [Bson::Int32(4)]
    );
    assert_eq!(
        key(doc! { "a.0.b": 1 }, doc! { "a": [{ "b": 8 }, { "b": 2 }] }),
        [Bson::Int32(8)]
    );
    // Past the end, the component is a field name of each element.
    assert_eq!(
        key(doc! { "a.5": 1 }, doc! { "a": [{ "5": "x" }] }),
        [Bson::String("x".into())]
    );
    // A scalar in the middle of the path reaches nothing.
    assert_eq!(key(doc! { "a.b": 1 }, doc! { "a": 5 }), [Bson::Null]);
}

#[test]
fn compound_paths_through_one_array_take_values_from_one_element() {
    let d = doc! { "a": [{ "x": 1, "y": 1 }, { "x": 2, "y": 5 }] };
    assert_eq!(
        spec(doc! { "a.x": 1, "a.y": -1 }).key(&d).unwrap().0,
        [Bson::Int32(1), Bson::Int32(1)]
    );
    assert_eq!(
        spec(doc! { "a.x": -1, "a.y": 1 }).key(&d).unwrap().0,
        [Bson::Int32(2), Bson::Int32(5)]
    );
    // One path outside the array: the tuple pairs it with each element.
    let d = doc! { "k": 3, "a": [2, 1] };
    assert_eq!(
        spec(doc! { "k": 1, "a": 1 }).key(&d).unwrap().0,
        [Bson::Int32(3), Bson::Int32(1)]
    );
}

#[test]
fn parallel_arrays_are_refused_as_mongodb_refuses_them() {
    let s = spec(doc! { "a": 1, "b": 1 });
    let d = doc! { "_id": 1, "a": [1, 2], "b": [3, 4] };
    let err = s.key(&d).unwrap_err();
    assert_eq!(
        (err.code, err.message.as_str()),
        (2, "cannot sort with keys that are parallel arrays")
    );
    let mut docs = vec![doc! { "_id": 2, "a": 1, "b": 1 }, d.clone()];
    assert!(s.sort(&mut docs).is_err());
    assert_eq!(docs.len(), 2, "a failed sort keeps the documents");
    // compare still orders them (by each path alone).
    assert_eq!(s.compare(&docs[0], &d), Ordering::Less);
    assert_eq!(s.compare(&doc! { "a": 0, "b": 9 }, &d), Ordering::Less);
}

#[test]
fn numbers_sort_by_value_across_types() {
    let s = spec(doc! { "n": 1 });
    let docs = vec![
        doc! { "_id": 1, "n": 3_i64 },
        doc! { "_id": 2, "n": 2.5 },
        doc! { "_id": 3, "n": f64::NAN },
        doc! { "_id": 4, "n": -1 },
        doc! { "_id": 5, "n": 3.0 },
    ];
    assert_eq!(ids(&sorted(&s, docs)), [3, 4, 2, 1, 5]);
}

fn scalar() -> impl Strategy<Value = Bson> {
    prop_oneof![
        Just(Bson::Null),
        (-3i32..3).prop_map(Bson::Int32),
        (-3i64..3).prop_map(Bson::Int64),
        (-3.0f64..3.0).prop_map(Bson::Double),
        "[ab]{0,2}".prop_map(Bson::String),
        any::<bool>().prop_map(Bson::Boolean),
    ]
}

fn field() -> impl Strategy<Value = Option<Bson>> {
    prop_oneof![
        1 => Just(None),
        3 => scalar().prop_map(Some),
        2 => proptest::collection::vec(scalar(), 0..3).prop_map(|v| Some(Bson::Array(v))),
    ]
}

/// The manual's rule for one path: missing is null, an array its smallest element ascending
/// and its largest descending, an empty array below null.
fn reference_key(value: &Option<Bson>, ascending: bool) -> Bson {
    match value {
        None => Bson::Null,
        Some(Bson::Array(a)) if a.is_empty() => Bson::Undefined,
        Some(Bson::Array(a)) => {
            let pick = if ascending {
                a.iter().min_by(|x, y| order::compare(x, y))
            } else {
                a.iter().max_by(|x, y| order::compare(x, y))
            };
            pick.cloned().expect("not empty")
        }
        Some(v) => v.clone(),
    }
}

proptest! {
    #[test]
    fn sorting_agrees_with_the_manuals_rules(
        rows in proptest::collection::vec((field(), scalar()), 0..12),
        a_ascending in any::<bool>(),
        b_ascending in any::<bool>(),
    ) {
        let docs: Vec<Document> = rows
            .iter()
            .enumerate()
            .map(|(i, (a, b))| {
                let mut d = doc! { "_id": i as i32 };
                if let Some(a) = a {
                    d.insert("a", a.clone());
                }
                d.insert("b", b.clone());
                d
            })
            .collect();
        let s = spec(doc! { "a": if a_ascending { 1 } else { -1 }, "b": if b_ascending { 1 } else { -1 } });
        let mut expected: Vec<usize> = (0..rows.len()).collect();
        let directed = |o: Ordering, asc: bool| if asc { o } else { o.reverse() };
        expected.sort_by(|&x, &y| {
            let (ka, kb) = (reference_key(&rows[x].0, a_ascending), reference_key(&rows[y].0, a_ascending));
            directed(order::compare(&ka, &kb), a_ascending)
                .then_with(|| directed(order::compare(&rows[x].1, &rows[y].1), b_ascending))
        });
        let got: Vec<usize> = sorted(&s, docs).iter().map(|d| d.get_i32("_id").unwrap() as usize).collect();
        prop_assert_eq!(got, expected);
    }
}
