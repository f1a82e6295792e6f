use super::*;
use bson::doc;
use proptest::prelude::*;

use crate::mql::sort::SortSpec;

fn project(spec: Document, doc: Document) -> Document {
    Projection::parse(&spec).unwrap().apply(&doc)
}

fn err(spec: Document) -> MqlError {
    Projection::parse(&spec).unwrap_err()
}

/// The manual's "Project Fields to Return from Query" examples, on its inventory document.
fn inventory() -> Document {
    doc! {
        "_id": 1,
        "item": "journal",
        "status": "A",
        "size": { "h": 14, "w": 21, "uom": "cm" },
        "instock": [{ "warehouse": "A", "qty": 5 }, { "warehouse": "C", "qty": 15 }],
    }
}

#[test]
fn inclusions_keep_id_unless_excluded_and_the_documents_order() {
    assert_eq!(
        project(doc! { "status": 1, "item": 1 }, inventory()),
        doc! { "_id": 1, "item": "journal", "status": "A" }
    );
    assert_eq!(
        project(doc! { "item": 1, "status": 1, "_id": 0 }, inventory()),
        doc! { "item": "journal", "status": "A" }
    );
    assert_eq!(
        project(doc! { "item": true, "size.uom": 1.0 }, inventory()),
        doc! { "_id": 1, "item": "journal", "size": { "uom": "cm" } }
    );
    // The embedded form is the dotted one.
    assert_eq!(
        project(doc! { "size": { "uom": 1 } }, inventory()),
        doc! { "_id": 1, "size": { "uom": "cm" } }
    );
    assert_eq!(project(doc! { "_id": 1 }, inventory()), doc! { "_id": 1 });
    // A document with none of the fields keeps only its _id.
    assert_eq!(project(doc! { "x": 1 }, inventory()), doc! { "_id": 1 });
}

#[test]
fn exclusions_drop_paths_and_keep_the_rest() {
    assert_eq!(
        project(doc! { "status": 0, "instock": 0 }, inventory()),
        doc! { "_id": 1, "item": "journal", "size": { "h": 14, "w": 21, "uom": "cm" } }
    );
    assert_eq!(
        project(doc! { "size.uom": 0, "_id": 0 }, inventory()),
        doc! {
            "item": "journal",
            "status": "A",
            "size": { "h": 14, "w": 21 },
            "instock": [{ "warehouse": "A", "qty": 5 }, { "warehouse": "C", "qty": 15 }],
        }
    );
    assert_eq!(
        project(doc! { "_id": 0 }, inventory()).get("_id"),
        None,
        "{{_id: 0}} alone is an exclusion"
    );
    // {_id: 1, a: 0} is an exclusion.
    assert_eq!(
        project(
            doc! { "_id": 1, "status": 0 },
            doc! { "_id": 1, "status": "A", "x": 2 }
        ),
        doc! { "_id": 1, "x": 2 }
    );
    let identity = Projection::parse(&doc! {}).unwrap();
    assert!(identity.is_identity());
    assert_eq!(identity.apply(&inventory()), inventory());
}

#[test]
fn paths_through_arrays_project_each_element() {
    // "Project Specific Fields in Embedded Documents in an Array".
    assert_eq!(
        project(doc! { "item": 1, "instock.qty": 1 }, inventory()),
        doc! { "_id": 1, "item": "journal", "instock": [{ "qty": 5 }, { "qty": 15 }] }
    );
    // An inclusion drops elements that are not documents, keeps empty documents and empty
    // subdocuments, and leaves out a scalar the path cannot enter.
    assert_eq!(
        project(
            doc! { "a.b": 1, "_id": 0 },
            doc! { "a": [{ "b": 1, "c": 2 }, 5, { "c": 3 }, []] }
        ),
        doc! { "a": [{ "b": 1 }, {}, []] }
    );
    assert_eq!(
        project(doc! { "a.b": 1, "_id": 0 }, doc! { "a": { "c": 1 } }),
        doc! { "a": {} }
    );
    assert_eq!(
        project(doc! { "a.b": 1, "_id": 0 }, doc! { "a": 5 }),
        doc! {}
    );
    // An exclusion keeps what it does not name.
    assert_eq!(
        project(doc! { "a.b": 0 }, doc! { "a": [{ "b": 1, "c": 2 }, 5] }),
        doc! { "a": [{ "c": 2 }, 5] }
    );
}

#[test]
fn arrays_inside_arrays_are_projected_in_find_and_project_alike() {
    // Both policies recurse into nested arrays (projection_policies.h: kRecurseNestedArrays).
    let d = doc! { "_id": 1, "a": [[{ "b": 1, "c": 2 }, 7], { "b": 3, "c": 4 }, 5] };
    for p in [
        Projection::parse(&doc! { "a.b": 1 }).unwrap(),
        Projection::parse_stage(&doc! { "a.b": 1 }).unwrap(),
    ] {
        assert_eq!(
            p.apply(&d),
            doc! { "_id": 1, "a": [[{ "b": 1 }], { "b": 3 }] }
        );
    }
    for p in [
        Projection::parse(&doc! { "a.b": 0 }).unwrap(),
        Projection::parse_stage(&doc! { "a.b": 0 }).unwrap(),
    ] {
        assert_eq!(
            p.apply(&d),
            doc! { "_id": 1, "a": [[{ "c": 2 }, 7], { "c": 4 }, 5] }
        );
    }
}

#[test]
fn inclusion_and_exclusion_do_not_mix() {
    let e = err(doc! { "a": 1, "b": 0 });
    assert_eq!(
        (e.code, e.code_name, e.message.as_str()),
        (
            31254,
            "Location31254",
            "Cannot do exclusion on field b in inclusion projection"
        )
    );
    let e = err(doc! { "a": 0, "b.c": 1 });
    assert_eq!(
        (e.code, e.message.as_str()),
        (
            31253,
            "Cannot do inclusion on field b.c in exclusion projection"
        )
    );
    // _id may go either way in both.
    assert!(Projection::parse(&doc! { "_id": 0, "a": 1 }).is_ok());
    assert!(Projection::parse(&doc! { "_id": 1, "a": 0 }).is_ok());
    // But a path under _id is an ordinary path.
    assert_eq!(err(doc! { "_id.x": 0, "a": 1 }).code, 31253);
}

#[test]
fn colliding_and_invalid_paths_are_refused() {
    let e = err(doc! { "a": 1, "a.b": 1 });
    assert_eq!(
        (e.code, e.message.as_str()),
        (31249, "Path collision at a.b remaining portion b")
    );
    let e = err(doc! { "a.b": 1, "a": 1 });
    assert_eq!((e.code, e.message.as_str()), (31250, "Path collision at a"));
    assert_eq!(err(doc! { "a..b": 1 }).code, 15998);
    assert_eq!(err(doc! { "$a": 1 }).code, 16410);
    let e = Projection::parse_stage(&doc! {}).unwrap_err();
    assert_eq!(e.code, 51272);
    assert!(e.message.starts_with("Invalid $project :: caused by :: "));
}

#[test]
fn operators_and_computed_fields_are_refused_by_name() {
    for spec in [
        doc! { "a.$": 1 },
        doc! { "a": { "$elemMatch": { "b": 1 } } },
        doc! { "s": { "$meta": "textScore" } },
        doc! { "a": "$b" },
        doc! { "a": "literal" },
        doc! { "a": { "$toUpper": "$b" } },
    ] {
        let e = err(spec.clone());
        assert_eq!(e.code, 238, "{spec}");
        assert!(e.message.contains("1 or 0"), "{spec}: {}", e.message);
    }
    let e = Projection::parse_stage(&doc! { "a": { "$slice": 1 } }).unwrap_err();
    assert_eq!(
        e.code, 238,
        "$slice is find's; in $project it is an expression"
    );
}

#[test]
fn slice_cuts_arrays_in_find() {
    let d = doc! { "_id": 1, "a": [1, 2, 3, 4, 5], "b": "x", "c": 7 };
    // $slice alone is an exclusion: every other field stays.
    assert_eq!(
        project(doc! { "a": { "$slice": 2 } }, d.clone()),
        doc! { "_id": 1, "a": [1, 2], "b": "x", "c": 7 }
    );
    assert_eq!(
        project(doc! { "a": { "$slice": -2 }, "c": 0 }, d.clone()),
        doc! { "_id": 1, "a": [4, 5], "b": "x" }
    );
    // With an inclusion it is included.
    assert_eq!(
        project(doc! { "a": { "$slice": [1, 2] }, "b": 1 }, d.clone()),
        doc! { "_id": 1, "a": [2, 3], "b": "x" }
    );
    assert_eq!(
        project(doc! { "a": { "$slice": [-2, 5] } }, d.clone())
            .get_array("a")
            .unwrap(),
        &vec![Bson::Int32(4), Bson::Int32(5)]
    );
    assert_eq!(
        project(doc! { "a": { "$slice": [9, 1] } }, d.clone())
            .get_array("a")
            .unwrap(),
        &Vec::<Bson>::new()
    );
    // A value that is not an array is returned as it is.
    assert_eq!(
        project(doc! { "b": { "$slice": 1 } }, d)
            .get_str("b")
            .unwrap(),
        "x"
    );
    assert_eq!(err(doc! { "a": { "$slice": [1, 0] } }).code, 31259);
    assert_eq!(err(doc! { "a": { "$slice": [1] } }).code, 31272);
    assert_eq!(err(doc! { "a": { "$slice": "x" } }).code, 31273);
}

#[test]
fn unset_is_an_exclusion() {
    let p = Projection::exclusion(["a", "b.c"]).unwrap();
    assert_eq!(
        p.apply(&doc! { "_id": 1, "a": 1, "b": { "c": 2, "d": 3 } }),
        doc! { "_id": 1, "b": { "d": 3 } }
    );
}

#[test]
fn server_projections_keep_id_and_the_sort_fields() {
    let p = Projection::parse(&doc! { "a.b": 1, "_id": 0 }).unwrap();
    assert_eq!(
        p.for_servers(&["s.t"]),
        Some(doc! { "a.b": 1, "s": 1, "_id": 1 })
    );
    let p = Projection::parse(&doc! { "a": 1, "a2.x": 1 }).unwrap();
    assert_eq!(
        p.for_servers(&["a.z"]),
        Some(doc! { "_id": 1, "a": 1, "a2.x": 1 })
    );
    // An exclusion is sent but for what the caller needs.
    let p = Projection::parse(&doc! { "_id": 0, "big": 0, "s.x": 0 }).unwrap();
    assert_eq!(p.for_servers(&["s.y"]), Some(doc! { "big": 0 }));
    assert_eq!(p.for_servers(&["big"]), Some(doc! { "s.x": 0 }));
    assert_eq!(p.for_servers(&["big", "s"]), None);
    assert_eq!(
        Projection::parse(&doc! {}).unwrap().for_servers(&["a"]),
        None
    );
    // Slices are the front's.
    let p = Projection::parse(&doc! { "a": { "$slice": [1, 1] } }).unwrap();
    assert_eq!(p.for_servers(&[]), None);
    let p = Projection::parse_stage(&doc! { "a.b": 0, "c": 0 }).unwrap();
    assert_eq!(p.for_servers(&[]), Some(doc! { "a.b": 0, "c": 0 }));
}

fn small() -> impl Strategy<Value = Bson> {
    let leaf = prop_oneof![
        (0i32..3).prop_map(Bson::Int32),
        Just(Bson::Null),
        "[xy]".prop_map(Bson::String),
    ];
    leaf.prop_recursive(3, 16, 3, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..3).prop_map(Bson::Array),
            proptest::collection::vec(("[ab]", inner), 0..3)
                .prop_map(|f| Bson::Document(f.into_iter().collect())),
        ]
    })
}

fn paths() -> impl Strategy<Value = Vec<String>> {
    proptest::collection::vec("[ab](\\.[ab]){0,2}", 1..3)
}

proptest! {
    #[test]
    fn what_the_servers_return_projects_and_sorts_like_the_whole_document(
        fields in proptest::collection::vec(("[ab]", small()), 0..3),
        projected in paths(),
        include in any::<bool>(),
        stage in any::<bool>(),
        sort_path in "[ab](\\.[ab])?",
    ) {
        let mut doc: Document = fields.into_iter().collect();
        doc.insert("_id", 1);
        let mut spec = Document::new();
        for p in &projected {
            spec.insert(p.clone(), if include { 1 } else { 0 });
        }
        let parsed = if stage { Projection::parse_stage(&spec) } else { Projection::parse(&spec) };
        let Ok(p) = parsed else { return Ok(()) }; // colliding paths
        let server = p.for_servers(&[sort_path.as_str()]).map(|s| Projection::parse(&s).unwrap());
        let returned = server.as_ref().map_or_else(|| doc.clone(), |s| s.apply(&doc));
        prop_assert_eq!(p.apply(&returned), p.apply(&doc), "server projection {:?}", server);
        prop_assert!(returned.contains_key("_id"));
        let sort = SortSpec::parse(&doc! { sort_path.as_str(): 1 }).unwrap();
        prop_assert_eq!(sort.key(&returned).ok(), sort.key(&doc).ok());
    }
}
