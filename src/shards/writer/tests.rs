use super::*;
use mongodb::bson::doc;
use rand::rngs::mock::StepRng;

#[test]
fn backoff_ceiling_doubles_up_to_the_cap() {
    let base = Duration::from_millis(100);
    let cap = Duration::from_secs(1);
    let got: Vec<u128> = (1..=7)
        .map(|a| backoff_ceiling(a, base, cap).as_millis())
        .collect();
    assert_eq!(got, vec![100, 200, 400, 800, 1000, 1000, 1000]);
    // No overflow for absurd attempt numbers.
    assert_eq!(backoff_ceiling(u32::MAX, base, cap), cap);
    assert_eq!(backoff_ceiling(0, base, cap), base);
}

#[test]
fn backoff_delay_is_full_jitter_below_the_ceiling() {
    let base = Duration::from_millis(100);
    let cap = Duration::from_secs(10);
    // A generator that always yields 0 gives no delay at all...
    assert_eq!(
        backoff_delay(3, base, cap, &mut StepRng::new(0, 0)),
        Duration::ZERO
    );
    // ...and one that always yields the largest value gives (just under) the ceiling.
    let top = backoff_delay(3, base, cap, &mut StepRng::new(u64::MAX, 0));
    assert!(top <= Duration::from_millis(400), "{top:?}");
    assert!(top > Duration::from_millis(399), "{top:?}");
    // Half way.
    let half = backoff_delay(3, base, cap, &mut StepRng::new(1 << 63, 0));
    assert_eq!(half, Duration::from_millis(200));
}

#[test]
fn split_respects_count_and_bytes() {
    let limits = CommandLimits {
        max_statements: 3,
        max_bytes: 100,
    };
    // Each size gets ARRAY_ELEMENT_OVERHEAD (8) added.
    let (chunks, too_large) = split_into_commands(&[10, 10, 10, 10, 42, 42, 92, 200, 1], limits);
    assert_eq!(
        chunks,
        vec![vec![0, 1, 2], vec![3, 4], vec![5], vec![6], vec![8]]
    );
    assert_eq!(too_large, vec![7]);
}

#[test]
fn split_of_nothing_is_nothing() {
    let (chunks, too_large) = split_into_commands(&[], CommandLimits::default());
    assert!(chunks.is_empty() && too_large.is_empty());
}

#[test]
fn one_command_for_a_normal_batch() {
    let (chunks, _) = split_into_commands(&[500; 1000], CommandLimits::default());
    assert_eq!(chunks.len(), 1);
    assert_eq!(chunks[0].len(), 1000);
}

#[test]
fn commands_are_unordered_and_carry_the_write_concern() {
    let statements = [
        WriteOp::Insert(doc! { "_id": 1 }).encode().unwrap(),
        WriteOp::Insert(doc! { "_id": 2 }).encode().unwrap(),
    ];
    let command = build_command(
        OpKind::Insert,
        "orders",
        statements.iter(),
        &WriterOptions::default().write_concern,
    );
    assert_eq!(
        command.to_document().unwrap(),
        doc! {
            "insert": "orders",
            "documents": [ { "_id": 1 }, { "_id": 2 } ],
            "ordered": false,
            "writeConcern": { "w": "majority", "j": true },
        }
    );
}

#[test]
fn delete_and_update_elements() {
    let delete = Statement::delete(Location::new("s1", "c"), Bson::Int32(7));
    assert_eq!(
        delete.op.encode().unwrap().to_document().unwrap(),
        doc! { "q": { "_id": 7 }, "limit": 1 }
    );
    let update = Statement::update(
        Location::new("s1", "c"),
        Bson::Int32(7),
        doc! { "$set": { "bucket": 3 } },
        false,
    );
    assert_eq!(
        update.op.encode().unwrap().to_document().unwrap(),
        doc! { "q": { "_id": 7 }, "u": { "$set": { "bucket": 3 } }, "upsert": false, "multi": false }
    );
    let pipeline = Statement::update(
        Location::new("s1", "c"),
        Bson::Int32(7),
        vec![doc! { "$set": { "b": 1 } }],
        true,
    );
    assert_eq!(
        pipeline.op.encode().unwrap().to_document().unwrap(),
        doc! { "q": { "_id": 7 }, "u": [ { "$set": { "b": 1 } } ], "upsert": true, "multi": false }
    );
}

#[test]
fn insert_needs_an_id() {
    let location = Location::new("s1", "c");
    assert_eq!(
        Statement::insert(location.clone(), doc! { "x": 1 }),
        Err(MissingId)
    );
    assert_eq!(
        Statement::insert(location, doc! { "_id": "a" }).unwrap().id,
        Bson::String("a".into())
    );
}

#[test]
fn id_keys_compare_by_type_and_value() {
    assert_eq!(id_key(&Bson::Int32(1)), id_key(&Bson::Int32(1)));
    assert_ne!(id_key(&Bson::Int32(1)), id_key(&Bson::Int32(2)));
    assert_ne!(id_key(&Bson::Int32(1)), id_key(&Bson::Int64(1)));
    assert_ne!(id_key(&Bson::Int32(1)), id_key(&Bson::String("1".into())));
}
