use super::*;
use proptest::prelude::*;

#[test]
fn a_conjunction_stays_flat_unless_two_conditions_on_one_key_differ() {
    assert_eq!(
        and(
            doc! {"_id": 1, "m": {"$exists": false}},
            doc! {"_id": 1, "c": "t"}
        ),
        doc! {"_id": 1, "m": {"$exists": false}, "c": "t"}
    );
    assert_eq!(
        and(doc! {"_id": 1}, doc! {"_id": 2}),
        doc! {"$and": [{"_id": 1}, {"_id": 2}]}
    );
    assert_eq!(
        and(doc! {"_id": 1}, doc! {"_id": 1.0}),
        doc! {"$and": [{"_id": 1}, {"_id": 1.0}]}
    );
}

#[test]
fn brackets_follow_mongodbs_sort_order() {
    let values = [
        Bson::Double(f64::NAN),
        Bson::Double(f64::NEG_INFINITY),
        Bson::Int64(-5),
        Bson::Double(1.5),
        Bson::Int32(2),
        Bson::Double(3.0),
        Bson::Int64((1 << 53) + 1),
        Bson::String("A".into()),
        Bson::String("a".into()),
        Bson::String("ab".into()),
        Bson::Binary(Binary {
            subtype: BinarySubtype::Generic,
            bytes: vec![9],
        }),
        Bson::Binary(Binary {
            subtype: BinarySubtype::Uuid,
            bytes: vec![0; 16],
        }),
        Bson::ObjectId(ObjectId::from_bytes([1; 12])),
        Bson::ObjectId(ObjectId::from_bytes([2; 12])),
    ];
    for (i, a) in values.iter().enumerate() {
        for (j, b) in values.iter().enumerate() {
            assert_eq!(compare(a, b), i.cmp(&j), "{a} vs {b}");
        }
    }
    // 2^53 + 1 is not a double: the nearest one (2^53) is below it, not equal.
    assert_eq!(
        compare(
            &Bson::Int64((1 << 53) + 1),
            &Bson::Double((1u64 << 53) as f64)
        ),
        Ordering::Greater
    );
    assert_eq!(
        compare(&Bson::Int32(7), &Bson::Double(7.0)),
        Ordering::Equal
    );
    let brackets: Vec<Bracket> = values.iter().filter_map(Bracket::of).collect();
    assert!(brackets.windows(2).all(|w| w[0] <= w[1]), "{brackets:?}");
}

#[test]
fn a_cursor_continues_into_every_later_bracket() {
    assert_eq!(
        after(&Bson::Int32(7)).unwrap(),
        doc! { "$or": [
            { "_id": { "$gt": 7 } },
            { "_id": { "$gte": "" } },
            { "_id": { "$gte": Bracket::Binary.floor() } },
            { "_id": { "$gte": Bracket::ObjectId.floor() } },
        ] }
    );
    let oid = Bson::ObjectId(ObjectId::from_bytes([3; 12]));
    assert_eq!(
        after(&oid).unwrap(),
        doc! { "$or": [{ "_id": { "$gt": oid.clone() } }] }
    );
    assert!(after(&Bson::Boolean(true)).is_err());
}

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
    assert_eq!(
        compare(&Bson::Double(f64::NAN), &Bson::Int64(i64::MIN)),
        Ordering::Less
    );
    assert_eq!(
        compare(&Bson::Double(1e300), &Bson::Int64(i64::MAX)),
        Ordering::Greater
    );
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
fn keys_are_equal_exactly_for_what_mongodb_takes_for_one_id() {
    assert_eq!(key(&Bson::Int32(7)), key(&Bson::Int64(7)));
    assert_eq!(key(&Bson::Int32(7)), key(&Bson::Double(7.0)));
    assert_ne!(key(&Bson::Int32(7)), key(&Bson::Double(7.5)));
    assert_ne!(key(&Bson::Int32(7)), key(&Bson::String("7".into())));
    assert_eq!(
        key(&Bson::String("a".into())),
        encode(&Bson::String("a".into()))
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
fn ranges_bounded_by_min_key_or_max_key_never_compare_with_them() {
    // MongoDB compares MinKey and MaxKey across types: `$gt: MinKey` and `$lt: MaxKey`
    // match every class, so a range that used them would read past its other bound
    // (found by `tests/listing.rs` with a scan resumed after a MinKey `_id`).
    let span = |lower: Option<Bson>, upper: Option<Bson>| IdRange {
        bracket: None,
        lower,
        upper,
    };
    let compares_with = |f: &Document, key: &str| format!("{f:?}").contains(key);
    let resumed = span(None, Some(Bson::Int64(5))).filter(Some(&Bson::MinKey));
    assert!(!compares_with(&resumed, "MinKey"), "{resumed}");
    assert!(compares_with(&resumed, "$lt"), "{resumed}");
    let from_min = span(Some(Bson::MinKey), Some(Bson::Int64(5))).filter(None);
    assert!(!compares_with(&from_min, "MinKey"), "{from_min}");
    assert!(
        compares_with(&from_min, "minKey"),
        "the MinKey class: {from_min}"
    );
    let to_max = span(Some(Bson::String("m".into())), Some(Bson::MaxKey)).filter(None);
    assert!(!compares_with(&to_max, "MaxKey"), "{to_max}");
    assert!(
        !compares_with(&to_max, "maxKey"),
        "MaxKey is above the range: {to_max}"
    );
    let nothing = span(None, Some(Bson::MinKey)).filter(None);
    assert_eq!(nothing, doc! { "_id": { "$exists": false } });
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

#[test]
fn ranges_across_types_name_each_class_between_their_bounds() {
    let all = IdRange::everything();
    assert_eq!(all.filter(None), Document::new());
    let whole = |aliases: &[&str]| doc! { "_id": { "$type": aliases.to_vec() } };
    // From a number to a string: the numbers from 10, then the strings below "m".
    let r = IdRange {
        bracket: None,
        lower: Some(Bson::Int32(10)),
        upper: Some(Bson::String("m".into())),
    };
    assert_eq!(
        r.filter(None),
        doc! { "$or": [{ "_id": { "$gte": 10 } }, { "_id": { "$lt": "m" } }] }
    );
    // From the start to an ObjectId: every class below whole, NaN named.
    let oid = Bson::ObjectId(ObjectId::from_bytes([7; 12]));
    let first = IdRange {
        bracket: None,
        lower: None,
        upper: Some(oid.clone()),
    };
    let mut branches: Vec<Bson> = [
        whole(&["minKey"]),
        whole(&["undefined"]),
        whole(&["null"]),
        whole(&["number"]),
        whole(&["string", "symbol"]),
        whole(&["object"]),
        whole(&["array"]),
        whole(&["binData"]),
    ]
    .into_iter()
    .map(Bson::Document)
    .collect();
    branches.push(Bson::Document(doc! { "_id": { "$lt": oid.clone() } }));
    assert_eq!(first.filter(None), doc! { "$or": branches });
    // Below a number: NaN, which `$lt` skips, is named.
    let below_five = IdRange {
        bracket: None,
        lower: None,
        upper: Some(Bson::Int32(5)),
    };
    let f = below_five.filter(None);
    let branches = f.get_array("$or").unwrap();
    let names_nan = |b: &Bson| {
        b.as_document()
            .and_then(|d| d.get_f64("_id").ok())
            .is_some_and(f64::is_nan)
    };
    assert!(branches.iter().any(names_nan), "{f}");
    // Resumed after a boolean at the end of the last range: the rest of the booleans and
    // every later class.
    let last = IdRange {
        bracket: None,
        lower: Some(oid),
        upper: None,
    };
    let f = last.filter(Some(&Bson::Boolean(false)));
    let branches = f.get_array("$or").unwrap();
    assert_eq!(
        branches[0],
        Bson::Document(doc! { "_id": { "$gt": false } })
    );
    assert_eq!(branches.last(), Some(&Bson::Document(whole(&["maxKey"]))));
    assert_eq!(branches.len(), 1 + 7);
    // Resumed after NaN (the bottom of the numbers) in a range within the numbers.
    let numbers = IdRange {
        bracket: None,
        lower: None,
        upper: Some(Bson::Int32(5)),
    };
    let f = numbers.filter(Some(&Bson::Double(f64::NAN)));
    assert_eq!(
        f,
        doc! { "_id": { "$gte": f64::NEG_INFINITY, "$lt": 5 } },
        "{f}"
    );
    // Ranges of old plans stay within their bracket.
    let old = IdRange::of_type("string", None, Some(Bson::String("m".into()))).unwrap();
    assert_eq!(old.filter(None), doc! { "_id": { "$gte": "", "$lt": "m" } });
    assert!(IdRange::of_type("date", None, None).is_err());
}

#[test]
fn every_class_sorts_where_mongodb_sorts_it() {
    let ordered = [
        Bson::MinKey,
        Bson::Null,
        Bson::Int32(1),
        Bson::String("a".into()),
        Bson::Document(doc! {}),
        Bson::Binary(Binary {
            subtype: BinarySubtype::Generic,
            bytes: vec![],
        }),
        Bson::ObjectId(ObjectId::from_bytes([0; 12])),
        Bson::Boolean(false),
        Bson::MaxKey,
    ];
    for w in ordered.windows(2) {
        assert_eq!(compare(&w[0], &w[1]), Ordering::Less, "{} < {}", w[0], w[1]);
        assert!(Class::of(&w[0]) < Class::of(&w[1]));
    }
    assert_eq!(
        and(doc! { "a": 1 }, doc! { "$or": [{ "b": 1 }] }),
        doc! { "a": 1, "$or": [{ "b": 1 }] }
    );
    assert_eq!(
        and(doc! { "$or": [{ "a": 1 }] }, doc! { "$or": [{ "b": 1 }] }),
        doc! { "$and": [{ "$or": [{ "a": 1 }] }, { "$or": [{ "b": 1 }] }] }
    );
}

#[test]
fn json_output_keeps_the_type_of_an_id_and_text_output_tells_an_int_from_a_string() {
    use serde_json::json;
    assert_eq!(
        extjson(&Bson::Int64(13_996_721)),
        json!({"$numberLong": "13996721"})
    );
    assert_eq!(extjson(&Bson::Int32(7)), json!({"$numberInt": "7"}));
    assert_eq!(extjson(&Bson::String("13996721".into())), json!("13996721"));
    let oid = ObjectId::from_bytes([0x0f; 12]);
    assert_eq!(extjson(&Bson::ObjectId(oid)), json!({"$oid": oid.to_hex()}));
    assert_eq!(
        extjson_encoded(&encode(&Bson::Int64(5))),
        json!({"$numberLong": "5"})
    );
    assert_eq!(extjson_encoded(b"junk"), serde_json::Value::Null);

    assert_eq!(shown(&Bson::Int64(13_996_721)), "13996721");
    assert_eq!(shown(&Bson::String("13996721".into())), "\"13996721\"");
    assert_eq!(shown(&Bson::String("cust-1".into())), "cust-1");
    for s in ["", " a", "a ", "{x", "\"q", "1e3", "-0.5"] {
        let shown = shown(&Bson::String(s.into()));
        assert!(shown.starts_with('"'), "{s:?} is shown as {shown}");
    }
    assert_eq!(
        shown(&Bson::ObjectId(oid)),
        format!("{{\"$oid\":\"{}\"}}", oid.to_hex())
    );
    assert_eq!(
        shown_encoded(&encode(&Bson::String("7".into())), "7"),
        "\"7\""
    );
    assert_eq!(shown_encoded(b"junk", "as stored"), "as stored");
}

#[test]
fn an_id_is_given_as_extended_json_a_number_or_bare_text() {
    assert_eq!(
        parse_given(r#"{"$numberLong": "13996721"}"#).unwrap(),
        Bson::Int64(13_996_721)
    );
    assert_eq!(
        parse_given(r#""13996721""#).unwrap(),
        Bson::String("13996721".into())
    );
    assert_eq!(
        key(&parse_given("13996721").unwrap()),
        key(&Bson::Int64(13_996_721))
    );
    assert_eq!(
        parse_given("cust-1").unwrap(),
        Bson::String("cust-1".into())
    );
    let oid = ObjectId::from_bytes([0xab; 12]);
    assert_eq!(
        parse_given(&format!(r#"{{"$oid": "{}"}}"#, oid.to_hex())).unwrap(),
        Bson::ObjectId(oid)
    );
    let error = parse_given("{not json").unwrap_err();
    assert!(error.starts_with("--id {not json: not JSON"), "{error}");
    let error = parse_given(r#"{"$oid": "short"}"#).unwrap_err();
    assert!(error.contains("not Extended JSON"), "{error}");

    let seven = parse_given("7").unwrap();
    assert!(given_matches(&seven, &encode(&Bson::Int32(7))));
    assert!(given_matches(&seven, &encode(&Bson::Int64(7))));
    assert!(given_matches(&seven, &encode(&Bson::Double(7.0))));
    assert!(!given_matches(&seven, &encode(&Bson::String("7".into()))));
    assert!(given_matches(
        &parse_given("\"7\"").unwrap(),
        &encode(&Bson::String("7".into()))
    ));
    assert!(!given_matches(&seven, b"junk"));
    let hint = given_hint(&seven).unwrap();
    assert!(hint.contains(r#"--id '"7"'"#), "{hint}");
    assert_eq!(given_hint(&Bson::String("x".into())), None);
}

fn routable_id() -> impl Strategy<Value = Bson> {
    prop_oneof![
        any::<i32>().prop_map(Bson::Int32),
        any::<i64>().prop_map(Bson::Int64),
        (-1e15f64..1e15).prop_map(|x| Bson::Double(x.trunc())),
        any::<String>().prop_map(Bson::String),
        "[ -~]{0,12}".prop_map(Bson::String),
        any::<[u8; 12]>().prop_map(|b| Bson::ObjectId(ObjectId::from_bytes(b))),
        proptest::collection::vec(any::<u8>(), 0..20).prop_map(|bytes| Bson::Binary(Binary {
            subtype: BinarySubtype::Generic,
            bytes
        })),
    ]
}

proptest! {
    #[test]
    fn what_text_output_shows_is_read_back_as_the_same_id(id in routable_id()) {
        let shown = shown(&id);
        let read = parse_given(&shown).map_err(TestCaseError::fail)?;
        prop_assert_eq!(key(&read), key(&id), "{} was shown as {} and read as {}", id, shown, read);
    }
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
