//! Authentication's pure parts: SCRAM-SHA-256 as MongoDB speaks it, the users file, and what a
//! connection knows of its authentication. No I/O happens here: the handlers
//! (`front::commands::auth`) bring the server's nonce, `reshard front hash-user` the random salt,
//! and `reshard front` the users file's text.
//!
//! SCRAM (RFC 5802, with SHA-256 as RFC 7677 defines it) proves that the client knows the
//! password without sending it, and that the server holds the user's credentials. The server
//! keeps only the salt, the iteration count `i`, `StoredKey = H(ClientKey)` and `ServerKey`,
//! where `SaltedPassword = PBKDF2-HMAC-SHA-256(SASLprep(password), salt, i)`, `ClientKey =
//! HMAC(SaltedPassword, "Client Key")` and `ServerKey = HMAC(SaltedPassword, "Server Key")`.
//! A users file read by someone else lets them log in nowhere (a proof needs `ClientKey`,
//! which `StoredKey` is a hash of), though it lets them try passwords offline, at `i`
//! PBKDF2 rounds a guess, and pose as the front to clients: keep it readable by the front only.
//!
//! MongoDB's specifics, from its server (`sasl_scram_server_conversation.cpp`,
//! `sasl_commands.cpp`), which drivers expect:
//! - the client-first message is answered by the server-first, the client-final by the
//!   server-final; with `skipEmptyExchange` the server-final ends the conversation, without it
//!   the client sends one more, empty, message and the server answers it empty
//!   ([`Conversation::step`]);
//! - channel binding (`p=`) is refused, `y` and `n` accepted, an authorisation identity
//!   (`a=`) must name the user itself, and mandatory extensions (`m=`) are refused;
//! - user names escape `,` and `=` as `=2C` and `=3D` and are compared as written (drivers do
//!   not SASLprep them); passwords are SASLprepped (RFC 4013), by the driver and by
//!   [`Credential::from_password`] alike;
//! - the server's nonce is 24 random bytes in base64, appended to the client's.
//!
//! Why a step failed ([`Failure`]) is for the front's log; the client is only told that it
//! failed, as MongoDB tells it. Nothing here holds or prints a password, and the `Debug` of
//! credentials and conversations shows no key.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use hmac::{Hmac, KeyInit, Mac};
use serde_json::{json, Map, Value};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// The one mechanism the front speaks.
pub const MECHANISM: &str = "SCRAM-SHA-256";

/// The iteration count `reshard front hash-user` uses by default: MongoDB's default for
/// SCRAM-SHA-256 (`scramSHA256IterationCount`).
pub const DEFAULT_ITERATIONS: u32 = 15_000;

/// The smallest iteration count a users file may hold: MongoDB's minimum for SCRAM-SHA-256.
pub const MIN_ITERATIONS: u32 = 5_000;

/// The salt length `reshard front hash-user` draws: MongoDB's for SCRAM-SHA-256 (the hash
/// length less four bytes).
pub const SALT_LEN: usize = 28;

/// The authentication database of a user whose entry names none, as in MongoDB's connection
/// strings (`authSource`).
pub const DEFAULT_DATABASE: &str = "admin";

/// The length of the server's random nonce, in bytes, before base64: MongoDB's.
pub const SERVER_NONCE_LEN: usize = 24;

/// The length of SHA-256 digests and of the keys derived from them.
const KEY_LEN: usize = 32;

type HmacSha256 = Hmac<Sha256>;

/// A user as MongoDB names one: the name and the database the user authenticates against.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct UserName {
    pub user: String,
    pub db: String,
}

impl UserName {
    pub fn new(user: impl Into<String>, db: impl Into<String>) -> UserName {
        UserName {
            user: user.into(),
            db: db.into(),
        }
    }
}

/// `user@db`, as MongoDB's logs write a user.
impl fmt::Display for UserName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{}", self.user, self.db)
    }
}

/// A password SASLprep refuses, or none.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PasswordError {
    #[error("the password is empty")]
    Empty,
    /// SASLprep's reason, without the character it refused (a character of the password).
    #[error("the password cannot be prepared with SASLprep (RFC 4013): {0}")]
    Prohibited(String),
}

/// A user's SCRAM-SHA-256 stored credentials: what the server needs, and no password.
#[derive(Clone, PartialEq, Eq)]
pub struct Credential {
    salt: Vec<u8>,
    iterations: u32,
    stored_key: [u8; KEY_LEN],
    server_key: [u8; KEY_LEN],
}

/// Shows the iteration count and the salt's length, never a key.
impl fmt::Debug for Credential {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credential")
            .field("iterations", &self.iterations)
            .field("salt_len", &self.salt.len())
            .field("stored_key", &"***")
            .field("server_key", &"***")
            .finish()
    }
}

impl Credential {
    /// The credentials of `password` (SASLprepped first) with `salt` and `iterations` rounds.
    pub fn from_password(
        password: &str,
        salt: &[u8],
        iterations: u32,
    ) -> Result<Credential, PasswordError> {
        if password.is_empty() {
            return Err(PasswordError::Empty);
        }
        let prepared = stringprep::saslprep(password).map_err(|error| {
            // SASLprep's message quotes the character it refused: a character of the password.
            let reason = error.to_string();
            PasswordError::Prohibited(if reason.starts_with("prohibited character") {
                "it holds a character SASLprep prohibits (a control character, a private-use \
                 or unassigned code point...)"
                    .to_owned()
            } else {
                reason
            })
        })?;
        let mut salted = [0u8; KEY_LEN];
        // HMAC takes a key of any length, so PBKDF2 cannot refuse the password.
        if pbkdf2::pbkdf2::<HmacSha256>(prepared.as_bytes(), salt, iterations, &mut salted).is_err()
        {
            return Err(PasswordError::Prohibited(
                "PBKDF2 refused it as a key".to_owned(),
            ));
        }
        let client_key = hmac(&salted, b"Client Key");
        Ok(Credential {
            salt: salt.to_vec(),
            iterations,
            stored_key: Sha256::digest(client_key).into(),
            server_key: hmac(&salted, b"Server Key"),
        })
    }

    pub fn iterations(&self) -> u32 {
        self.iterations
    }

    pub fn salt(&self) -> &[u8] {
        &self.salt
    }

    /// The credentials as a users file holds them, in the shape of MongoDB's own
    /// `admin.system.users` (`credentials.SCRAM-SHA-256`).
    pub fn to_json(&self) -> Value {
        json!({
            "iterationCount": self.iterations,
            "salt": BASE64.encode(&self.salt),
            "storedKey": BASE64.encode(self.stored_key),
            "serverKey": BASE64.encode(self.server_key),
        })
    }
}

fn hmac(key: &[u8], message: &[u8]) -> [u8; KEY_LEN] {
    // HMAC takes a key of any length.
    let mut mac = <HmacSha256 as KeyInit>::new_from_slice(key).unwrap_or_else(|_| {
        unreachable!("HMAC-SHA-256 accepts keys of every length");
    });
    mac.update(message);
    mac.finalize().into_bytes().into()
}

/// One entry of a users file, as `reshard front hash-user` prints it.
pub fn entry(name: &UserName, credential: &Credential) -> Value {
    json!({
        "user": name.user,
        "db": name.db,
        "credentials": {MECHANISM: credential.to_json()},
    })
}

// ---------------------------------------------------------------------------------------------
// The users file.

/// The users the front authenticates, by name and database.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Users {
    by_name: BTreeMap<UserName, Credential>,
}

/// Names the users, never their credentials.
impl fmt::Debug for Users {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.by_name.keys()).finish()
    }
}

/// What is wrong with a users file: every problem found, each naming its field.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{}", .problems.join("; "))]
pub struct UsersFileError {
    pub problems: Vec<String>,
}

impl Users {
    pub fn new(entries: impl IntoIterator<Item = (UserName, Credential)>) -> Users {
        Users {
            by_name: entries.into_iter().collect(),
        }
    }

    pub fn get(&self, name: &UserName) -> Option<&Credential> {
        self.by_name.get(name)
    }

    pub fn names(&self) -> impl Iterator<Item = &UserName> {
        self.by_name.keys()
    }

    pub fn len(&self) -> usize {
        self.by_name.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_name.is_empty()
    }

    /// Reads a users file: a JSON object `{"users": [ENTRY, ...]}`, each entry as
    /// `reshard front hash-user` prints it:
    ///
    /// ```json
    /// {"user": "orders", "db": "admin", "credentials": {"SCRAM-SHA-256": {
    ///     "iterationCount": 15000, "salt": "<base64>", "storedKey": "<base64>",
    ///     "serverKey": "<base64>"}}}
    /// ```
    ///
    /// `db` may be left out (`admin`). Every problem is reported at once, each with the path of
    /// its field (`users[1].credentials.SCRAM-SHA-256.storedKey`); unknown fields are
    /// problems too (a misspelt field would otherwise be ignored), and so is a password.
    pub fn from_json(text: &str) -> Result<Users, UsersFileError> {
        let one = |problem: String| UsersFileError {
            problems: vec![problem],
        };
        let value: Value =
            serde_json::from_str(text).map_err(|e| one(format!("not valid JSON: {e}")))?;
        let Value::Object(top) = value else {
            return Err(one(format!(
                "the file holds {}, not an object {{\"users\": [...]}}",
                kind(&value)
            )));
        };
        let mut problems = Vec::new();
        for key in top.keys().filter(|k| *k != "users") {
            problems.push(format!(
                "{key}: unknown field (a users file holds one field, \"users\")"
            ));
        }
        let entries = match top.get("users") {
            None => {
                problems.push("users: missing (the list of users)".to_owned());
                &[][..]
            }
            Some(Value::Array(entries)) => {
                if entries.is_empty() {
                    problems.push(
                        "users: empty, so no one could authenticate: add an entry that \
                         `reshard front hash-user NAME` prints"
                            .to_owned(),
                    );
                }
                &entries[..]
            }
            Some(other) => {
                problems.push(format!("users: {}, not an array of entries", kind(other)));
                &[][..]
            }
        };
        let mut by_name = BTreeMap::new();
        let mut seen = BTreeSet::new();
        for (n, entry) in entries.iter().enumerate() {
            let at = format!("users[{n}]");
            if let Some((name, credential)) = parse_entry(entry, &at, &mut problems) {
                if !seen.insert(name.clone()) {
                    problems.push(format!(
                        "{at}: a second entry for {name} (each user and database once)"
                    ));
                    continue;
                }
                by_name.insert(name, credential);
            }
        }
        if problems.is_empty() {
            Ok(Users { by_name })
        } else {
            Err(UsersFileError { problems })
        }
    }
}

/// What a JSON value is, for messages.
fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn parse_entry(
    entry: &Value,
    at: &str,
    problems: &mut Vec<String>,
) -> Option<(UserName, Credential)> {
    let Value::Object(fields) = entry else {
        problems.push(format!("{at}: {}, not an object", kind(entry)));
        return None;
    };
    let before = problems.len();
    for key in fields.keys() {
        match key.as_str() {
            "user" | "db" | "credentials" => {}
            "pwd" | "password" => problems.push(format!(
                "{at}.{key}: a users file holds no password, only stored credentials: make \
                 the entry with `reshard front hash-user NAME` (it reads the password from \
                 stdin)"
            )),
            _ => problems.push(format!(
                "{at}.{key}: unknown field (an entry holds \"user\", \"db\" and \"credentials\")"
            )),
        }
    }
    let user = match fields.get("user") {
        Some(Value::String(user)) if !user.is_empty() => Some(user.clone()),
        Some(Value::String(_)) => {
            problems.push(format!("{at}.user: empty"));
            None
        }
        Some(other) => {
            problems.push(format!("{at}.user: {}, not a string", kind(other)));
            None
        }
        None => {
            problems.push(format!("{at}.user: missing (the user's name)"));
            None
        }
    };
    let db = match fields.get("db") {
        None => Some(DEFAULT_DATABASE.to_owned()),
        Some(Value::String(db)) => match crate::names::database(db) {
            Ok(()) => Some(db.clone()),
            Err(reason) => {
                problems.push(format!("{at}.db: {reason}"));
                None
            }
        },
        Some(other) => {
            problems.push(format!("{at}.db: {}, not a string", kind(other)));
            None
        }
    };
    let credential = match fields.get("credentials") {
        Some(Value::Object(credentials)) => {
            parse_credentials(credentials, &format!("{at}.credentials"), problems)
        }
        Some(other) => {
            problems.push(format!("{at}.credentials: {}, not an object", kind(other)));
            None
        }
        None => {
            problems.push(format!(
                "{at}.credentials: missing (the user's {MECHANISM} stored credentials)"
            ));
            None
        }
    };
    if problems.len() > before {
        return None;
    }
    Some((UserName::new(user?, db?), credential?))
}

fn parse_credentials(
    credentials: &Map<String, Value>,
    at: &str,
    problems: &mut Vec<String>,
) -> Option<Credential> {
    for key in credentials.keys().filter(|k| *k != MECHANISM) {
        problems.push(format!(
            "{at}.{key}: unknown mechanism (the front authenticates with {MECHANISM} only)"
        ));
    }
    let at = format!("{at}.{MECHANISM}");
    let scram = match credentials.get(MECHANISM) {
        Some(Value::Object(scram)) => scram,
        Some(other) => {
            problems.push(format!("{at}: {}, not an object", kind(other)));
            return None;
        }
        None => {
            problems.push(format!("{at}: missing"));
            return None;
        }
    };
    let before = problems.len();
    for key in scram.keys() {
        if !matches!(
            key.as_str(),
            "iterationCount" | "salt" | "storedKey" | "serverKey"
        ) {
            problems.push(format!(
                "{at}.{key}: unknown field (iterationCount, salt, storedKey, serverKey)"
            ));
        }
    }
    let iterations = match scram.get("iterationCount") {
        Some(Value::Number(n)) => match n.as_u64().map(u32::try_from) {
            Some(Ok(i)) if i >= MIN_ITERATIONS => Some(i),
            _ => {
                problems.push(format!(
                    "{at}.iterationCount: {n}: a whole number from {MIN_ITERATIONS} (MongoDB's \
                     minimum) to {}",
                    u32::MAX
                ));
                None
            }
        },
        Some(other) => {
            problems.push(format!(
                "{at}.iterationCount: {}, not a number",
                kind(other)
            ));
            None
        }
        None => {
            problems.push(format!("{at}.iterationCount: missing"));
            None
        }
    };
    let salt = base64_field(scram, &at, "salt", None, problems);
    let stored_key = base64_field(scram, &at, "storedKey", Some(KEY_LEN), problems);
    let server_key = base64_field(scram, &at, "serverKey", Some(KEY_LEN), problems);
    if problems.len() > before {
        return None;
    }
    Some(Credential {
        salt: salt?,
        iterations: iterations?,
        stored_key: stored_key?.try_into().ok()?,
        server_key: server_key?.try_into().ok()?,
    })
}

/// A base64 field's bytes, of `len` bytes when given, else not empty.
fn base64_field(
    fields: &Map<String, Value>,
    at: &str,
    name: &str,
    len: Option<usize>,
    problems: &mut Vec<String>,
) -> Option<Vec<u8>> {
    let text = match fields.get(name) {
        Some(Value::String(text)) => text,
        Some(other) => {
            problems.push(format!("{at}.{name}: {}, not a base64 string", kind(other)));
            return None;
        }
        None => {
            problems.push(format!("{at}.{name}: missing"));
            return None;
        }
    };
    let Ok(bytes) = BASE64.decode(text) else {
        problems.push(format!("{at}.{name}: not base64"));
        return None;
    };
    match len {
        Some(len) if bytes.len() != len => {
            problems.push(format!(
                "{at}.{name}: {} bytes, where {MECHANISM} keys have {len}",
                bytes.len()
            ));
            None
        }
        None if bytes.is_empty() => {
            problems.push(format!("{at}.{name}: empty"));
            None
        }
        _ => Some(bytes),
    }
}

// ---------------------------------------------------------------------------------------------
// The SCRAM conversation.

/// Why a step of a conversation failed. The client is told only that authentication failed;
/// this is for the log, and quotes nothing of a client-final message (it carries the proof).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Failure {
    #[error("the client's message is not UTF-8")]
    NotUtf8,
    #[error("malformed client-first message: {0}")]
    MalformedFirst(String),
    #[error("the client asked for channel binding, which the front does not support")]
    ChannelBinding,
    #[error("no such user in the users file")]
    UnknownUser,
    #[error("malformed client-final message: {0}")]
    MalformedFinal(String),
    #[error("the client-final message's nonce is not the conversation's")]
    NonceMismatch,
    #[error("the client's proof does not match the stored key (a wrong password)")]
    WrongProof,
    #[error("the conversation's last message must be empty")]
    NotEmpty,
}

/// A client-first message that could not start a conversation, with the user it named when
/// it named one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rejected {
    pub user: Option<UserName>,
    pub reason: Failure,
}

/// Where a conversation stands after a step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// The reply's payload; the conversation goes on (`done: false`).
    Continue(Vec<u8>),
    /// The reply's payload; the connection is now authenticated as `user` (`done: true`).
    Done { payload: Vec<u8>, user: UserName },
}

/// A SCRAM-SHA-256 conversation after its client-first message was answered.
#[derive(Clone, PartialEq, Eq)]
pub struct Conversation {
    user: UserName,
    credential: Credential,
    /// The GS2 header the client sent (`n,,`), which its final message must bind.
    gs2_header: String,
    /// The client's nonce followed by the server's.
    nonce: String,
    /// `client-first-message-bare "," server-first-message`; the client-final message
    /// without its proof completes the AuthMessage both sides sign.
    auth_message: String,
    skip_empty_exchange: bool,
    /// The proof was checked and the server-final sent; the empty message is awaited.
    proved: bool,
}

/// Names the user and the stage, never a key or a nonce.
impl fmt::Debug for Conversation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Conversation")
            .field("user", &self.user)
            .field("skip_empty_exchange", &self.skip_empty_exchange)
            .field("proved", &self.proved)
            .finish()
    }
}

impl Conversation {
    /// Answers a client-first message on authentication database `db` with the
    /// server-first message, drawing on `server_nonce` (printable, without commas: the
    /// handler's base64 of [`SERVER_NONCE_LEN`] random bytes).
    pub fn start(
        users: &Users,
        db: &str,
        client_first: &[u8],
        server_nonce: &str,
        skip_empty_exchange: bool,
    ) -> Result<(Conversation, Vec<u8>), Rejected> {
        let rejected = |user: Option<UserName>, reason| Rejected { user, reason };
        let text =
            std::str::from_utf8(client_first).map_err(|_| rejected(None, Failure::NotUtf8))?;
        let first = ClientFirst::parse(text).map_err(|reason| rejected(None, reason))?;
        let user = UserName::new(first.user, db);
        let Some(credential) = users.get(&user) else {
            return Err(rejected(Some(user), Failure::UnknownUser));
        };
        let nonce = format!("{}{server_nonce}", first.nonce);
        let server_first = format!(
            "r={nonce},s={},i={}",
            BASE64.encode(&credential.salt),
            credential.iterations
        );
        let conversation = Conversation {
            credential: credential.clone(),
            gs2_header: first.gs2_header.to_owned(),
            nonce,
            auth_message: format!("{},{server_first}", first.bare),
            skip_empty_exchange,
            proved: false,
            user,
        };
        Ok((conversation, server_first.into_bytes()))
    }

    /// The user the conversation authenticates.
    pub fn user(&self) -> &UserName {
        &self.user
    }

    /// Answers the client's next message: the client-final message (checked against the
    /// stored key, answered by the server-final), then, without `skipEmptyExchange`, the empty
    /// message that ends the conversation.
    pub fn step(&mut self, payload: &[u8]) -> Result<Step, Failure> {
        if self.proved {
            if !payload.is_empty() {
                return Err(Failure::NotEmpty);
            }
            return Ok(Step::Done {
                payload: Vec::new(),
                user: self.user.clone(),
            });
        }
        let text = std::str::from_utf8(payload).map_err(|_| Failure::NotUtf8)?;
        let malformed = |what: &str| Failure::MalformedFinal(what.to_owned());
        // client-final-message-without-proof "," proof
        let (without_proof, proof) = text
            .rsplit_once(',')
            .ok_or_else(|| malformed("it has no proof"))?;
        let proof = proof
            .strip_prefix("p=")
            .ok_or_else(|| malformed("its last attribute is not the proof (p=)"))?;
        let mut attributes = without_proof.split(',');
        let binding = attributes
            .next()
            .and_then(|a| a.strip_prefix("c="))
            .ok_or_else(|| malformed("its first attribute is not the channel binding (c=)"))?;
        if BASE64.decode(binding).ok().as_deref() != Some(self.gs2_header.as_bytes()) {
            return Err(malformed(
                "its channel binding (c=) is not the client-first message's GS2 header",
            ));
        }
        let nonce = attributes
            .next()
            .and_then(|a| a.strip_prefix("r="))
            .ok_or_else(|| malformed("its second attribute is not the nonce (r=)"))?;
        if nonce != self.nonce {
            return Err(Failure::NonceMismatch);
        }
        let proof = BASE64
            .decode(proof)
            .map_err(|_| malformed("its proof is not base64"))?;
        if proof.len() != KEY_LEN {
            return Err(malformed("its proof is not 32 bytes long"));
        }
        let auth_message = format!("{},{without_proof}", self.auth_message);
        let client_signature = hmac(&self.credential.stored_key, auth_message.as_bytes());
        let mut client_key = [0u8; KEY_LEN];
        for (key, (signature, proof)) in client_key
            .iter_mut()
            .zip(client_signature.iter().zip(&proof))
        {
            *key = signature ^ proof;
        }
        let stored_key: [u8; KEY_LEN] = Sha256::digest(client_key).into();
        if !bool::from(stored_key.ct_eq(&self.credential.stored_key)) {
            return Err(Failure::WrongProof);
        }
        let server_signature = hmac(&self.credential.server_key, auth_message.as_bytes());
        let server_final = format!("v={}", BASE64.encode(server_signature)).into_bytes();
        if self.skip_empty_exchange {
            return Ok(Step::Done {
                payload: server_final,
                user: self.user.clone(),
            });
        }
        self.proved = true;
        Ok(Step::Continue(server_final))
    }
}

/// A parsed client-first message.
struct ClientFirst<'a> {
    /// `gs2-cbind-flag "," [authzid] ","`.
    gs2_header: &'a str,
    /// `client-first-message-bare`: what the AuthMessage starts with.
    bare: &'a str,
    user: String,
    nonce: &'a str,
}

impl<'a> ClientFirst<'a> {
    fn parse(text: &'a str) -> Result<ClientFirst<'a>, Failure> {
        let malformed = |what: String| Failure::MalformedFirst(what);
        let (flag, rest) = text
            .split_once(',')
            .ok_or_else(|| malformed("it has no GS2 header".into()))?;
        if flag.starts_with("p=") {
            return Err(Failure::ChannelBinding);
        }
        if flag != "n" && flag != "y" {
            return Err(malformed(format!(
                "its channel-binding flag is {flag:?}, not \"n\" or \"y\""
            )));
        }
        let (authzid, bare) = rest
            .split_once(',')
            .ok_or_else(|| malformed("its GS2 header does not end".into()))?;
        let gs2_header = &text[..flag.len() + authzid.len() + 2];
        if bare.starts_with("m=") {
            return Err(malformed(
                "it has a mandatory extension (m=), which the front does not support".into(),
            ));
        }
        let mut attributes = bare.split(',');
        let user = attributes
            .next()
            .and_then(|a| a.strip_prefix("n="))
            .filter(|u| !u.is_empty())
            .ok_or_else(|| malformed("its first attribute is not a user name (n=)".into()))?;
        let user = decode_name(user)
            .ok_or_else(|| malformed("its user name has an '=' other than =2C or =3D".into()))?;
        let nonce = attributes
            .next()
            .and_then(|a| a.strip_prefix("r="))
            .filter(|n| !n.is_empty() && n.bytes().all(|b| (0x21..=0x7e).contains(&b)))
            .ok_or_else(|| {
                malformed("its second attribute is not a nonce of printable characters (r=)".into())
            })?;
        if !authzid.is_empty() {
            let authzid = authzid
                .strip_prefix("a=")
                .and_then(decode_name)
                .ok_or_else(|| malformed("its authorization identity is not a=NAME".into()))?;
            if authzid != user {
                return Err(malformed(format!(
                    "its authorization identity {authzid:?} is not its user {user:?}"
                )));
            }
        }
        Ok(ClientFirst {
            gs2_header,
            bare,
            user,
            nonce,
        })
    }
}

/// A SCRAM `saslname`: `=2C` stands for `,` and `=3D` for `=`; any other `=` is malformed.
fn decode_name(name: &str) -> Option<String> {
    let mut out = String::with_capacity(name.len());
    let mut rest = name;
    while let Some(at) = rest.find('=') {
        out.push_str(&rest[..at]);
        let escape = rest.get(at..at + 3)?;
        out.push(match escape {
            "=2C" => ',',
            "=3D" => '=',
            _ => return None,
        });
        rest = &rest[at + 3..];
    }
    out.push_str(rest);
    Some(out)
}

// ---------------------------------------------------------------------------------------------
// A connection's authentication.

/// What a connection knows of its authentication: the user it authenticated as, and the
/// conversation under way. A new `saslStart` abandons a conversation under way; a failed step
/// ends it; a finished one authenticates the connection (replacing the user it had, if any: the
/// client has just proved the new identity).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Authentication {
    user: Option<UserName>,
    conversation: Option<Conversation>,
}

/// Why a `saslContinue` could not continue.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ContinueError {
    /// No conversation is under way on the connection.
    NoConversation,
    /// The step failed; the conversation (of this user) is over.
    Failed { user: UserName, reason: Failure },
}

impl Authentication {
    /// The user the connection authenticated as.
    pub fn user(&self) -> Option<&UserName> {
        self.user.as_ref()
    }

    pub fn is_authenticated(&self) -> bool {
        self.user.is_some()
    }

    /// Whether a conversation is under way.
    pub fn in_conversation(&self) -> bool {
        self.conversation.is_some()
    }

    /// Starts `conversation`, abandoning the one under way.
    pub fn begin(&mut self, conversation: Conversation) {
        self.conversation = Some(conversation);
    }

    /// Abandons the conversation under way, if any.
    pub fn abandon(&mut self) {
        self.conversation = None;
    }

    /// Answers the next message of the conversation under way.
    pub fn step(&mut self, payload: &[u8]) -> Result<Step, ContinueError> {
        let conversation = self
            .conversation
            .as_mut()
            .ok_or(ContinueError::NoConversation)?;
        match conversation.step(payload) {
            Ok(Step::Continue(reply)) => Ok(Step::Continue(reply)),
            Ok(Step::Done { payload, user }) => {
                self.conversation = None;
                self.user = Some(user.clone());
                Ok(Step::Done { payload, user })
            }
            Err(reason) => {
                let user = conversation.user.clone();
                self.conversation = None;
                Err(ContinueError::Failed { user, reason })
            }
        }
    }
}

#[cfg(test)]
pub(crate) mod tests;
