//! The front's authentication (SCRAM-SHA-256, users from a users file) and TLS against clients
//! we did not write: the official Rust driver, pymongo, the Node driver and mongosh each
//! authenticate with the right password (then `ping`, `buildInfo`, `getCmdLineOpts` work and
//! `connectionStatus` names the user), are refused `AuthenticationFailed` (18) with a wrong one,
//! and `Unauthorized` (13) for a command that needs authentication without credentials
//! (`ping` and `buildInfo` still answer, as MongoDB's do). The users file is made by
//! `reshard front hash-user`, with a password that SASLprep changes (a soft hyphen, which it
//! removes), so every client's SASLprep is exercised too. Drivers authenticate speculatively
//! (inside `hello`); a front whose `hello` answers no speculation shows they fall back to
//! `saslStart`. Then TLS, with a certificate authority and a server certificate made here
//! (rcgen): every client over TLS, and a client without TLS refused. Then `reshard front` as a
//! process with `--users-file` and `--tls-*`, and its refusals of bad files (exit 2).
//!
//! pymongo comes from `<repo>/.venv`, the Node driver and mongosh from
//! `tests/clients/node_modules`: `scripts/install-secantus.sh` installs both.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bson::{doc, Bson};
use mongodb::error::ErrorKind;
use mongodb::Client;
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, KeyUsagePurpose};
use reshard::front::auth::Users;
use reshard::front::tls::Tls;
use reshard::front::{Command, Context, Dispatch, Front, Handler, Reply, Settings, Spec, Stats};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

#[path = "support/clients.rs"]
mod clients;
use clients::{root, run_client};

/// The user's password: SASLprep removes the soft hyphen (U+00AD), so a client that did not
/// prepare it would send a wrong proof. A space, non-ASCII letters and a snowman besides.
const PASSWORD: &str = "p\u{e2}ss\u{ad}w\u{f6}rd \u{2603}";
const USER: &str = "orders";

/// `text` percent-encoded for a connection string's user information.
fn encoded(text: &str) -> String {
    text.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// Runs `reshard front hash-user NAME` with `password` on stdin and returns what it printed
/// and its exit code.
fn hash_user(name: &str, password: &str, extra: &[&str]) -> (String, String, i32) {
    use std::io::Write;
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_reshard"))
        .args(["front", "hash-user", name])
        .args(extra)
        .env_remove("RESHARD_LOG")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(password.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        out.status.code().unwrap_or(-1),
    )
}

/// A users file with [`USER`] (authentication database `admin`) made by `hash-user`, in `dir`.
fn users_file(dir: &Path) -> PathBuf {
    let (stdout, stderr, code) =
        hash_user(USER, &format!("{PASSWORD}\n"), &["--iterations", "5000"]);
    assert_eq!(code, 0, "{stderr}");
    let entry: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    let path = dir.join("users.json");
    std::fs::write(&path, serde_json::json!({"users": [entry]}).to_string()).unwrap();
    path
}

fn users(dir: &Path) -> Arc<Users> {
    let text = std::fs::read_to_string(users_file(dir)).unwrap();
    Arc::new(Users::from_json(&text).unwrap())
}

/// A front serving on a free port of this machine, inside the test's runtime.
struct RunningFront {
    addr: std::net::SocketAddr,
    front: Arc<Front>,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
    /// Connection-string options after the host (`tls=true&tlsCAFile=...` over TLS).
    options: String,
}

impl RunningFront {
    async fn start(settings: Settings, dispatch: Dispatch) -> RunningFront {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let front = Arc::new(Front::with_dispatch(settings, dispatch));
        let (stop, shutdown) = watch::channel(false);
        let task = tokio::spawn(reshard::front::serve(
            listener,
            Arc::clone(&front),
            shutdown,
        ));
        RunningFront {
            addr,
            front,
            stop,
            task,
            options: "serverSelectionTimeoutMS=5000".to_owned(),
        }
    }

    async fn with_users(users: Arc<Users>) -> RunningFront {
        let settings = Settings {
            users: Some(users),
            ..Settings::default()
        };
        RunningFront::start(settings, Dispatch::standard()).await
    }

    /// The connection string, with `user:password@` when given.
    fn uri(&self, credentials: Option<(&str, &str)>) -> String {
        let userinfo = credentials.map_or_else(String::new, |(user, password)| {
            format!("{}:{}@", encoded(user), encoded(password))
        });
        format!("mongodb://{userinfo}{}/?{}", self.addr, self.options)
    }

    /// The right password, a wrong one, none.
    fn uris(&self) -> [String; 3] {
        [
            self.uri(Some((USER, PASSWORD))),
            self.uri(Some((USER, "p\u{e2}ssw\u{f6}rd \u{2604}"))),
            self.uri(None),
        ]
    }

    async fn stop(self) -> Stats {
        self.stop.send(true).unwrap();
        tokio::time::timeout(Duration::from_secs(10), self.task)
            .await
            .expect("the front stops within 10 s of its shutdown signal")
            .unwrap()
            .unwrap();
        self.front.stats()
    }
}

/// The server error behind a driver's error: the Rust driver reports a failed authentication
/// as an authentication error whose source is the server's answer.
fn server_error(error: &mongodb::error::Error) -> Option<(i32, String, String)> {
    let mut current: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(e) = current {
        // The driver's error is its own source's type, boxed.
        let driver_error = e
            .downcast_ref::<mongodb::error::Error>()
            .or_else(|| e.downcast_ref::<Box<mongodb::error::Error>>().map(|b| &**b));
        if let Some(ErrorKind::Command(c)) = driver_error.map(|e| &*e.kind) {
            return Some((c.code, c.code_name.clone(), c.message.clone()));
        }
        current = e.source();
    }
    None
}

fn is_error(value: &serde_json::Value, code: i64, code_name: &str, errmsg: &str) -> bool {
    value["code"].as_i64() == Some(code)
        && value["codeName"] == code_name
        && value["errmsg"] == errmsg
}

/// What every client must have been answered (`probe` is the JSON a probe printed).
fn check_auth_probe(probe: &serde_json::Value) {
    let client = probe["client"].as_str().unwrap_or("a client");
    let context = format!("{client}: {probe}");
    let good = &probe["good"];
    assert_eq!(good["ping"].as_f64(), Some(1.0), "{context}");
    assert_eq!(good["buildInfo"], "7.0.0", "{context}");
    assert_eq!(
        good["users"],
        serde_json::json!([{"user": USER, "db": "admin"}]),
        "{context}"
    );
    assert_eq!(good["getCmdLineOpts"].as_f64(), Some(1.0), "{context}");
    assert!(
        is_error(
            &probe["bad"],
            18,
            "AuthenticationFailed",
            "Authentication failed."
        ),
        "{context}"
    );
    let none = &probe["none"];
    assert_eq!(none["ping"].as_f64(), Some(1.0), "{context}");
    assert_eq!(none["buildInfo"], "7.0.0", "{context}");
    assert!(
        is_error(
            &none["getCmdLineOpts"],
            13,
            "Unauthorized",
            "command getCmdLineOpts requires authentication"
        ),
        "{context}"
    );
}

async fn pymongo_probe(front: &RunningFront) -> serde_json::Value {
    let [good, bad, none] = front.uris();
    let script = root().join("tests/clients/pymongo_auth_probe.py");
    run_client(
        &root().join(".venv/bin/python"),
        &[script.to_str().unwrap(), &good, &bad, &none],
        &[],
        "pymongo in .venv",
    )
    .await
}

async fn node_probe(front: &RunningFront) -> serde_json::Value {
    let [good, bad, none] = front.uris();
    let script = root().join("tests/clients/node_auth_probe.mjs");
    assert!(
        root().join("tests/clients/node_modules/mongodb").exists(),
        "the Node driver is missing: run scripts/install-secantus.sh"
    );
    run_client(
        Path::new("/usr/bin/env"),
        &["node", script.to_str().unwrap(), &good, &bad, &none],
        &[],
        "the Node driver in tests/clients",
    )
    .await
}

async fn mongosh_probe(front: &RunningFront) -> serde_json::Value {
    let [good, bad, none] = front.uris();
    let script = root().join("tests/clients/mongosh_auth_probe.js");
    let probe = run_client(
        &root().join("tests/clients/node_modules/.bin/mongosh"),
        &[
            "--nodb",
            "--quiet",
            "--norc",
            "--file",
            script.to_str().unwrap(),
        ],
        &[
            ("GOOD_URI", &good),
            ("BAD_URI", &bad),
            ("NONE_URI", &none),
            ("AUTH_USER", USER),
            ("AUTH_PASSWORD", PASSWORD),
        ],
        "mongosh in tests/clients",
    )
    .await;
    // db.auth() on the connection that had no credentials authenticates it.
    let context = probe.to_string();
    assert_eq!(probe["dbAuth"]["auth"].as_f64(), Some(1.0), "{context}");
    assert_eq!(
        probe["dbAuth"]["users"],
        serde_json::json!([{"user": USER, "db": "admin"}]),
        "{context}"
    );
    assert_eq!(
        probe["dbAuth"]["getCmdLineOpts"].as_f64(),
        Some(1.0),
        "{context}"
    );
    probe
}

/// The Rust driver's part of a probe, checked as the others' are.
async fn rust_probe(front: &RunningFront) -> serde_json::Value {
    let [good, bad, none] = front.uris();
    let good = Client::with_uri_str(good).await.unwrap();
    let admin = good.database("admin");
    let status = admin
        .run_command(doc! {"connectionStatus": 1})
        .await
        .unwrap();
    let users = bson::from_bson::<serde_json::Value>(Bson::Array(
        status
            .get_document("authInfo")
            .unwrap()
            .get_array("authenticatedUsers")
            .unwrap()
            .clone(),
    ))
    .unwrap();
    let ok = |reply: bson::Document| reply.get_f64("ok").unwrap();
    let good_part = serde_json::json!({
        "ping": ok(admin.run_command(doc! {"ping": 1}).await.unwrap()),
        "buildInfo": admin.run_command(doc! {"buildInfo": 1}).await.unwrap().get_str("version").unwrap(),
        "users": users,
        "getCmdLineOpts": ok(admin.run_command(doc! {"getCmdLineOpts": 1}).await.unwrap()),
    });
    let error_of = |error: mongodb::error::Error| {
        let (code, code_name, errmsg) =
            server_error(&error).unwrap_or_else(|| panic!("no server error in {error:?}"));
        serde_json::json!({"code": code, "codeName": code_name, "errmsg": errmsg})
    };
    let bad = Client::with_uri_str(bad).await.unwrap();
    let bad_part = error_of(
        bad.database("admin")
            .run_command(doc! {"ping": 1})
            .await
            .unwrap_err(),
    );
    let none = Client::with_uri_str(none).await.unwrap();
    let admin = none.database("admin");
    let none_part = serde_json::json!({
        "ping": ok(admin.run_command(doc! {"ping": 1}).await.unwrap()),
        "buildInfo": admin.run_command(doc! {"buildInfo": 1}).await.unwrap().get_str("version").unwrap(),
        "getCmdLineOpts": error_of(admin.run_command(doc! {"getCmdLineOpts": 1}).await.unwrap_err()),
    });
    serde_json::json!({"client": "mongodb (Rust)", "good": good_part, "bad": bad_part, "none": none_part})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rust_driver_authenticates_with_the_right_password_only() {
    let dir = tempfile::tempdir().unwrap();
    let front = RunningFront::with_users(users(dir.path())).await;
    check_auth_probe(&rust_probe(&front).await);

    // A user the file does not hold fails as a wrong password does (not as a missing
    // mechanism), and SCRAM-SHA-1 asked for by name is not enabled.
    let nobody = Client::with_uri_str(front.uri(Some(("nobody", PASSWORD))))
        .await
        .unwrap();
    let error = nobody
        .database("admin")
        .run_command(doc! {"ping": 1})
        .await
        .unwrap_err();
    assert_eq!(server_error(&error).map(|e| e.0), Some(18), "{error:?}");
    let sha1 = Client::with_uri_str(format!(
        "{}&authMechanism=SCRAM-SHA-1",
        front.uri(Some((USER, PASSWORD)))
    ))
    .await
    .unwrap();
    let error = sha1
        .database("admin")
        .run_command(doc! {"ping": 1})
        .await
        .unwrap_err();
    assert_eq!(
        server_error(&error),
        Some((
            334,
            "MechanismUnavailable".to_owned(),
            "Received authentication for mechanism SCRAM-SHA-1 which is not enabled".to_owned()
        )),
        "{error:?}"
    );
    drop((nobody, sha1));
    let stats = front.stop().await;
    assert_eq!((stats.refused, stats.panics), (0, 0), "{stats:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pymongo_authenticates_with_the_right_password_only() {
    let dir = tempfile::tempdir().unwrap();
    let front = RunningFront::with_users(users(dir.path())).await;
    check_auth_probe(&pymongo_probe(&front).await);
    let stats = front.stop().await;
    assert_eq!((stats.refused, stats.panics), (0, 0), "{stats:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_node_driver_authenticates_with_the_right_password_only() {
    let dir = tempfile::tempdir().unwrap();
    let front = RunningFront::with_users(users(dir.path())).await;
    check_auth_probe(&node_probe(&front).await);
    let stats = front.stop().await;
    assert_eq!((stats.refused, stats.panics), (0, 0), "{stats:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mongosh_authenticates_with_the_right_password_only() {
    let dir = tempfile::tempdir().unwrap();
    let front = RunningFront::with_users(users(dir.path())).await;
    check_auth_probe(&mongosh_probe(&front).await);
    let stats = front.stop().await;
    assert_eq!((stats.refused, stats.panics), (0, 0), "{stats:?}");
}

// ---------------------------------------------------------------------------------------------
// Speculative authentication, and the fall-back without it.

/// The standard table's synchronous handler of `name`.
fn standard(name: &str) -> fn(&mut Context<'_>, &Command) -> Reply {
    let spec = reshard::front::commands::COMMANDS
        .iter()
        .find(|spec| spec.name == name)
        .unwrap_or_else(|| panic!("no {name} in the table"));
    match spec.handler {
        Handler::Sync(handler) => handler,
        Handler::Async(_) => panic!("{name} is asynchronous"),
    }
}

/// The standard table with some rows replaced.
fn table(replaced: Vec<Spec>) -> Dispatch {
    let specs: Vec<Spec> = reshard::front::commands::COMMANDS
        .iter()
        .map(|spec| {
            *replaced
                .iter()
                .find(|r| r.name == spec.name)
                .unwrap_or(spec)
        })
        .collect();
    Dispatch::new(Box::leak(specs.into_boxed_slice()))
}

static SPECULATIVE_ANSWERS: AtomicU64 = AtomicU64::new(0);
static SASL_STARTS_WITH_SPECULATION: AtomicU64 = AtomicU64::new(0);
static SASL_STARTS_WITHOUT_SPECULATION: AtomicU64 = AtomicU64::new(0);

/// A handshake handler that counts the speculative answers it gave.
fn counting(name: &str, context: &mut Context<'_>, command: &Command) -> Reply {
    let reply = standard(name)(context, command)?;
    if reply.contains_key("speculativeAuthenticate") {
        SPECULATIVE_ANSWERS.fetch_add(1, Ordering::Relaxed);
    }
    Ok(reply)
}

/// A handshake handler that never answers a speculative authentication: a server that does
/// not support it.
fn ignoring(name: &str, context: &mut Context<'_>, command: &Command) -> Reply {
    let mut command = command.clone();
    command.body.remove("speculativeAuthenticate");
    standard(name)(context, &command)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drivers_authenticate_speculatively_and_fall_back_to_sasl_start_without_it() {
    let dir = tempfile::tempdir().unwrap();
    let users = users(dir.path());
    let settings = Settings {
        users: Some(users),
        ..Settings::default()
    };

    // The standard handshake answers the speculative saslStart: the driver then continues
    // with saslContinue and sends no saslStart.
    let speculating = RunningFront::start(
        settings.clone(),
        table(vec![
            Spec::handshake("hello", |c, m| counting("hello", c, m)),
            Spec::handshake("isMaster", |c, m| counting("isMaster", c, m)),
            Spec::handshake("ismaster", |c, m| counting("ismaster", c, m)),
            Spec::sync("saslStart", |c, m| {
                SASL_STARTS_WITH_SPECULATION.fetch_add(1, Ordering::Relaxed);
                standard("saslStart")(c, m)
            }),
        ]),
    )
    .await;
    check_auth_probe(&rust_probe(&speculating).await);
    check_auth_probe(&pymongo_probe(&speculating).await);
    assert!(SPECULATIVE_ANSWERS.load(Ordering::Relaxed) >= 2);
    assert_eq!(SASL_STARTS_WITH_SPECULATION.load(Ordering::Relaxed), 0);
    speculating.stop().await;

    // A handshake that answers no speculation: drivers authenticate through saslStart.
    let plain = RunningFront::start(
        settings,
        table(vec![
            Spec::handshake("hello", |c, m| ignoring("hello", c, m)),
            Spec::handshake("isMaster", |c, m| ignoring("isMaster", c, m)),
            Spec::handshake("ismaster", |c, m| ignoring("ismaster", c, m)),
            Spec::sync("saslStart", |c, m| {
                SASL_STARTS_WITHOUT_SPECULATION.fetch_add(1, Ordering::Relaxed);
                standard("saslStart")(c, m)
            }),
        ]),
    )
    .await;
    check_auth_probe(&rust_probe(&plain).await);
    check_auth_probe(&pymongo_probe(&plain).await);
    // The right and the wrong password of each driver at least.
    assert!(SASL_STARTS_WITHOUT_SPECULATION.load(Ordering::Relaxed) >= 4);
    let stats = plain.stop().await;
    assert_eq!((stats.refused, stats.panics), (0, 0), "{stats:?}");
}

// ---------------------------------------------------------------------------------------------
// TLS.

/// A certificate authority, and a server certificate it signed for `localhost` and
/// `127.0.0.1`, as PEM files in a directory of their own.
struct Certificates {
    dir: tempfile::TempDir,
}

impl Certificates {
    fn new() -> Certificates {
        let dir = tempfile::tempdir().unwrap();
        let ca_key = KeyPair::generate().unwrap();
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name
            .push(DnType::CommonName, "reshard front test CA");
        ca.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca = ca.self_signed(&ca_key).unwrap();
        let key = KeyPair::generate().unwrap();
        let mut server =
            CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()]).unwrap();
        server
            .distinguished_name
            .push(DnType::CommonName, "localhost");
        server.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        server.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
        let server = server.signed_by(&key, &ca, &ca_key).unwrap();
        std::fs::write(dir.path().join("ca.pem"), ca.pem()).unwrap();
        std::fs::write(dir.path().join("server.pem"), server.pem()).unwrap();
        std::fs::write(dir.path().join("server.key"), key.serialize_pem()).unwrap();
        Certificates { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn tls(&self) -> Tls {
        let read = |name| std::fs::read(self.path(name)).unwrap();
        Tls::from_pem(&read("server.pem"), &read("server.key")).unwrap()
    }

    /// What a client's connection string adds to trust the test authority.
    fn client_options(&self) -> String {
        format!(
            "serverSelectionTimeoutMS=5000&tls=true&tlsCAFile={}",
            self.path("ca.pem").display()
        )
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_client_authenticates_over_tls_and_a_client_without_tls_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let certificates = Certificates::new();
    let settings = Settings {
        users: Some(users(dir.path())),
        tls: Some(certificates.tls()),
        ..Settings::default()
    };
    let mut front = RunningFront::start(settings, Dispatch::standard()).await;
    front.options = certificates.client_options();
    check_auth_probe(&rust_probe(&front).await);
    check_auth_probe(&pymongo_probe(&front).await);
    check_auth_probe(&node_probe(&front).await);
    check_auth_probe(&mongosh_probe(&front).await);
    assert_eq!(front.front.stats().refused, 0);

    // A client without TLS: its ping is not a TLS handshake, and the front closes the
    // connection without a MongoDB reply (a TLS alert at most), counted as refused.
    let mut stream = TcpStream::connect(front.addr).await.unwrap();
    let ping = reshard::front::wire::Message {
        request_id: 1,
        response_to: 0,
        op: reshard::front::wire::Op::Msg(reshard::front::wire::OpMsg {
            flags: reshard::front::wire::MsgFlags(0),
            sections: vec![reshard::front::wire::Section::Body(
                doc! {"ping": 1, "$db": "admin"},
            )],
        }),
    }
    .encode()
    .unwrap();
    stream.write_all(&ping).await.unwrap();
    let mut received = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut received))
        .await
        .expect("the front closes a connection without TLS");
    assert!(
        read.is_err() || received.first() == Some(&0x15) || received.is_empty(),
        "a TLS alert or nothing, not a reply: {received:?}"
    );
    // The Rust driver without TLS finds no server.
    let plain = Client::with_uri_str(format!(
        "mongodb://{}/?serverSelectionTimeoutMS=1500",
        front.addr
    ))
    .await
    .unwrap();
    let error = plain
        .database("admin")
        .run_command(doc! {"ping": 1})
        .await
        .unwrap_err();
    assert!(
        matches!(&*error.kind, ErrorKind::ServerSelection { .. }),
        "{error}"
    );
    drop(plain);
    let stats = front.stop().await;
    assert!(stats.refused >= 2, "{stats:?}");
    assert_eq!(stats.panics, 0, "{stats:?}");
}

// ---------------------------------------------------------------------------------------------
// `reshard front` and `reshard front hash-user` as an operator runs them.

#[test]
fn hash_user_reads_the_password_from_stdin_and_prints_stored_credentials_only() {
    let (stdout, stderr, code) = hash_user("app", "pencil\r\n", &["--db", "shop"]);
    assert_eq!(code, 0, "{stderr}");
    assert!(!stdout.contains("pencil") && !stderr.contains("pencil"));
    let entry: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(entry["user"], "app");
    assert_eq!(entry["db"], "shop");
    let scram = &entry["credentials"]["SCRAM-SHA-256"];
    assert_eq!(scram["iterationCount"], 15000);
    let users = Users::from_json(&serde_json::json!({"users": [entry]}).to_string()).unwrap();
    assert_eq!(users.len(), 1);
    // Two entries of one password differ: each has a salt of its own.
    let (again, _, _) = hash_user("app", "pencil\n", &["--db", "shop"]);
    assert_ne!(stdout, again);

    for (password, extra, expected) in [
        ("", &[][..], "no password on stdin"),
        ("\n", &[][..], "no password on stdin"),
        ("a\u{7}b", &[][..], "SASLprep"),
        (
            "pencil",
            &["--db", "a.b"][..],
            "--db: database name \"a.b\"",
        ),
        (
            "pencil",
            &["--iterations", "4096"][..],
            "4096 is not in 5000",
        ),
    ] {
        let (stdout, stderr, code) = hash_user("app", password, extra);
        assert_eq!(code, 2, "{password:?} {extra:?}: {stdout} {stderr}");
        assert!(stderr.contains(expected), "{stderr}");
        assert!(stdout.is_empty(), "{stdout}");
    }
}

fn free_port() -> u16 {
    let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    probe.local_addr().unwrap().port()
}

fn reshard_front(args: &[&str]) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_reshard"));
    command
        .arg("front")
        .args(args)
        .env_remove("RESHARD_DATABASE_URL")
        .env_remove("DATABASE_URL")
        .env_remove("RESHARD_LOG")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    command
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reshard_front_with_users_and_tls_serves_authenticated_clients_over_tls() {
    let dir = tempfile::tempdir().unwrap();
    let users = users_file(dir.path());
    let certificates = Certificates::new();
    let port = free_port();
    let child = reshard_front(&[
        "--listen",
        &format!("127.0.0.1:{port}"),
        "--users-file",
        users.to_str().unwrap(),
        "--tls-cert-file",
        certificates.path("server.pem").to_str().unwrap(),
        "--tls-key-file",
        certificates.path("server.key").to_str().unwrap(),
    ])
    .spawn()
    .unwrap();
    let uri = format!(
        "mongodb://{USER}:{}@localhost:{port}/?serverSelectionTimeoutMS=10000&tls=true&tlsCAFile={}",
        encoded(PASSWORD),
        certificates.path("ca.pem").display()
    );
    let client = Client::with_uri_str(uri).await.unwrap();
    let admin = client.database("admin");
    admin.run_command(doc! {"ping": 1}).await.unwrap();
    let options = admin.run_command(doc! {"getCmdLineOpts": 1}).await.unwrap();
    let argv = options.get_array("argv").unwrap();
    assert!(
        argv.contains(&Bson::from(users.to_str().unwrap())),
        "{options}"
    );
    drop(client);
    let wrong = Client::with_uri_str(format!(
        "mongodb://{USER}:not-it@localhost:{port}/?serverSelectionTimeoutMS=10000&tls=true&tlsCAFile={}",
        certificates.path("ca.pem").display()
    ))
    .await
    .unwrap();
    let error = wrong
        .database("admin")
        .run_command(doc! {"ping": 1})
        .await
        .unwrap_err();
    assert_eq!(server_error(&error).map(|e| e.0), Some(18), "{error:?}");
    drop(wrong);

    let pid = i32::try_from(child.id().unwrap()).unwrap();
    // SAFETY: sending a signal to the child this test started and still holds.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let out = tokio::time::timeout(Duration::from_secs(20), child.wait_with_output())
        .await
        .expect("reshard front exits within 20 s of SIGTERM")
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{}\n{stdout}\n{stderr}", out.status);
    assert!(stderr.contains("authentication=SCRAM-SHA-256"), "{stderr}");
    assert!(stderr.contains("?tls=true"), "{stderr}");
    // The failed attempt is logged with its user and reason, and nothing of its messages: no
    // password, no nonce, no proof.
    let failure = stderr
        .lines()
        .find(|l| l.contains("front: authentication failed"))
        .unwrap_or_else(|| panic!("no failed authentication logged: {stderr}"));
    assert!(failure.contains("user=orders@admin"), "{failure}");
    assert!(failure.contains("a wrong password"), "{failure}");
    for secret in [PASSWORD, "not-it", "c=biws", ",p=", ",r="] {
        assert!(
            !stderr.contains(secret) && !stdout.contains(secret),
            "{secret}: {stderr}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reshard_front_refuses_a_bad_users_file_or_certificate_naming_the_file_and_field() {
    let dir = tempfile::tempdir().unwrap();
    let good_users = users_file(dir.path());
    let bad_users = dir.path().join("bad-users.json");
    let mut entry: serde_json::Value =
        serde_json::from_str(&hash_user("app", "pencil", &[]).0).unwrap();
    entry["credentials"]["SCRAM-SHA-256"]["storedKey"] = serde_json::json!("AAAA");
    entry["password"] = serde_json::json!("pencil");
    std::fs::write(
        &bad_users,
        serde_json::json!({"users": [entry]}).to_string(),
    )
    .unwrap();
    let missing = dir.path().join("missing.json");
    let certificates = Certificates::new();
    let listen = format!("127.0.0.1:{}", free_port());
    let path = |p: &Path| p.to_str().unwrap().to_owned();
    let cases: Vec<(Vec<String>, Vec<String>)> = vec![
        (
            vec!["--users-file".into(), path(&bad_users)],
            vec![
                format!("--users-file {}:", bad_users.display()),
                "users[0].password: a users file holds no password".into(),
                "users[0].credentials.SCRAM-SHA-256.storedKey: 3 bytes".into(),
            ],
        ),
        (
            vec!["--users-file".into(), path(&missing)],
            vec![format!(
                "--users-file {}: cannot read it",
                missing.display()
            )],
        ),
        (
            vec![
                "--users-file".into(),
                path(&good_users),
                "--tls-cert-file".into(),
                path(&certificates.path("server.key")),
                "--tls-key-file".into(),
                path(&certificates.path("server.key")),
            ],
            vec!["holds no PEM certificate".into()],
        ),
        (
            vec![
                "--tls-cert-file".into(),
                path(&certificates.path("server.pem")),
                "--tls-key-file".into(),
                path(&certificates.path("ca.pem")),
            ],
            vec!["holds no PEM private key".into()],
        ),
        (
            vec![
                "--tls-cert-file".into(),
                path(&certificates.path("server.pem")),
            ],
            vec!["--tls-key-file".into()],
        ),
    ];
    for (args, expected) in cases {
        let mut all = vec!["--listen".to_owned(), listen.clone()];
        all.extend(args.iter().cloned());
        let all: Vec<&str> = all.iter().map(String::as_str).collect();
        let out = tokio::time::timeout(Duration::from_secs(20), reshard_front(&all).output())
            .await
            .expect("reshard front refuses at once")
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        for expected in expected {
            assert!(
                stderr.contains(&expected),
                "{args:?}: {expected:?} in {stderr}"
            );
        }
        assert!(!stderr.contains("pencil"), "{stderr}");
        assert!(!stderr.contains("listening"), "{stderr}");
    }
}
