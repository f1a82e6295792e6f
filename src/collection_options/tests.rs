use super::*;
use mongodb::bson::doc;

fn at(shard: &str) -> Location {
    Location::new(shard, "orders")
}

fn bookkeeping() -> Bookkeeping {
    Bookkeeping {
        tenant_key: "customerId".to_owned(),
        routing_fields: vec!["bucket".to_owned()],
    }
}

/// The decision for one source at s1 with `options` and a target at s4 to create.
fn one_source(options: Document) -> Result<Document, Refused> {
    decide(
        &[(at("s1"), Listing::collection(options))],
        &[(Location::new("s4", "orders_v2"), None)],
        &bookkeeping(),
    )
}

fn refusals(options: Document) -> Vec<Refusal> {
    one_source(options).expect_err("refused").0
}

#[test]
fn what_mongodb_lets_a_collection_be_created_with_is_carried() {
    let options = doc! {
        "validator": { "$jsonSchema": {
            "bsonType": "object",
            "required": ["customerId"],
            "properties": { "total": { "bsonType": "number" } },
        } },
        "validationLevel": "moderate",
        "validationAction": "error",
        "collation": { "locale": "fr", "strength": 2 },
        "changeStreamPreAndPostImages": { "enabled": true },
        "storageEngine": { "wiredTiger": { "configString": "block_compressor=zstd" } },
        "indexOptionDefaults": { "storageEngine": { "wiredTiger": {} } },
        "flags": 1,
        "autoIndexId": true,
    };
    let mut carried = options.clone();
    carried.remove("flags");
    carried.remove("autoIndexId");
    assert_eq!(one_source(options), Ok(carried));
}

#[test]
fn a_clustered_collection_is_carried_with_its_expiry() {
    let options = doc! {
        "clusteredIndex": { "v": 2, "key": { "_id": 1 }, "name": "_id_", "unique": true },
        "expireAfterSeconds": 3600_i64,
    };
    assert_eq!(one_source(options.clone()), Ok(options));
}

#[test]
fn a_collection_without_options_is_created_plain() {
    assert_eq!(one_source(doc! {}), Ok(doc! {}));
    assert_eq!(
        decide(
            &[],
            &[(Location::new("s4", "orders_v2"), None)],
            &bookkeeping()
        ),
        Ok(doc! {})
    );
}

#[test]
fn collections_reshard_cannot_reproduce_are_refused_with_why() {
    let cases = [
        (
            doc! { "capped": true, "size": 4096, "max": 10 },
            Unmovable::Capped,
        ),
        (
            doc! { "timeseries": { "timeField": "t", "granularity": "hours" } },
            Unmovable::TimeSeries,
        ),
        (
            doc! { "encryptedFields": { "fields": [] } },
            Unmovable::Encrypted,
        ),
        (doc! { "autoIndexId": false }, Unmovable::WithoutIdIndex),
    ];
    for (options, kind) in cases {
        assert_eq!(
            refusals(options.clone()),
            [Refusal::Unmovable {
                locations: vec![at("s1")],
                kind
            }],
            "{options}"
        );
    }
    // `capped: false`, with sizes a server may still list, is an ordinary collection.
    assert_eq!(
        one_source(doc! { "capped": false, "size": 4096 }),
        Ok(doc! {})
    );
    let view = Listing {
        kind: "view".to_owned(),
        options: doc! { "viewOn": "raw_orders", "pipeline": [] },
    };
    let timeseries = Listing {
        kind: "timeseries".to_owned(),
        options: doc! {},
    };
    for (listing, kind) in [
        (
            view,
            Unmovable::View {
                on: "raw_orders".to_owned(),
            },
        ),
        (timeseries, Unmovable::TimeSeries),
    ] {
        assert_eq!(
            decide(&[(at("s1"), listing)], &[], &bookkeeping()),
            Err(Refused(vec![Refusal::Unmovable {
                locations: vec![at("s1")],
                kind
            }]))
        );
    }
}

#[test]
fn a_refusal_says_where_why_and_what_to_do() {
    let refused = decide(
        &[
            (
                at("s1"),
                Listing::collection(doc! { "capped": true, "size": 4096 }),
            ),
            (
                at("s2"),
                Listing::collection(doc! { "capped": true, "size": 4096 }),
            ),
        ],
        &[],
        &bookkeeping(),
    )
    .unwrap_err();
    assert_eq!(
        refused.to_string(),
        "the collection's options cannot be carried to the target, so nothing was \
             created:\n- s1/orders, s2/orders are each a capped collection: once full it \
             evicts its oldest documents, so the copies, tombstones and application writes \
             reshard puts in it would push out documents nobody deleted (and MongoDB cannot \
             shard a capped collection either). Copy it into an ordinary collection ($out), \
             rename that into its place (or expire documents with a TTL index instead of the \
             cap), and advance again"
    );
}

#[test]
fn an_unknown_option_is_refused_only_where_reshard_would_create_the_target() {
    let options = doc! { "recordIdsReplicated": true };
    assert_eq!(
        refusals(options.clone()),
        [Refusal::UnknownOption {
            locations: vec![at("s1")],
            option: "recordIdsReplicated".to_owned(),
            targets: vec![Location::new("s4", "orders_v2")],
        }]
    );
    // A target the operator created with the same option is kept; one without it is not.
    let sources = [(at("s1"), Listing::collection(options.clone()))];
    let target = Location::new("s4", "orders_v2");
    assert_eq!(
        decide(
            &sources,
            &[(target.clone(), Some(Listing::collection(options)))],
            &bookkeeping()
        ),
        Ok(doc! {})
    );
    assert_eq!(
        decide(
            &sources,
            &[(target.clone(), Some(Listing::collection(doc! {})))],
            &bookkeeping()
        ),
        Err(Refused(vec![Refusal::TargetDiffers {
            option: "recordIdsReplicated".to_owned(),
            source: at("s1"),
            source_value: Some(Bson::Boolean(true)),
            target,
            target_value: None,
        }]))
    );
}

#[test]
fn sources_that_differ_are_refused_with_the_difference_named() {
    let fr = doc! { "collation": { "locale": "fr", "strength": 2 } };
    let refused = decide(
        &[
            (at("s1"), Listing::collection(fr.clone())),
            (at("s2"), Listing::collection(fr.clone())),
            (at("s3"), Listing::collection(doc! {})),
        ],
        &[],
        &bookkeeping(),
    );
    assert_eq!(
        refused,
        Err(Refused(vec![Refusal::SourcesDiffer {
            option: "collation".to_owned(),
            first: at("s1"),
            first_value: fr.get("collation").cloned(),
            other: at("s3"),
            other_value: None,
        }]))
    );
    let shown = refused.unwrap_err().to_string();
    assert!(
        shown.contains(
            "the source locations differ in \"collation\": s1/orders has { \"locale\": \
                 \"fr\", \"strength\": 2 }, s3/orders has none"
        ),
        "{shown}"
    );
    // How the sources store their data may differ: the first one's is carried.
    let zstd =
        doc! { "storageEngine": { "wiredTiger": { "configString": "block_compressor=zstd" } } };
    assert_eq!(
        decide(
            &[
                (at("s1"), Listing::collection(zstd.clone())),
                (at("s2"), Listing::collection(doc! {})),
            ],
            &[],
            &bookkeeping()
        ),
        Ok(zstd)
    );
}

#[test]
fn defaults_written_out_or_left_out_are_the_same_options() {
    let given = doc! {
        "validator": { "status": { "$exists": true }, "_reshard.deleted": { "$exists": true } },
        "collation": { "locale": "simple" },
        "changeStreamPreAndPostImages": { "enabled": false },
        "clusteredIndex": { "key": { "_id": 1 }, "unique": true },
        "expireAfterSeconds": 60,
    };
    let listed = doc! {
        "validator": { "_reshard.deleted": { "$exists": true }, "status": { "$exists": true } },
        "validationLevel": "strict",
        "validationAction": "error",
        "clusteredIndex": { "v": 2, "key": { "_id": 1 }, "unique": true },
        "expireAfterSeconds": 60_i64,
    };
    assert_eq!(
        compared(&Listing::collection(given)),
        compared(&Listing::collection(listed))
    );
}

#[test]
fn an_existing_target_is_checked_against_the_source() {
    let source = doc! {
        "collation": { "locale": "fr", "strength": 2 },
        "storageEngine": { "wiredTiger": { "configString": "block_compressor=zstd" } },
    };
    let target = Location::new("s4", "orders_v2");
    let check = |target_options: Document| {
        decide(
            &[(at("s1"), Listing::collection(source.clone()))],
            &[(target.clone(), Some(Listing::collection(target_options)))],
            &bookkeeping(),
        )
    };
    // The same collation, stored otherwise: kept.
    assert!(check(doc! { "collation": { "locale": "fr", "strength": 2 } }).is_ok());
    let refused = check(doc! { "collation": { "locale": "en" } }).unwrap_err();
    assert_eq!(
        refused.0,
        [Refusal::TargetDiffers {
            option: "collation".to_owned(),
            source: at("s1"),
            source_value: source.get("collation").cloned(),
            target: target.clone(),
            target_value: Some(Bson::Document(doc! { "locale": "en" })),
        }]
    );
    assert!(
        refused
            .to_string()
            .contains("compare strings differently, in queries, sorts and unique indexes"),
        "{refused}"
    );
    // A validator the source does not have is a difference too.
    assert_eq!(
        check(doc! {
            "collation": { "locale": "fr", "strength": 2 },
            "validator": { "status": { "$exists": true } },
            "validationAction": "warn",
        })
        .unwrap_err()
        .0
        .iter()
        .map(|r| match r {
            Refusal::TargetDiffers { option, .. } => option.as_str(),
            other => panic!("{other:?}"),
        })
        .collect::<Vec<_>>(),
        ["validator", "validationLevel", "validationAction"]
    );
    assert_eq!(
        check(doc! { "capped": true, "size": 4096 }).unwrap_err().0,
        [Refusal::TargetUnmovable {
            target,
            kind: Unmovable::Capped
        }]
    );
}

fn schema_validator(schema: Document) -> Document {
    doc! { "validator": { "$jsonSchema": schema } }
}

#[test]
fn a_validator_that_forbids_reshard_fields_is_refused() {
    let closed = doc! {
        "bsonType": "object",
        "additionalProperties": false,
        "properties": { "_id": {}, "customerId": { "bsonType": "string" } },
    };
    let found = refusals(schema_validator(closed.clone()));
    assert_eq!(
        found,
        [Refusal::Validator {
            locations: vec![at("s1")],
            problem: ValidatorProblem::RefusesBookkeeping {
                why: vec!["its $jsonSchema allows only the fields it lists \
                               (additionalProperties: false), and `_reshard` and `bucket` are \
                               not among them"
                    .to_owned()],
                added: vec!["_reshard".to_owned(), "bucket".to_owned()],
            },
        }]
    );
    assert!(
        found[0].to_string().contains(
            "e.g. by adding _reshard: {bsonType: \"object\"} and bucket: {bsonType: \"int\"} \
                 to the schema's properties"
        ),
        "{}",
        found[0]
    );
    // Listing reshard's fields lets its documents through.
    let mut open = closed.clone();
    open.get_document_mut("properties").unwrap().extend(doc! {
        "_reshard": { "bsonType": "object" },
        "bucket": { "bsonType": ["int", "long"] },
    });
    assert!(one_source(schema_validator(open.clone())).is_ok());
    // ... unless it wants them of another type.
    let mut wrong = open;
    wrong
        .get_document_mut("properties")
        .unwrap()
        .insert("bucket", doc! { "bsonType": "string" });
    assert!(matches!(
        &refusals(schema_validator(wrong))[..],
        [Refusal::Validator { problem: ValidatorProblem::RefusesBookkeeping { why, .. }, .. }]
            if why == &["its $jsonSchema wants `bucket` to be of bsonType string, and \
                             reshard writes a 32-bit integer"]
    ));
    // A validator that only warns, or is off, refuses nothing.
    for (level, action) in [("strict", "warn"), ("off", "error")] {
        let mut options = schema_validator(closed.clone());
        options.insert("validationLevel", level);
        options.insert("validationAction", action);
        assert!(one_source(options).is_ok(), "{level} {action}");
    }
}

#[test]
fn a_validator_that_refuses_tombstones_is_refused_unless_it_exempts_them() {
    let required = doc! {
        "bsonType": "object",
        "required": ["_id", "customerId", "status", "total"],
    };
    assert_eq!(
        refusals(schema_validator(required.clone())),
        [Refusal::Validator {
            locations: vec![at("s1")],
            problem: ValidatorProblem::RefusesTombstones {
                why: vec!["its $jsonSchema requires `status` and `total`".to_owned()],
                fields: ["_id", "customerId", "bucket", "_reshard"]
                    .map(str::to_owned)
                    .to_vec(),
            },
        }]
    );
    // What reshard cannot judge may refuse a tombstone: refused, with the same remedy.
    let query = doc! { "validator": { "status": { "$in": ["open", "paid"] } } };
    let found = refusals(query);
    assert!(
        matches!(
            &found[..],
            [Refusal::Validator {
                problem: ValidatorProblem::MayRefuseTombstones { .. },
                ..
            }]
        ),
        "{found:?}"
    );
    assert!(
        found[0]
            .to_string()
            .contains("validator {$or: [{\"_reshard.deleted\": true}, <the validator>]}"),
        "{}",
        found[0]
    );
    // Exempted, both are carried as they are.
    for validator in [
        doc! { "$or": [ { "_reshard.deleted": true }, { "$jsonSchema": required.clone() } ] },
        doc! { "$or": [
            { "status": { "$in": ["open", "paid"] } },
            { "_reshard.deleted": { "$exists": true } },
        ] },
    ] {
        let options = doc! { "validator": validator };
        assert_eq!(one_source(options.clone()), Ok(options));
    }
    // A required field a tombstone holds is no problem.
    assert!(one_source(schema_validator(doc! { "required": ["customerId"] })).is_ok());
}

#[test]
fn the_same_problem_on_several_sources_is_one_refusal() {
    let options = doc! { "validator": { "status": { "$exists": true } } };
    let sources: Vec<(Location, Listing)> = ["s1", "s2", "s3"]
        .into_iter()
        .map(|s| (at(s), Listing::collection(options.clone())))
        .collect();
    assert_eq!(
        decide(&sources, &[], &bookkeeping()).unwrap_err().0,
        [Refusal::Validator {
            locations: vec![at("s1"), at("s2"), at("s3")],
            problem: ValidatorProblem::MayRefuseTombstones {
                fields: ["_id", "customerId", "bucket", "_reshard"]
                    .map(str::to_owned)
                    .to_vec(),
            },
        }]
    );
}

#[test]
fn a_listing_entry_gives_its_kind_and_options() {
    let entry = doc! {
        "name": "orders",
        "type": "timeseries",
        "options": { "timeseries": { "timeField": "t" } },
        "info": { "readOnly": false },
    };
    assert_eq!(
        Listing::from_entry(&entry),
        Listing {
            kind: "timeseries".to_owned(),
            options: doc! { "timeseries": { "timeField": "t" } },
        }
    );
    assert_eq!(
        Listing::from_entry(&doc! { "name": "orders" }),
        Listing::collection(doc! {})
    );
}
