use super::*;

/// RFC 7677, section 3: user "user", password "pencil".
pub(crate) const RFC_CLIENT_FIRST: &str = "n,,n=user,r=rOprNGfwEbeRWgbNEkqO";
pub(crate) const RFC_SERVER_NONCE: &str = "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0";
pub(crate) const RFC_SERVER_FIRST: &str =
    "r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096";
pub(crate) const RFC_CLIENT_FINAL: &str = "c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=";
pub(crate) const RFC_SERVER_FINAL: &str = "v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=";

/// The RFC's user, `user@admin`, with the RFC's salt and its 4,096 iterations.
pub(crate) fn rfc_users() -> Users {
    let salt = BASE64.decode("W22ZaJ0SNY7soEsUEjb6gQ==").unwrap();
    let credential = Credential::from_password("pencil", &salt, 4096).unwrap();
    Users::new([(UserName::new("user", "admin"), credential)])
}

fn rfc_conversation(skip_empty_exchange: bool) -> Conversation {
    let (conversation, server_first) = Conversation::start(
        &rfc_users(),
        "admin",
        RFC_CLIENT_FIRST.as_bytes(),
        RFC_SERVER_NONCE,
        skip_empty_exchange,
    )
    .unwrap();
    assert_eq!(String::from_utf8(server_first).unwrap(), RFC_SERVER_FIRST);
    conversation
}

#[test]
fn the_rfc_7677_exchange_is_answered_byte_for_byte() {
    let mut conversation = rfc_conversation(true);
    assert_eq!(
        conversation.step(RFC_CLIENT_FINAL.as_bytes()),
        Ok(Step::Done {
            payload: RFC_SERVER_FINAL.as_bytes().to_vec(),
            user: UserName::new("user", "admin"),
        })
    );
}

#[test]
fn without_skip_empty_exchange_an_empty_message_ends_the_conversation() {
    let mut conversation = rfc_conversation(false);
    assert_eq!(
        conversation.step(RFC_CLIENT_FINAL.as_bytes()),
        Ok(Step::Continue(RFC_SERVER_FINAL.as_bytes().to_vec()))
    );
    assert_eq!(conversation.clone().step(b"x"), Err(Failure::NotEmpty));
    assert_eq!(
        conversation.step(b""),
        Ok(Step::Done {
            payload: Vec::new(),
            user: UserName::new("user", "admin"),
        })
    );
}

#[test]
fn the_stored_credentials_are_written_as_mongodb_keeps_them() {
    let credential = rfc_users()
        .get(&UserName::new("user", "admin"))
        .unwrap()
        .clone();
    // The RFC gives the exchange, not the keys: these were computed apart from this code
    // (Python's hashlib.pbkdf2_hmac and hmac, from the RFC's password and salt).
    assert_eq!(
        credential.to_json(),
        json!({
            "iterationCount": 4096,
            "salt": "W22ZaJ0SNY7soEsUEjb6gQ==",
            "storedKey": "WG5d8oPm3OtcPnkdi4Uo7BkeZkBFzpcXkuLmtbsT4qY=",
            "serverKey": "wfPLwcE6nTWhTAmQ7tl2KeoiWGPlZqQxSrmfPwDl2dU=",
        })
    );
    assert_eq!(
        entry(&UserName::new("user", "admin"), &credential),
        json!({"user": "user", "db": "admin", "credentials": {"SCRAM-SHA-256": credential.to_json()}})
    );
}

#[test]
fn a_wrong_proof_a_foreign_nonce_or_a_broken_binding_fails() {
    let wrong_proof = RFC_CLIENT_FINAL.replace("p=dHzb", "p=eHzb");
    assert_eq!(
        rfc_conversation(true).step(wrong_proof.as_bytes()),
        Err(Failure::WrongProof)
    );
    let other_nonce = RFC_CLIENT_FINAL.replace("hNlF$k0", "hNlF$k1");
    assert_eq!(
        rfc_conversation(true).step(other_nonce.as_bytes()),
        Err(Failure::NonceMismatch)
    );
    for (message, expected) in [
        ("c=eSws,r=x,p=AAAA", "its channel binding (c=) is not"),
        (
            "r=x,c=biws,p=AAAA",
            "its first attribute is not the channel binding",
        ),
        ("c=biws,p=AAAA", "its second attribute is not the nonce"),
        ("c=biws,r=x", "its last attribute is not the proof"),
        ("nothing", "it has no proof"),
    ] {
        match rfc_conversation(true).step(message.as_bytes()) {
            Err(Failure::MalformedFinal(why)) => assert!(why.starts_with(expected), "{why}"),
            other => panic!("{message}: {other:?}"),
        }
    }
    let short_proof =
        RFC_CLIENT_FINAL.replace("p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=", "p=AAAA");
    assert_eq!(
        rfc_conversation(true).step(short_proof.as_bytes()),
        Err(Failure::MalformedFinal(
            "its proof is not 32 bytes long".into()
        ))
    );
    assert_eq!(
        rfc_conversation(true).step(&[0xff, 0xfe]),
        Err(Failure::NotUtf8)
    );
}

#[test]
fn a_client_first_message_is_parsed_as_mongodb_accepts_it() {
    let start = |message: &str| {
        Conversation::start(&rfc_users(), "admin", message.as_bytes(), "SERVER", true)
            .map(|(_, first)| String::from_utf8(first).unwrap())
            .map_err(|rejected| rejected.reason)
    };
    let salt = ",s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096";
    assert_eq!(start("n,,n=user,r=abcd"), Ok(format!("r=abcdSERVER{salt}")));
    assert_eq!(start("y,,n=user,r=abcd"), Ok(format!("r=abcdSERVER{salt}")));
    assert_eq!(
        start("n,a=user,n=user,r=abcd"),
        Ok(format!("r=abcdSERVER{salt}"))
    );
    // Extensions after the nonce are ignored.
    assert_eq!(
        start("n,,n=user,r=abcd,x=1"),
        Ok(format!("r=abcdSERVER{salt}"))
    );
    assert_eq!(
        start("p=tls-unique,,n=user,r=abcd"),
        Err(Failure::ChannelBinding)
    );
    assert_eq!(start("n,,n=someone,r=abcd"), Err(Failure::UnknownUser));
    for (message, expected) in [
        ("", "it has no GS2 header"),
        ("x,,n=user,r=abcd", "its channel-binding flag is \"x\""),
        ("n,", "its GS2 header does not end"),
        ("n,,m=ext,n=user,r=abcd", "it has a mandatory extension"),
        ("n,,r=abcd", "its first attribute is not a user name"),
        ("n,,n=,r=abcd", "its first attribute is not a user name"),
        ("n,,n=us=er,r=abcd", "its user name has an '='"),
        ("n,,n=user", "its second attribute is not a nonce"),
        ("n,,n=user,r=", "its second attribute is not a nonce"),
        ("n,,n=user,r=a b", "its second attribute is not a nonce"),
        (
            "n,u=user,n=user,r=abcd",
            "its authorization identity is not a=NAME",
        ),
        (
            "n,a=other,n=user,r=abcd",
            "its authorization identity \"other\"",
        ),
    ] {
        match start(message) {
            Err(Failure::MalformedFirst(why)) => {
                assert!(why.starts_with(expected), "{message}: {why}")
            }
            other => panic!("{message}: {other:?}"),
        }
    }
    // The user is looked up in the conversation's database.
    let rejected =
        Conversation::start(&rfc_users(), "shop", RFC_CLIENT_FIRST.as_bytes(), "S", true)
            .unwrap_err();
    assert_eq!(
        rejected,
        Rejected {
            user: Some(UserName::new("user", "shop")),
            reason: Failure::UnknownUser
        }
    );
}

#[test]
fn user_names_unescape_commas_and_equals_signs() {
    assert_eq!(decode_name("a=2Cb=3Dc").as_deref(), Some("a,b=c"));
    assert_eq!(decode_name("plain").as_deref(), Some("plain"));
    assert_eq!(decode_name("a=2"), None);
    assert_eq!(decode_name("a=41"), None);
    let credential = rfc_users()
        .get(&UserName::new("user", "admin"))
        .unwrap()
        .clone();
    let users = Users::new([(UserName::new("o,d=d", "admin"), credential)]);
    assert!(Conversation::start(&users, "admin", b"n,,n=o=2Cd=3Dd,r=abcd", "S", true).is_ok());
}

#[test]
fn passwords_are_saslprepped_and_never_empty() {
    let salt = b"salt";
    // SASLprep maps the non-ASCII space U+00A0 to a space and removes U+00AD (soft hyphen).
    assert_eq!(
        Credential::from_password("I\u{AD}X\u{A0}Y", salt, 4096),
        Credential::from_password("IX Y", salt, 4096)
    );
    assert_eq!(
        Credential::from_password("", salt, 4096),
        Err(PasswordError::Empty)
    );
    let refused = Credential::from_password("a\u{7}b", salt, 4096).unwrap_err();
    assert!(
        matches!(&refused, PasswordError::Prohibited(_)),
        "{refused}"
    );
    // The message does not quote the refused character.
    assert!(!refused.to_string().contains('\u{7}'));
}

#[test]
fn debug_output_shows_no_key() {
    let users = rfc_users();
    let credential = users.get(&UserName::new("user", "admin")).unwrap();
    let stored = credential.to_json()["storedKey"]
        .as_str()
        .unwrap()
        .to_owned();
    let conversation = rfc_conversation(true);
    for shown in [
        format!("{users:?}"),
        format!("{credential:?}"),
        format!("{conversation:?}"),
    ] {
        assert!(!shown.contains(&stored), "{shown}");
        assert!(!shown.contains("rOprNGfwEbeRWgbNEkqO"), "{shown}");
    }
    assert_eq!(
        format!("{users:?}"),
        "{UserName { user: \"user\", db: \"admin\" }}"
    );
}

#[test]
fn a_connection_is_authenticated_once_its_conversation_ends_and_a_failure_ends_it() {
    let mut authentication = Authentication::default();
    assert_eq!(authentication.step(b""), Err(ContinueError::NoConversation));
    authentication.begin(rfc_conversation(false));
    assert!(authentication.in_conversation());
    assert!(matches!(
        authentication.step(RFC_CLIENT_FINAL.as_bytes()),
        Ok(Step::Continue(_))
    ));
    assert!(
        !authentication.is_authenticated(),
        "not before the last step"
    );
    assert!(matches!(authentication.step(b""), Ok(Step::Done { .. })));
    assert_eq!(authentication.user(), Some(&UserName::new("user", "admin")));
    assert!(!authentication.in_conversation());

    let mut authentication = Authentication::default();
    authentication.begin(rfc_conversation(true));
    assert_eq!(
        authentication.step(b"c=biws,r=nope,p=AAAA"),
        Err(ContinueError::Failed {
            user: UserName::new("user", "admin"),
            reason: Failure::NonceMismatch
        })
    );
    assert!(!authentication.in_conversation());
    assert!(!authentication.is_authenticated());
}

/// Messages close to real ones, and mutations of them: what a hostile client sends.
fn mutated(
    base: &str,
    edits: &[(prop::sample::Index, u8)],
    cut: Option<prop::sample::Index>,
) -> Vec<u8> {
    let mut bytes = base.as_bytes().to_vec();
    for (at, value) in edits {
        let at = at.index(bytes.len());
        bytes[at] = *value;
    }
    if let Some(cut) = cut {
        bytes.truncate(cut.index(bytes.len() + 1));
    }
    bytes
}

use proptest::prelude::*;

proptest! {
    #[test]
    fn no_client_message_makes_a_conversation_panic(
        first in prop::collection::vec(any::<u8>(), 0..64),
        edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..4),
        cut in prop::option::of(any::<prop::sample::Index>()),
        last in prop::collection::vec(any::<u8>(), 0..64),
    ) {
        let users = rfc_users();
        let _ = Conversation::start(&users, "admin", &first, "S", true);
        let first = mutated(RFC_CLIENT_FIRST, &edits, cut);
        if let Ok((mut conversation, _)) = Conversation::start(&users, "admin", &first, RFC_SERVER_NONCE, false) {
            let _ = conversation.clone().step(&last);
            let final_message = mutated(RFC_CLIENT_FINAL, &edits, cut);
            if conversation.step(&final_message).is_ok() {
                let _ = conversation.step(&last);
            }
        }
    }
}

// The users file.

fn entry_of(user: &str, db: Option<&str>) -> Value {
    let credential =
        Credential::from_password("secret", b"0123456789abcdef", MIN_ITERATIONS).unwrap();
    let mut entry = entry(&UserName::new(user, db.unwrap_or("admin")), &credential);
    if db.is_none() {
        entry.as_object_mut().unwrap().remove("db");
    }
    entry
}

fn problems(text: &str) -> Vec<String> {
    Users::from_json(text).unwrap_err().problems
}

#[test]
fn a_users_file_of_hash_user_entries_is_read_with_admin_as_the_default_database() {
    let file = json!({"users": [entry_of("orders", None), entry_of("orders", Some("shop"))]});
    let users = Users::from_json(&file.to_string()).unwrap();
    assert_eq!(
        users.names().cloned().collect::<Vec<_>>(),
        vec![
            UserName::new("orders", "admin"),
            UserName::new("orders", "shop")
        ]
    );
    let credential = users.get(&UserName::new("orders", "admin")).unwrap();
    assert_eq!(credential.iterations(), MIN_ITERATIONS);
    assert_eq!(
        Some(credential),
        Credential::from_password("secret", b"0123456789abcdef", MIN_ITERATIONS)
            .ok()
            .as_ref()
    );
}

#[test]
fn every_problem_of_a_users_file_is_named_by_its_field() {
    assert_eq!(
        problems("[]"),
        ["the file holds an array, not an object {\"users\": [...]}"]
    );
    assert!(problems("{\"users\": [}")[0].starts_with("not valid JSON: "));
    assert_eq!(
        problems("{\"users\": [], \"extra\": 1}"),
        [
            "extra: unknown field (a users file holds one field, \"users\")",
            "users: empty, so no one could authenticate: add an entry that `reshard front \
                 hash-user NAME` prints"
        ]
    );
    assert_eq!(problems("{}"), ["users: missing (the list of users)"]);

    let mut bad_key = entry_of("a", None);
    bad_key["credentials"][MECHANISM]["storedKey"] = json!("AAAA");
    let mut not_base64 = entry_of("b", None);
    not_base64["credentials"][MECHANISM]["serverKey"] = json!("not base64!");
    let mut few_rounds = entry_of("c", None);
    few_rounds["credentials"][MECHANISM]["iterationCount"] = json!(4096);
    let mut password = entry_of("d", None);
    password["pwd"] = json!("secret");
    let mut sha1 = entry_of("e", None);
    sha1["credentials"]["SCRAM-SHA-1"] = json!({});
    let mut bad_db = entry_of("f", Some("a b"));
    bad_db["credentials"][MECHANISM]["iterations"] = json!(1);
    let file = json!({"users": [
        bad_key, not_base64, few_rounds, password, sha1, bad_db,
        entry_of("g", None), entry_of("g", Some("admin")),
        {"user": "", "credentials": 1}, 7,
    ]});
    let found = problems(&file.to_string());
    let expected = [
        "users[0].credentials.SCRAM-SHA-256.storedKey: 3 bytes, where SCRAM-SHA-256 keys have 32",
        "users[1].credentials.SCRAM-SHA-256.serverKey: not base64",
        "users[2].credentials.SCRAM-SHA-256.iterationCount: 4096: a whole number from 5000",
        "users[3].pwd: a users file holds no password, only stored credentials: make the \
             entry with `reshard front hash-user NAME`",
        "users[4].credentials.SCRAM-SHA-1: unknown mechanism (the front authenticates with \
             SCRAM-SHA-256 only)",
        "users[5].db: ",
        "users[5].credentials.SCRAM-SHA-256.iterations: unknown field",
        "users[7]: a second entry for g@admin",
        "users[8].user: empty",
        "users[8].credentials: a number, not an object",
        "users[9]: a number, not an object",
    ];
    assert_eq!(found.len(), expected.len(), "{found:#?}");
    for (found, expected) in found.iter().zip(expected) {
        assert!(
            found.starts_with(expected),
            "{found:?} does not start with {expected:?}"
        );
    }
    // No problem quotes a key.
    let stored = entry_of("x", None)["credentials"][MECHANISM]["storedKey"].clone();
    assert!(!found.join(" ").contains(stored.as_str().unwrap()));
}
