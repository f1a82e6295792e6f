use super::*;
use bson::doc;
use proptest::prelude::*;

const MSG: i32 = 2013;
const QUERY: i32 = 2004;

fn limits() -> Limits {
    Limits::default()
}

fn bytes_of(document: &Document) -> Vec<u8> {
    let mut out = Vec::new();
    document.to_writer(&mut out).unwrap();
    out
}

/// A message written by hand: the header, then `payload` as it is.
fn frame(request_id: i32, op_code: i32, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&((HEADER_LEN + payload.len()) as i32).to_le_bytes());
    out.extend_from_slice(&request_id.to_le_bytes());
    out.extend_from_slice(&0i32.to_le_bytes());
    out.extend_from_slice(&op_code.to_le_bytes());
    out.extend_from_slice(payload);
    out
}

/// An `OP_MSG` payload: flags, then the sections as given.
fn msg_payload(flags: u32, sections: &[&[u8]]) -> Vec<u8> {
    let mut out = flags.to_le_bytes().to_vec();
    for section in sections {
        out.extend_from_slice(section);
    }
    out
}

fn body(document: &Document) -> Vec<u8> {
    let mut out = vec![0];
    out.extend(bytes_of(document));
    out
}

fn sequence(identifier: &[u8], documents: &[Document]) -> Vec<u8> {
    let mut content = identifier.to_vec();
    content.push(0);
    for d in documents {
        content.extend(bytes_of(d));
    }
    let mut out = vec![1];
    out.extend_from_slice(&((content.len() + 4) as i32).to_le_bytes());
    out.extend(content);
    out
}

fn query_payload(collection: &str, query: &Document, rest: &[u8]) -> Vec<u8> {
    let mut out = 0i32.to_le_bytes().to_vec();
    out.extend_from_slice(collection.as_bytes());
    out.push(0);
    out.extend_from_slice(&0i32.to_le_bytes());
    out.extend_from_slice(&(-1i32).to_le_bytes());
    out.extend(bytes_of(query));
    out.extend_from_slice(rest);
    out
}

fn decode(bytes: &[u8]) -> Result<Request, WireError> {
    Request::decode(bytes, &limits())
}

#[test]
fn the_checksum_is_crc32c() {
    // The check value of CRC-32C (Castagnoli) from its catalogue.
    assert_eq!(CRC32C.checksum(b"123456789"), 0xe306_9283);
}

#[test]
fn a_hello_in_an_op_msg_is_its_body() {
    let hello = doc! {"hello": 1, "$db": "admin"};
    let bytes = frame(7, MSG, &msg_payload(0, &[&body(&hello)]));
    // The header as a driver writes it, byte by byte.
    assert_eq!(&bytes[..4], &(bytes.len() as i32).to_le_bytes());
    assert_eq!(&bytes[12..16], &[0xdd, 0x07, 0, 0]);
    let request = decode(&bytes).unwrap();
    assert_eq!(
        request,
        Request {
            request_id: 7,
            command: hello,
            form: RequestForm::Msg { flags: MsgFlags(0) },
        }
    );
    assert_eq!(request.command_name(), Some("hello"));
    assert!(request.expects_reply());
}

#[test]
fn document_sequences_are_folded_into_the_command_as_arrays() {
    let insert = doc! {"insert": "orders", "$db": "shop"};
    let docs = [doc! {"_id": 1}, doc! {"_id": 2}];
    let bytes = frame(
        1,
        MSG,
        &msg_payload(
            0,
            &[
                &sequence(b"documents", &docs),
                &body(&insert),
                &sequence(b"empty", &[]),
            ],
        ),
    );
    let request = decode(&bytes).unwrap();
    assert_eq!(
        request.command,
        doc! {
            "insert": "orders",
            "$db": "shop",
            "documents": [{"_id": 1}, {"_id": 2}],
            "empty": [],
        }
    );
    assert_eq!(request.command_name(), Some("insert"));
}

#[test]
fn flags_are_kept_and_optional_unknown_bits_are_ignored() {
    let ping = doc! {"ping": 1, "$db": "admin"};
    let flags = MsgFlags::MORE_TO_COME | MsgFlags::EXHAUST_ALLOWED | (1 << 20);
    let request = decode(&frame(1, MSG, &msg_payload(flags, &[&body(&ping)]))).unwrap();
    let RequestForm::Msg { flags: got } = request.form else {
        panic!("an OP_MSG request")
    };
    assert!(got.more_to_come() && got.exhaust_allowed() && !got.checksum_present());
    assert!(!request.expects_reply());
}

#[test]
fn a_checksum_is_verified_and_covers_the_whole_message() {
    let ping = doc! {"ping": 1, "$db": "admin"};
    let mut bytes = frame(
        3,
        MSG,
        &msg_payload(MsgFlags::CHECKSUM_PRESENT, &[&body(&ping), &[0; 4]]),
    );
    let end = bytes.len() - 4;
    let crc = CRC32C.checksum(&bytes[..end]);
    bytes[end..].copy_from_slice(&crc.to_le_bytes());
    assert_eq!(decode(&bytes).unwrap().command, ping);

    // A flipped bit in the body, then in the header's request id: both are covered.
    for at in [HEADER_LEN + 10, 5] {
        let mut corrupt = bytes.clone();
        corrupt[at] ^= 0x01;
        assert!(
            matches!(decode(&corrupt), Err(WireError::ChecksumMismatch { found, .. }) if found == crc),
            "byte {at}"
        );
    }
}

#[test]
fn a_legacy_handshake_is_unwrapped_and_gets_its_database() {
    let wrapped = doc! {
        "$query": {"isMaster": 1, "helloOk": true},
        "$readPreference": {"mode": "primaryPreferred"},
    };
    let bytes = frame(9, QUERY, &query_payload("admin.$cmd", &wrapped, &[]));
    let request = decode(&bytes).unwrap();
    assert_eq!(
        request,
        Request {
            request_id: 9,
            command: doc! {
                "isMaster": 1,
                "helloOk": true,
                "$readPreference": {"mode": "primaryPreferred"},
                "$db": "admin",
            },
            form: RequestForm::Query {
                full_collection_name: "admin.$cmd".into()
            },
        }
    );

    // Unwrapped, with a field selector after it (drivers never send one for a command,
    // but the opcode allows it).
    let plain = doc! {"isMaster": 1};
    let selector = bytes_of(&doc! {"a": 1});
    let bytes = frame(10, QUERY, &query_payload("test.$cmd", &plain, &selector));
    assert_eq!(
        decode(&bytes).unwrap().command,
        doc! {"isMaster": 1, "$db": "test"}
    );
}

#[test]
fn a_reply_answers_in_the_form_of_the_request() {
    let answer = doc! {"ok": 1.0};
    let query = decode(&frame(
        9,
        QUERY,
        &query_payload("admin.$cmd", &doc! {"isMaster": 1}, &[]),
    ))
    .unwrap();
    let reply = query.reply(100, answer.clone()).unwrap();
    // OP_REPLY, written out: header, flags (AwaitCapable), cursor 0, from 0, one document.
    let mut expected = Vec::new();
    expected.extend_from_slice(&8i32.to_le_bytes());
    expected.extend_from_slice(&0i64.to_le_bytes());
    expected.extend_from_slice(&0i32.to_le_bytes());
    expected.extend_from_slice(&1i32.to_le_bytes());
    expected.extend(bytes_of(&answer));
    let mut expected = frame(100, 1, &expected);
    expected[8..12].copy_from_slice(&9i32.to_le_bytes());
    assert_eq!(reply, expected);

    let msg = decode(&frame(
        11,
        MSG,
        &msg_payload(0, &[&body(&doc! {"ping": 1, "$db": "admin"})]),
    ))
    .unwrap();
    let reply = msg.reply(101, answer.clone()).unwrap();
    let mut expected = frame(101, MSG, &msg_payload(0, &[&body(&answer)]));
    expected[8..12].copy_from_slice(&11i32.to_le_bytes());
    assert_eq!(reply, expected);
}

#[test]
fn a_checksummed_request_gets_a_checksummed_reply() {
    let request = Request {
        request_id: 4,
        command: doc! {"ping": 1, "$db": "admin"},
        form: RequestForm::Msg {
            flags: MsgFlags(MsgFlags::CHECKSUM_PRESENT | MsgFlags::EXHAUST_ALLOWED),
        },
    };
    let reply = request.reply(5, doc! {"ok": 1.0}).unwrap();
    let end = reply.len() - 4;
    assert_eq!(
        u32::from_le_bytes(reply[end..].try_into().unwrap()),
        CRC32C.checksum(&reply[..end])
    );
    let decoded = Message::decode(&reply, &limits()).unwrap();
    assert_eq!(decoded.response_to, 4);
    let Op::Msg(msg) = decoded.op else {
        panic!("an OP_MSG reply")
    };
    // Checksummed, and never moreToCome: the front does not stream.
    assert_eq!(msg.flags, MsgFlags(MsgFlags::CHECKSUM_PRESENT));
}

/// Every malformed message, each with the error it must get.
#[test]
fn every_malformed_message_gets_its_own_error() {
    let ping = doc! {"ping": 1, "$db": "admin"};
    let good_body = body(&ping);
    let ok = frame(1, MSG, &msg_payload(0, &[&good_body]));

    let mut cases: Vec<(&str, Vec<u8>, WireError)> = Vec::new();

    cases.push((
        "a header cut short",
        ok[..10].to_vec(),
        WireError::Truncated {
            part: Part::Header,
            needed: 4,
            left: 2,
        },
    ));
    let mut short = ok.clone();
    short[..4].copy_from_slice(&15i32.to_le_bytes());
    cases.push((
        "a length below a header",
        short,
        WireError::ShorterThanHeader { length: 15 },
    ));
    let mut negative = ok.clone();
    negative[..4].copy_from_slice(&(-1i32).to_le_bytes());
    cases.push((
        "a negative length",
        negative,
        WireError::ShorterThanHeader { length: -1 },
    ));
    let mut huge = ok.clone();
    huge[..4].copy_from_slice(&48_000_001i32.to_le_bytes());
    cases.push((
        "a length over the maximum",
        huge,
        WireError::TooLong {
            length: 48_000_001,
            max: MAX_MESSAGE_SIZE,
        },
    ));
    let mut longer = ok.clone();
    longer.push(0);
    cases.push((
        "more bytes than the header says",
        longer,
        WireError::LengthMismatch {
            declared: ok.len(),
            present: ok.len() + 1,
        },
    ));
    let mut fewer = ok.clone();
    fewer[..4].copy_from_slice(&((ok.len() + 3) as i32).to_le_bytes());
    cases.push((
        "fewer bytes than the header says",
        fewer,
        WireError::LengthMismatch {
            declared: ok.len() + 3,
            present: ok.len(),
        },
    ));
    cases.push((
        "an unknown opcode",
        frame(1, 9999, &[]),
        WireError::UnknownOpCode(9999),
    ));
    cases.push((
        "OP_COMPRESSED",
        frame(1, 2012, &[0; 9]),
        WireError::UnsupportedOpCode(OpCode::Compressed),
    ));
    cases.push((
        "OP_INSERT",
        frame(1, 2002, &[0; 9]),
        WireError::UnsupportedOpCode(OpCode::Insert),
    ));
    let reply = Message {
        request_id: 1,
        response_to: 0,
        op: Op::Reply(OpReply {
            response_flags: 0,
            cursor_id: 0,
            starting_from: 0,
            documents: vec![ping.clone()],
        }),
    }
    .encode()
    .unwrap();
    cases.push((
        "an OP_REPLY sent to the server",
        reply,
        WireError::UnsupportedOpCode(OpCode::Reply),
    ));
    cases.push((
        "no flag bits",
        frame(1, MSG, &[0, 0]),
        WireError::Truncated {
            part: Part::MsgFlags,
            needed: 4,
            left: 2,
        },
    ));
    cases.push((
        "an unknown required flag bit",
        frame(1, MSG, &msg_payload(1 << 2 | 1 << 17, &[&good_body])),
        WireError::UnknownRequiredFlags(1 << 2),
    ));
    cases.push((
        "a checksum flag without a checksum",
        frame(1, MSG, &msg_payload(MsgFlags::CHECKSUM_PRESENT, &[&[0, 0]])),
        WireError::Truncated {
            part: Part::Checksum,
            needed: 4,
            left: 2,
        },
    ));
    cases.push((
        "flags and nothing else",
        frame(1, MSG, &msg_payload(0, &[])),
        WireError::NoBody,
    ));
    cases.push((
        "an unknown section kind",
        frame(1, MSG, &msg_payload(0, &[&good_body, &[2]])),
        WireError::UnknownSectionKind(2),
    ));
    cases.push((
        "only a document sequence",
        frame(1, MSG, &msg_payload(0, &[&sequence(b"documents", &[])])),
        WireError::NoBody,
    ));
    cases.push((
        "two bodies",
        frame(1, MSG, &msg_payload(0, &[&good_body, &good_body])),
        WireError::MultipleBodies,
    ));
    let mut seq = sequence(b"documents", &[doc! {"a": 1}]);
    seq[1..5].copy_from_slice(&(-5i32).to_le_bytes());
    cases.push((
        "a negative sequence length",
        frame(1, MSG, &msg_payload(0, &[&good_body, &seq])),
        WireError::SequenceLength {
            declared: -5,
            left: seq.len() - 1,
        },
    ));
    let mut seq = sequence(b"documents", &[doc! {"a": 1}]);
    let declared = (seq.len() - 1 + 1) as i32;
    seq[1..5].copy_from_slice(&declared.to_le_bytes());
    cases.push((
        "a sequence longer than the message",
        frame(1, MSG, &msg_payload(0, &[&good_body, &seq])),
        WireError::SequenceLength {
            declared,
            left: seq.len() - 1,
        },
    ));
    let mut seq = sequence(b"documents", &[]);
    seq[1..5].copy_from_slice(&3i32.to_le_bytes());
    cases.push((
        "a sequence length that does not cover itself",
        frame(1, MSG, &msg_payload(0, &[&good_body, &seq])),
        WireError::SequenceLength {
            declared: 3,
            left: seq.len() - 1,
        },
    ));
    cases.push((
        "a sequence length cut short",
        frame(1, MSG, &msg_payload(0, &[&good_body, &[1, 9, 0]])),
        WireError::Truncated {
            part: Part::SequenceLength,
            needed: 4,
            left: 2,
        },
    ));
    let mut unterminated = vec![1];
    unterminated.extend_from_slice(&7i32.to_le_bytes());
    unterminated.extend_from_slice(b"doc");
    cases.push((
        "an identifier without its NUL",
        frame(1, MSG, &msg_payload(0, &[&good_body, &unterminated])),
        WireError::BadCString(Part::SequenceIdentifier),
    ));
    cases.push((
        "an identifier that is not UTF-8",
        frame(
            1,
            MSG,
            &msg_payload(0, &[&good_body, &sequence(b"\xff\xfe", &[])]),
        ),
        WireError::BadCString(Part::SequenceIdentifier),
    ));
    let mut seq = sequence(b"documents", &[doc! {"a": 1}]);
    seq.pop(); // the document's last byte, and the sequence's length with it
    let len = (seq.len() - 1) as i32;
    seq[1..5].copy_from_slice(&len.to_le_bytes());
    cases.push((
        "a sequence document longer than its sequence",
        frame(1, MSG, &msg_payload(0, &[&good_body, &seq])),
        WireError::DocumentLength {
            part: Part::SequenceDocument,
            declared: 12,
            left: 11,
        },
    ));
    cases.push((
        "two sequences of one name",
        frame(
            1,
            MSG,
            &msg_payload(
                0,
                &[
                    &good_body,
                    &sequence(b"documents", &[]),
                    &sequence(b"documents", &[]),
                ],
            ),
        ),
        WireError::DuplicateSequence("documents".into()),
    ));
    cases.push((
        "a sequence named like a body field",
        frame(
            1,
            MSG,
            &msg_payload(0, &[&good_body, &sequence(b"ping", &[])]),
        ),
        WireError::SequenceShadowsBody("ping".into()),
    ));
    let mut long_body = good_body.clone();
    long_body[1..5].copy_from_slice(&1000i32.to_le_bytes());
    cases.push((
        "a body longer than the message",
        frame(1, MSG, &msg_payload(0, &[&long_body])),
        WireError::DocumentLength {
            part: Part::MsgBody,
            declared: 1000,
            left: good_body.len() - 1,
        },
    ));
    let mut tiny_body = good_body.clone();
    tiny_body[1..5].copy_from_slice(&4i32.to_le_bytes());
    cases.push((
        "a body length below an empty document's",
        frame(1, MSG, &msg_payload(0, &[&tiny_body])),
        WireError::DocumentLength {
            part: Part::MsgBody,
            declared: 4,
            left: good_body.len() - 1,
        },
    ));
    cases.push((
        "a body length cut short",
        frame(1, MSG, &msg_payload(0, &[&[0, 5, 0]])),
        WireError::Truncated {
            part: Part::MsgBody,
            needed: 4,
            left: 2,
        },
    ));
    // `{a: 1}` with the trailing NUL replaced.
    let mut unterminated = body(&doc! {"a": 1});
    let last = unterminated.len() - 1;
    unterminated[last] = 7;
    cases.push((
        "a document without its trailing NUL",
        frame(1, MSG, &msg_payload(0, &[&unterminated])),
        WireError::InvalidBson {
            part: Part::MsgBody,
            reason: "malformed value: \"document not null-terminated\"".into(),
        },
    ));
    // `{a: 1}` with the element type 0x10 (int32) replaced by 0x7e.
    let mut bad_type = body(&doc! {"a": 1});
    bad_type[5] = 0x7e;
    let bad_type_message = frame(1, MSG, &msg_payload(0, &[&bad_type]));
    // `{a: "é"}` with the string's bytes replaced by invalid UTF-8.
    let mut bad_utf8 = body(&doc! {"s": "\u{e9}"});
    let at = bad_utf8.len() - 4;
    bad_utf8[at..at + 2].copy_from_slice(&[0xc3, 0x28]);
    let bad_utf8_message = frame(1, MSG, &msg_payload(0, &[&bad_utf8]));
    // A nested document whose length runs past its parent.
    let mut nested = body(&doc! {"d": {"x": 1}});
    nested[8..12].copy_from_slice(&100i32.to_le_bytes());
    let nested_message = frame(1, MSG, &msg_payload(0, &[&nested]));

    for (name, bytes, expected) in cases {
        assert_eq!(decode(&bytes), Err(expected), "{name}");
    }
    for (name, bytes) in [
        ("an unknown element type", bad_type_message),
        ("a string that is not UTF-8", bad_utf8_message),
        ("a nested document longer than its parent", nested_message),
    ] {
        assert!(
            matches!(
                decode(&bytes),
                Err(WireError::InvalidBson {
                    part: Part::MsgBody,
                    ..
                })
            ),
            "{name}: {:?}",
            decode(&bytes)
        );
    }
}

#[test]
fn malformed_legacy_queries_get_their_own_errors() {
    let is_master = doc! {"isMaster": 1};
    let cases: Vec<(&str, Vec<u8>, WireError)> = vec![
        (
            "a collection name without its NUL",
            frame(1, QUERY, &[0, 0, 0, 0, b'a', b'.']),
            WireError::BadCString(Part::QueryCollection),
        ),
        (
            "no numberToReturn",
            frame(1, QUERY, &[0, 0, 0, 0, b'a', 0, 1, 0, 0, 0]),
            WireError::Truncated {
                part: Part::QuerySkipAndReturn,
                needed: 4,
                left: 0,
            },
        ),
        (
            "a query of a collection, not a command",
            frame(1, QUERY, &query_payload("shop.orders", &is_master, &[])),
            WireError::QueryNotCommand("shop.orders".into()),
        ),
        (
            "a command without a database",
            frame(1, QUERY, &query_payload(".$cmd", &is_master, &[])),
            WireError::QueryNotCommand(".$cmd".into()),
        ),
        (
            "bytes after the field selector",
            frame(
                1,
                QUERY,
                &query_payload("admin.$cmd", &is_master, &{
                    let mut rest = bytes_of(&doc! {});
                    rest.push(9);
                    rest
                }),
            ),
            WireError::TrailingBytes {
                part: Part::QueryFieldSelector,
                count: 1,
            },
        ),
        (
            "a selector cut short",
            frame(1, QUERY, &query_payload("admin.$cmd", &is_master, &[9, 0])),
            WireError::Truncated {
                part: Part::QueryFieldSelector,
                needed: 4,
                left: 2,
            },
        ),
    ];
    for (name, bytes, expected) in cases {
        assert_eq!(decode(&bytes), Err(expected), "{name}");
    }
}

#[test]
fn a_reply_whose_count_disagrees_with_its_documents_is_refused() {
    let mut payload = Vec::new();
    payload.extend_from_slice(&0i32.to_le_bytes());
    payload.extend_from_slice(&0i64.to_le_bytes());
    payload.extend_from_slice(&0i32.to_le_bytes());
    payload.extend_from_slice(&2i32.to_le_bytes());
    payload.extend(bytes_of(&doc! {"ok": 1}));
    assert!(matches!(
        Message::decode(&frame(1, 1, &payload), &limits()),
        Err(WireError::InvalidBson {
            part: Part::ReplyFields,
            ..
        })
    ));
}

/// `{a: {a: ... {} }}`, `levels` documents deep counting the outermost.
fn nested(levels: usize) -> Document {
    let mut document = doc! {};
    for _ in 1..levels {
        document = doc! {"a": document};
    }
    document
}

#[test]
fn nesting_is_bounded_at_mongodb_s_depth() {
    let deepest = nested(MAX_BSON_DEPTH);
    let ok = frame(
        1,
        MSG,
        &msg_payload(0, &[&body(&doc! {"ping": 1, "d": deepest.clone()})]),
    );
    // The command itself is one level: its field nests MAX_BSON_DEPTH more.
    assert_eq!(decode(&ok), Err(WireError::TooDeep(Part::MsgBody)));
    let within = nested(MAX_BSON_DEPTH - 1);
    let ok = frame(
        1,
        MSG,
        &msg_payload(0, &[&body(&doc! {"ping": 1, "d": within})]),
    );
    assert!(decode(&ok).is_ok());
    // Arrays count as levels too.
    let mut deep_array = Bson::Int32(1);
    for _ in 0..MAX_BSON_DEPTH {
        deep_array = Bson::Array(vec![deep_array]);
    }
    let bytes = frame(1, MSG, &msg_payload(0, &[&body(&doc! {"a": deep_array})]));
    assert_eq!(decode(&bytes), Err(WireError::TooDeep(Part::MsgBody)));
}

#[test]
fn a_header_is_refused_before_its_body_is_read() {
    // The server reads only these 16 bytes before deciding.
    let mut header = frame(1, MSG, &[]);
    header[..4].copy_from_slice(&64i32.to_le_bytes());
    let small = Limits {
        max_message_size: 63,
    };
    assert_eq!(
        Header::parse(&header, &small),
        Err(WireError::TooLong {
            length: 64,
            max: 63
        })
    );
    assert_eq!(
        Header::parse(&header, &limits()),
        Ok(Header {
            message_length: 64,
            request_id: 1,
            response_to: 0,
            op_code: OpCode::Msg
        })
    );
}

#[test]
fn replies_that_cannot_be_written_are_an_error_not_a_panic() {
    let message = Message {
        request_id: 1,
        response_to: 0,
        op: Op::Msg(OpMsg {
            flags: MsgFlags(0),
            sections: vec![Section::Sequence {
                identifier: "a\0b".into(),
                documents: vec![],
            }],
        }),
    };
    assert!(matches!(message.encode(), Err(WireError::Unencodable(_))));
}

fn arb_document() -> impl Strategy<Value = Document> {
    let leaf = prop_oneof![
        any::<i32>().prop_map(Bson::Int32),
        any::<i64>().prop_map(Bson::Int64),
        any::<bool>().prop_map(Bson::Boolean),
        "[a-z\u{e9}\u{4e2d}]{0,8}".prop_map(Bson::String),
        Just(Bson::Null),
    ];
    let value = leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Bson::Array),
            prop::collection::vec(("[a-z$]{1,6}", inner), 0..4)
                .prop_map(|fields| Bson::Document(fields.into_iter().collect())),
        ]
    });
    prop::collection::vec(("[a-zA-Z$_]{1,8}", value), 0..5)
        .prop_map(|fields| fields.into_iter().collect())
}

fn arb_message() -> impl Strategy<Value = Message> {
    let sequence = ("[a-z]{1,8}", prop::collection::vec(arb_document(), 0..3)).prop_map(
        |(identifier, documents)| Section::Sequence {
            identifier,
            documents,
        },
    );
    let msg = (
        any::<bool>(),
        prop::sample::select(vec![0, MsgFlags::MORE_TO_COME, MsgFlags::EXHAUST_ALLOWED]),
        arb_document(),
        prop::collection::vec(sequence, 0..3),
        any::<prop::sample::Index>(),
    )
        .prop_map(|(checksum, flags, body, mut sections, at)| {
            let at = at.index(sections.len() + 1);
            sections.insert(at, Section::Body(body));
            let checksum = if checksum {
                MsgFlags::CHECKSUM_PRESENT
            } else {
                0
            };
            Op::Msg(OpMsg {
                flags: MsgFlags(flags | checksum),
                sections,
            })
        });
    let query = (
        any::<i32>(),
        "[a-z]{1,8}\\.[a-z$]{1,8}",
        any::<i32>(),
        any::<i32>(),
        arb_document(),
        prop::option::of(arb_document()),
    )
        .prop_map(
            |(flags, full_collection_name, skip, ret, query, selector)| {
                Op::Query(OpQuery {
                    flags,
                    full_collection_name,
                    number_to_skip: skip,
                    number_to_return: ret,
                    query,
                    return_fields_selector: selector,
                })
            },
        );
    let reply = (
        any::<i32>(),
        any::<i64>(),
        any::<i32>(),
        prop::collection::vec(arb_document(), 0..3),
    )
        .prop_map(|(response_flags, cursor_id, starting_from, documents)| {
            Op::Reply(OpReply {
                response_flags,
                cursor_id,
                starting_from,
                documents,
            })
        });
    (any::<i32>(), any::<i32>(), prop_oneof![msg, query, reply]).prop_map(
        |(request_id, response_to, op)| Message {
            request_id,
            response_to,
            op,
        },
    )
}

proptest! {
    #[test]
    fn decoding_arbitrary_bytes_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        let _ = Message::decode(&bytes, &limits());
        let _ = Request::decode(&bytes, &limits());
    }

    #[test]
    fn decoding_arbitrary_bytes_behind_a_true_header_never_panics(
        op_code in prop::sample::select(vec![1, 2004, 2013]),
        flags in prop::sample::select(vec![0u32, 1, 2, 1 << 16]),
        payload in prop::collection::vec(any::<u8>(), 0..256),
    ) {
        let mut body = flags.to_le_bytes().to_vec();
        body.extend(payload);
        let bytes = frame(1, op_code, &body);
        let _ = Request::decode(&bytes, &limits());
    }

    #[test]
    fn every_message_round_trips(message in arb_message()) {
        let bytes = message.encode().unwrap();
        prop_assert_eq!(Message::decode(&bytes, &limits()), Ok(message));
    }

    #[test]
    fn a_mutated_message_is_decoded_or_refused_never_a_panic(
        message in arb_message(),
        edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6),
        cut in prop::option::of(any::<prop::sample::Index>()),
    ) {
        let mut bytes = message.encode().unwrap();
        for (at, value) in edits {
            let at = at.index(bytes.len());
            bytes[at] = value;
        }
        if let Some(cut) = cut {
            bytes.truncate(cut.index(bytes.len() + 1));
        }
        let _ = Request::decode(&bytes, &limits());
    }
}
