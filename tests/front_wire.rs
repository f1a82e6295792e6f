//! The front against clients we did not write: the official Rust driver, pymongo, the Node
//! driver and mongosh each connect (with their own handshake: the legacy `isMaster` over
//! `OP_QUERY` or `hello` over `OP_MSG`), run `ping`, `hello` and `buildInfo`, and get
//! `CommandNotFound` (59) for a command the front does not know. Then `reshard front` as a
//! process, stopped by SIGTERM; and a wire fuzz: seeded random and mutated messages into a live
//! front, which never panics, closes only the offending connection, and keeps answering a
//! well-behaved client meanwhile.
//!
//! pymongo comes from `<repo>/.venv`, the Node driver and mongosh from
//! `tests/clients/node_modules`: `scripts/install-secantus.sh` installs both (`scripts/test`
//! runs it first).
//!
//! The fuzz prints its seed; `RESHARD_FUZZ_SEED=N` replays it, `RESHARD_FUZZ_CASES=N` sets the
//! number of messages (2,000 by default, 20,000 with `RESHARD_HEAVY_TESTS=1`; each is a
//! connection of its own, about a millisecond).

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bson::{doc, Bson, Document};
use mongodb::error::ErrorKind;
use mongodb::Client;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use reshard::front::wire::{Limits, Message, MsgFlags, Op, OpMsg, OpQuery, Section};
use reshard::front::{Front, Settings, Stats};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

#[path = "support/clients.rs"]
mod clients;
use clients::{root, run_client};

/// A front serving on a free port of this machine, inside the test's runtime.
struct RunningFront {
    addr: SocketAddr,
    front: Arc<Front>,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl RunningFront {
    async fn start() -> RunningFront {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let front = Arc::new(Front::new(Settings::default()));
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
        }
    }

    fn uri(&self) -> String {
        format!("mongodb://{}/?serverSelectionTimeoutMS=5000", self.addr)
    }

    /// Stops the front and returns what it did; it must stop by itself within seconds.
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

/// What every client must have been answered: a `mongos` 7.0 without sessions, and
/// `CommandNotFound` for an unknown command. `probe` is the JSON a probe printed.
fn check_probe(probe: &serde_json::Value) {
    let client = probe["client"].as_str().unwrap_or("a client");
    let context = format!("{client}: {probe}");
    assert_eq!(probe["ping"]["ok"].as_f64(), Some(1.0), "{context}");
    let hello = &probe["hello"];
    assert_eq!(hello["isWritablePrimary"], true, "{context}");
    assert_eq!(hello["msg"], "isdbgrid", "{context}");
    assert_eq!(hello["maxWireVersion"].as_i64(), Some(21), "{context}");
    assert_eq!(hello["minWireVersion"].as_i64(), Some(0), "{context}");
    assert_eq!(
        hello["maxBsonObjectSize"].as_i64(),
        Some(16_777_216),
        "{context}"
    );
    assert_eq!(
        hello["maxMessageSizeBytes"].as_i64(),
        Some(48_000_000),
        "{context}"
    );
    assert_eq!(
        hello["maxWriteBatchSize"].as_i64(),
        Some(100_000),
        "{context}"
    );
    assert!(hello["connectionId"].as_i64().is_some(), "{context}");
    assert!(
        hello.get("logicalSessionTimeoutMinutes").is_none(),
        "{context}"
    );
    assert_eq!(probe["buildInfo"], "7.0.0", "{context}");
    let unknown = &probe["unknown"];
    assert_eq!(unknown["code"].as_i64(), Some(59), "{context}");
    assert_eq!(unknown["codeName"], "CommandNotFound", "{context}");
    assert!(
        unknown["errmsg"]
            .as_str()
            .is_some_and(|m| m.contains("no such command: 'frobnicate'")),
        "{context}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rust_driver_connects_pings_and_gets_command_not_found() {
    let front = RunningFront::start().await;
    let client = Client::with_uri_str(front.uri()).await.unwrap();
    let admin = client.database("admin");

    let ping = admin.run_command(doc! {"ping": 1}).await.unwrap();
    assert_eq!(ping.get_f64("ok"), Ok(1.0));

    let hello = admin.run_command(doc! {"hello": 1}).await.unwrap();
    assert_eq!(hello.get_bool("isWritablePrimary"), Ok(true));
    assert_eq!(hello.get_str("msg"), Ok("isdbgrid"));
    assert_eq!(hello.get_i32("maxWireVersion"), Ok(21));
    assert!(matches!(hello.get("localTime"), Some(Bson::DateTime(_))));
    assert!(!hello.contains_key("logicalSessionTimeoutMinutes"));

    let build_info = admin.run_command(doc! {"buildInfo": 1}).await.unwrap();
    assert_eq!(build_info.get_str("version"), Ok("7.0.0"));

    let error = admin.run_command(doc! {"frobnicate": 1}).await.unwrap_err();
    let ErrorKind::Command(command_error) = &*error.kind else {
        panic!("a command error: {error}");
    };
    assert_eq!(command_error.code, 59);
    assert_eq!(command_error.code_name, "CommandNotFound");
    assert_eq!(command_error.message, "no such command: 'frobnicate'");

    let error = client
        .database("shop")
        .run_command(doc! {"getMore": 5_i64, "collection": "orders"})
        .await
        .unwrap_err();
    assert!(
        matches!(&*error.kind, ErrorKind::Command(e) if e.code == 43),
        "{error}"
    );

    drop(client);
    let stats = front.stop().await;
    assert_eq!(stats.refused, 0, "{stats:?}");
    assert_eq!(stats.panics, 0, "{stats:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pymongo_connects_pings_and_gets_command_not_found() {
    let front = RunningFront::start().await;
    let python = root().join(".venv/bin/python");
    let script = root().join("tests/clients/pymongo_probe.py");
    let probe = run_client(
        &python,
        &[script.to_str().unwrap(), &front.uri()],
        &[],
        "pymongo in .venv",
    )
    .await;
    check_probe(&probe);
    assert!(
        probe["sessions"]
            .as_str()
            .is_some_and(|s| s.starts_with("refused")),
        "pymongo must see no session support: {probe}"
    );
    let stats = front.stop().await;
    // pymongo 4.20 opens with `hello` over OP_MSG.
    assert_eq!((stats.refused, stats.panics), (0, 0), "{stats:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_node_driver_connects_pings_and_gets_command_not_found() {
    let front = RunningFront::start().await;
    let script = root().join("tests/clients/node_probe.mjs");
    assert!(
        root().join("tests/clients/node_modules/mongodb").exists(),
        "the Node driver is missing: run scripts/install-secantus.sh"
    );
    let probe = run_client(
        Path::new("/usr/bin/env"),
        &["node", script.to_str().unwrap(), &front.uri()],
        &[],
        "the Node driver in tests/clients",
    )
    .await;
    check_probe(&probe);
    let stats = front.stop().await;
    // The Node driver (and mongosh, which runs it) opens with the legacy isMaster over
    // OP_QUERY, answered by an OP_REPLY, before it switches to `hello` over OP_MSG.
    assert!(stats.legacy_requests >= 1, "{stats:?}");
    assert_eq!((stats.refused, stats.panics), (0, 0), "{stats:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mongosh_connects_pings_and_gets_command_not_found() {
    let front = RunningFront::start().await;
    let mongosh = root().join("tests/clients/node_modules/.bin/mongosh");
    let script = root().join("tests/clients/mongosh_probe.js");
    let probe = run_client(
        &mongosh,
        &[
            &front.uri(),
            "--quiet",
            "--norc",
            "--file",
            script.to_str().unwrap(),
        ],
        &[],
        "mongosh in tests/clients",
    )
    .await;
    check_probe(&probe);
    let stats = front.stop().await;
    // The Node driver (and mongosh, which runs it) opens with the legacy isMaster over
    // OP_QUERY, answered by an OP_REPLY, before it switches to `hello` over OP_MSG.
    assert!(stats.legacy_requests >= 1, "{stats:?}");
    assert_eq!((stats.refused, stats.panics), (0, 0), "{stats:?}");
}

/// `reshard front` as an operator runs it: it serves on `--listen`, stops on SIGTERM with
/// exit 0, and prints what it served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reshard_front_serves_until_sigterm() {
    let port = {
        let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        probe.local_addr().unwrap().port()
    };
    let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_reshard"))
        .args(["front", "--listen", &format!("127.0.0.1:{port}")])
        .env_remove("RESHARD_DATABASE_URL")
        .env_remove("DATABASE_URL")
        .env_remove("RESHARD_LOG")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let client = Client::with_uri_str(format!(
        "mongodb://127.0.0.1:{port}/?serverSelectionTimeoutMS=10000"
    ))
    .await
    .unwrap();
    let ping = client
        .database("admin")
        .run_command(doc! {"ping": 1})
        .await
        .unwrap();
    assert_eq!(ping.get_f64("ok"), Ok(1.0));
    drop(client);

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
    assert!(stdout.contains("requests"), "{stdout}");
    assert!(stderr.contains("listening"), "{stderr}");
}

// ---------------------------------------------------------------------------------------------
// The wire fuzz.

fn heavy_tests_enabled() -> bool {
    std::env::var("RESHARD_HEAVY_TESTS").is_ok_and(|v| v == "1" || v == "true")
}

fn fuzz_cases() -> usize {
    std::env::var("RESHARD_FUZZ_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(if heavy_tests_enabled() { 20_000 } else { 2_000 })
}

fn msg(request_id: i32, flags: u32, sections: Vec<Section>) -> Vec<u8> {
    Message {
        request_id,
        response_to: 0,
        op: Op::Msg(OpMsg {
            flags: MsgFlags(flags),
            sections,
        }),
    }
    .encode()
    .unwrap()
}

fn ping_frame(request_id: i32) -> Vec<u8> {
    msg(
        request_id,
        0,
        vec![Section::Body(doc! {"ping": 1, "$db": "admin"})],
    )
}

fn nested(levels: usize) -> Document {
    let mut document = doc! {"x": 1};
    for _ in 0..levels {
        document = doc! {"a": document};
    }
    document
}

/// A well-formed message to start from: what drivers send, and some they should not.
fn base_message(rng: &mut StdRng) -> Vec<u8> {
    let id = rng.gen_range(1..1_000_000);
    match rng.gen_range(0..8) {
        0 => ping_frame(id),
        1 => msg(
            id,
            MsgFlags::EXHAUST_ALLOWED,
            vec![
                Section::Body(doc! {"insert": "orders", "$db": "shop", "ordered": false}),
                Section::Sequence {
                    identifier: "documents".into(),
                    documents: (0..rng.gen_range(0..5))
                        .map(|i| doc! {"_id": i, "customer": "c".repeat(i as usize)})
                        .collect(),
                },
            ],
        ),
        2 => msg(
            id,
            MsgFlags::CHECKSUM_PRESENT,
            vec![Section::Body(
                doc! {"hello": 1, "$db": "admin", "helloOk": true},
            )],
        ),
        3 => Message {
            request_id: id,
            response_to: 0,
            op: Op::Query(OpQuery {
                flags: 0,
                full_collection_name: "admin.$cmd".into(),
                number_to_skip: 0,
                number_to_return: -1,
                query: doc! {"$query": {"isMaster": 1, "client": {"driver": {"name": "fuzz"}}}},
                return_fields_selector: None,
            }),
        }
        .encode()
        .unwrap(),
        4 => msg(
            id,
            0,
            vec![Section::Body(
                doc! {"buildInfo": 1, "$db": "admin", "d": nested(rng.gen_range(150..260))},
            )],
        ),
        5 => msg(
            id,
            MsgFlags::MORE_TO_COME,
            vec![Section::Body(doc! {"ping": 1, "$db": "admin"})],
        ),
        6 => msg(
            id,
            0,
            vec![Section::Body(
                doc! {"getMore": 7_i64, "collection": "c", "$db": "x", "blob": Bson::Binary(bson::Binary { subtype: bson::spec::BinarySubtype::Generic, bytes: vec![7; rng.gen_range(0..64)] })},
            )],
        ),
        _ => msg(
            id,
            0,
            vec![Section::Body(doc! {"frobnicate": 1, "$db": "admin"})],
        ),
    }
}

/// A message for the fuzz: a base message, then one of the ways a message goes wrong.
fn fuzz_message(rng: &mut StdRng) -> Vec<u8> {
    let mut bytes = base_message(rng);
    let len = bytes.len();
    let set_i32 = |bytes: &mut Vec<u8>, at: usize, value: i32| {
        if at + 4 <= bytes.len() {
            bytes[at..at + 4].copy_from_slice(&value.to_le_bytes());
        }
    };
    match rng.gen_range(0..12) {
        // Left as it is: a well-formed message among the malformed ones.
        0 => {}
        // Random bytes changed anywhere.
        1 => {
            for _ in 0..rng.gen_range(1..8) {
                let at = rng.gen_range(0..len);
                bytes[at] = rng.gen();
            }
        }
        // The message length: below a header, negative, one off, beyond the bytes sent,
        // beyond the limit.
        2 => {
            let choices = [
                -1,
                0,
                15,
                16,
                len as i32 - 1,
                len as i32 + 1,
                len as i32 + 1000,
                48_000_001,
                i32::MAX,
                rng.gen(),
            ];
            let value = choices[rng.gen_range(0..choices.len())];
            set_i32(&mut bytes, 0, value);
        }
        // Cut anywhere, header included.
        3 => bytes.truncate(rng.gen_range(0..len)),
        // Garbage after the message (the next "message" the server reads).
        4 => {
            let extra: Vec<u8> = (0..rng.gen_range(1..64)).map(|_| rng.gen()).collect();
            bytes.extend(extra);
        }
        // The opcode: legacy, compressed, unknown.
        5 => {
            let choices = [
                1,
                2001,
                2002,
                2004,
                2005,
                2006,
                2007,
                2010,
                2012,
                9999,
                rng.gen(),
            ];
            let value = choices[rng.gen_range(0..choices.len())];
            set_i32(&mut bytes, 12, value);
        }
        // OP_MSG flag bits, required and optional.
        6 => {
            let value = [1u32 << rng.gen_range(0..32), rng.gen()][rng.gen_range(0..2)];
            set_i32(&mut bytes, 16, value as i32);
        }
        // The first section's kind.
        7 => {
            if len > 20 {
                bytes[20] = rng.gen_range(0..4);
            }
        }
        // The first document's or section's length.
        8 => {
            let value = [-1, 0, 4, 5, rng.gen_range(0..200), rng.gen()][rng.gen_range(0..6)];
            set_i32(&mut bytes, 21, value);
        }
        // A length somewhere inside the body (a nested document's, a string's).
        9 => {
            if len > 30 {
                let at = rng.gen_range(21..len - 4);
                set_i32(&mut bytes, at, rng.gen_range(-10..400));
            }
        }
        // Random bytes behind a true header.
        10 => {
            let body: Vec<u8> = (0..rng.gen_range(0..200)).map(|_| rng.gen()).collect();
            bytes.truncate(16);
            bytes.extend(body);
            let total = bytes.len() as i32;
            set_i32(&mut bytes, 0, total);
        }
        // Random bytes, no header to speak of.
        _ => {
            bytes = (0..rng.gen_range(0..100)).map(|_| rng.gen()).collect();
        }
    }
    bytes
}

/// Reads until the peer closes, or fails after `limit`.
async fn read_until_closed(stream: &mut TcpStream, limit: Duration) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    match tokio::time::timeout(limit, stream.read_to_end(&mut out)).await {
        Ok(Ok(_)) => Ok(out),
        // A reset is a close too (the server closed with our bytes unread).
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionReset => Ok(out),
        Ok(Err(e)) => Err(format!("read failed: {e}")),
        Err(_) => Err(format!("the connection was still open after {limit:?}")),
    }
}

/// Splits what a server sent into frames, each decoded.
fn frames(mut bytes: &[u8]) -> Result<Vec<Message>, String> {
    let mut out = Vec::new();
    while !bytes.is_empty() {
        if bytes.len() < 4 {
            return Err(format!("{} stray bytes", bytes.len()));
        }
        let len = i32::from_le_bytes(bytes[..4].try_into().unwrap()) as usize;
        if len < 16 || len > bytes.len() {
            return Err(format!("a frame of length {len} in {} bytes", bytes.len()));
        }
        out.push(Message::decode(&bytes[..len], &Limits::default()).map_err(|e| e.to_string())?);
        bytes = &bytes[len..];
    }
    Ok(out)
}

fn reply_body(message: &Message) -> Option<&Document> {
    match &message.op {
        Op::Msg(msg) => msg.sections.iter().find_map(|s| match s {
            Section::Body(body) => Some(body),
            Section::Sequence { .. } => None,
        }),
        Op::Reply(reply) => reply.documents.first(),
        Op::Query(_) => None,
    }
}

/// Sends a ping on `stream` and checks the answer.
async fn ping_on(stream: &mut TcpStream, request_id: i32) -> Result<(), String> {
    stream
        .write_all(&ping_frame(request_id))
        .await
        .map_err(|e| format!("write: {e}"))?;
    let mut header = [0u8; 16];
    tokio::time::timeout(Duration::from_secs(10), stream.read_exact(&mut header))
        .await
        .map_err(|_| "no answer within 10 s".to_string())?
        .map_err(|e| format!("read: {e}"))?;
    let len = i32::from_le_bytes(header[..4].try_into().unwrap()) as usize;
    let mut bytes = header.to_vec();
    bytes.resize(len.max(16), 0);
    stream
        .read_exact(&mut bytes[16..])
        .await
        .map_err(|e| format!("read: {e}"))?;
    let reply = Message::decode(&bytes, &Limits::default()).map_err(|e| e.to_string())?;
    if reply.response_to != request_id {
        return Err(format!(
            "an answer to {} for {request_id}",
            reply.response_to
        ));
    }
    match reply_body(&reply).map(|b| b.get_f64("ok")) {
        Some(Ok(1.0)) => Ok(()),
        other => Err(format!("ping answered {other:?}")),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wire_fuzz_never_panics_and_closes_only_the_offending_connection() {
    let seed: u64 = std::env::var("RESHARD_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    let cases = fuzz_cases();
    eprintln!(
        "[fuzz] front wire: {cases} messages, seed {seed} (replay: RESHARD_FUZZ_SEED={seed})"
    );
    let mut rng = StdRng::seed_from_u64(seed);
    let messages: Vec<Vec<u8>> = (0..cases).map(|_| fuzz_message(&mut rng)).collect();

    let front = RunningFront::start().await;

    // A well-behaved application: the Rust driver pinging throughout the fuzz.
    let client = Client::with_uri_str(front.uri()).await.unwrap();
    let done = Arc::new(AtomicBool::new(false));
    let (answered, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let application = {
        let (done, answered, failed) = (done.clone(), answered.clone(), failed.clone());
        let admin = client.database("admin");
        tokio::spawn(async move {
            while !done.load(Ordering::Relaxed) {
                match admin.run_command(doc! {"ping": 1}).await {
                    Ok(_) => answered.fetch_add(1, Ordering::Relaxed),
                    Err(e) => {
                        eprintln!("[fuzz] the application's ping failed: {e}");
                        failed.fetch_add(1, Ordering::Relaxed)
                    }
                };
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        })
    };
    // A bystander: one raw connection, open through the whole fuzz, pinged after every message.
    let mut bystander = TcpStream::connect(front.addr).await.unwrap();

    let started = Instant::now();
    let (mut replies, mut closed_without_reply, mut bytes_sent) = (0usize, 0usize, 0usize);
    for (n, message) in messages.iter().enumerate() {
        let context = || {
            format!(
                "message {n} of seed {seed} (replay: RESHARD_FUZZ_SEED={seed}): {}",
                hex(message)
            )
        };
        let mut stream = TcpStream::connect(front.addr).await.unwrap();
        // The connection works before the fuzzed message arrives.
        ping_on(&mut stream, 1)
            .await
            .unwrap_or_else(|e| panic!("{e}: {}", context()));
        stream
            .write_all(message)
            .await
            .unwrap_or_else(|e| panic!("{e}: {}", context()));
        bytes_sent += message.len();
        // No more requests: the server answers what it got, then closes (at the end of input,
        // or at once for a malformed message).
        stream.shutdown().await.unwrap();
        let received = read_until_closed(&mut stream, Duration::from_secs(10))
            .await
            .unwrap_or_else(|e| panic!("{e}: {}", context()));
        let got =
            frames(&received).unwrap_or_else(|e| panic!("a malformed reply, {e}: {}", context()));
        if got.is_empty() {
            closed_without_reply += 1;
        }
        for reply in &got {
            let body = reply_body(reply)
                .unwrap_or_else(|| panic!("a reply without a body: {}", context()));
            assert!(body.contains_key("ok"), "{body}: {}", context());
        }
        replies += got.len();
        ping_on(&mut bystander, n as i32 + 2)
            .await
            .unwrap_or_else(|e| panic!("the bystander lost its connection, {e}: {}", context()));
    }
    let elapsed = started.elapsed();
    done.store(true, Ordering::Relaxed);
    application.await.unwrap();

    // A new connection after all that is served as the first one was.
    let fresh = Client::with_uri_str(front.uri()).await.unwrap();
    fresh
        .database("admin")
        .run_command(doc! {"ping": 1})
        .await
        .unwrap();
    drop((client, fresh, bystander));
    let stats = front.stop().await;
    let (answered, failed) = (
        answered.load(Ordering::Relaxed),
        failed.load(Ordering::Relaxed),
    );
    eprintln!(
        "[fuzz] front wire: {cases} messages ({bytes_sent} bytes) in {:.1} s, seed {seed}: \
         {replies} replies, {closed_without_reply} connections closed without one, {} refused \
         by the front; the application's pings: {answered} answered, {failed} failed; {stats:?}",
        elapsed.as_secs_f64(),
        stats.refused,
    );
    assert_eq!(stats.panics, 0, "{stats:?}");
    assert_eq!(failed, 0, "the well-behaved application saw failures");
    assert!(answered > 0, "the application was never answered");
    // The fuzz reaches both sides: messages refused, and messages answered.
    assert!(
        stats.refused > 0 && replies > 0,
        "{stats:?}, {replies} replies"
    );
}
