//! Secrets (issue 14): a shard's password reaches no table of the state store, no event, no
//! command's output and no process's log, through a whole run.
//!
//! Two SecantusDB servers require SCRAM-SHA-256 authentication, with one user whose password
//! is random and holds characters a URI must percent-encode. Three shards reach them three
//! ways, as the playbook names them: `s1` by a URI that names the password as
//! `${RESHARD_MONGO_PASSWORD}`, `s2` by `--uri-file` (the whole URI in a file), `s3` by
//! `${RESHARD_S3_URI}` (the whole URI in the environment). Every process runs with
//! `RESHARD_LOG=debug`: the seeding, the example application writing throughout, a
//! `reshard worker` (JSON logs), `reshard run` through an approval to `completed`, the read
//! commands in text and JSON, and the refusals and failures (a plain-text password, a wrong
//! password, a password not percent-encoded, a dead server, an unset variable, a playbook with
//! a password). Then the password, its percent-encoded forms and each of its alphanumeric runs
//! are searched for in every command's stdout and stderr, every log, a `pg_dump --data-only`
//! of the state store and the state store's server log. Controls show that the same search
//! finds them where they are.
//!
//! Only the local backend: the fixture provisions a user and restarts SecantusDB with `--auth`.
#![cfg(not(feature = "containers"))]

mod support;

use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use rand::distributions::{Alphanumeric, DistString};
use serde_json::Value;
use support::{MongoServer, PrivatePg, Storage, MONGO_URI_OPTIONS};
use tokio::process::{Child, Command};

const USER: &str = "reshard_app";

/// The password in every form it could leak in.
struct Secret {
    /// As the server knows it.
    raw: String,
    /// As it stands in a URI.
    encoded: String,
    /// Its alphanumeric runs: a leak of a part (a password cut at a reserved character)
    /// shows too.
    pieces: Vec<String>,
}

impl Secret {
    fn random() -> Secret {
        let mut rng = rand::thread_rng();
        let pieces: Vec<String> = [8, 7, 6]
            .into_iter()
            .map(|n| Alphanumeric.sample_string(&mut rng, n))
            .collect();
        // 24 characters with '?', '/' and '@', which a URI must percent-encode.
        let raw = format!("{}?{}/{}@", pieces[0], pieces[1], pieces[2]);
        Secret {
            encoded: encode(&raw, true),
            raw,
            pieces,
        }
    }

    /// Every form searched for.
    fn needles(&self) -> Vec<String> {
        let mut n = vec![
            self.raw.clone(),
            self.encoded.clone(),
            encode(&self.raw, false),
        ];
        n.extend(self.pieces.iter().cloned());
        n
    }

    /// The forms `text` holds.
    fn found_in(&self, text: &str) -> Vec<String> {
        self.needles()
            .into_iter()
            .filter(|n| text.contains(n.as_str()))
            .collect()
    }
}

/// `text` with `?`, `/` and `@` percent-encoded, in upper- or lower-case hex.
fn encode(text: &str, upper: bool) -> String {
    let encoded = text
        .replace('?', "%3F")
        .replace('/', "%2F")
        .replace('@', "%40");
    if upper {
        encoded
    } else {
        encoded.replace("%3F", "%3f").replace("%2F", "%2f")
    }
}

/// What every process of the run shares, and everything they printed.
struct Run {
    dir: PathBuf,
    url: String,
    secret_env: Vec<(String, String)>,
    /// (what, text): every command's stdout and stderr, and every log, for the search.
    texts: Vec<(String, String)>,
}

impl Run {
    fn command(&self, program: &Path) -> Command {
        let mut cmd = Command::new(program);
        cmd.env("RESHARD_DATABASE_URL", &self.url)
            .env("RESHARD_LOG", "debug")
            .env_remove("RESHARD_ACTOR")
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .kill_on_drop(true);
        for (k, v) in &self.secret_env {
            cmd.env(k, v);
        }
        cmd
    }

    fn reshard(&self) -> Command {
        self.command(Path::new(env!("CARGO_BIN_EXE_reshard")))
    }

    /// Runs `reshard ARGS` to its end (at most two minutes) and keeps what it printed.
    async fn reshard_out(&mut self, args: &[&str]) -> Output {
        let out =
            tokio::time::timeout(Duration::from_secs(120), self.reshard().args(args).output())
                .await
                .unwrap_or_else(|_| panic!("reshard {args:?} did not end within 2 minutes"))
                .unwrap();
        self.keep(&format!("reshard {}", args.join(" ")), &out);
        out
    }

    /// `reshard ARGS`, which must succeed; its stdout.
    async fn reshard_ok(&mut self, args: &[&str]) -> String {
        let out = self.reshard_out(args).await;
        assert!(
            out.status.success(),
            "reshard {args:?}: {}{}",
            text(&out.stdout),
            text(&out.stderr)
        );
        text(&out.stdout)
    }

    /// `reshard ARGS`, which must be refused with exit code 2 and a message holding `expect`;
    /// its stderr.
    async fn reshard_refused(&mut self, args: &[&str], env: &[(&str, &str)], expect: &str) {
        let mut cmd = self.reshard();
        cmd.args(args);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let out = cmd.output().await.unwrap();
        self.keep(&format!("reshard {} (refused)", args.join(" ")), &out);
        let stderr = text(&out.stderr);
        assert_eq!(
            out.status.code(),
            Some(2),
            "reshard {args:?} should be refused: {}{stderr}",
            text(&out.stdout)
        );
        assert!(
            stderr.contains(expect),
            "reshard {args:?}: {expect:?} not in {stderr}"
        );
        eprintln!("secrets: refused as expected: {}", stderr.trim_end());
    }

    fn keep(&mut self, what: &str, out: &Output) {
        self.texts
            .push((format!("{what}: stdout"), text(&out.stdout)));
        self.texts
            .push((format!("{what}: stderr"), text(&out.stderr)));
    }

    fn log(&self, name: &str) -> std::fs::File {
        std::fs::File::create(self.dir.join(name)).unwrap()
    }

    fn keep_log(&mut self, name: &str) {
        let content = std::fs::read_to_string(self.dir.join(name)).unwrap();
        self.texts.push((format!("log {name}"), content));
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn example_binary() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap().parent().unwrap();
    dir.join("examples").join("orders_app")
}

/// `mongodb://USER:PASSWORD@host:port/?authSource=admin&...` for `server`.
fn auth_uri(server: &MongoServer, password: &str) -> String {
    format!(
        "mongodb://{USER}:{password}@{}:{}/?authSource=admin&{MONGO_URI_OPTIONS}",
        server.host(),
        server.port()
    )
}

/// `pg_dump --data-only` of the state store: every row of every table, the event log too.
fn dump(pg: &PrivatePg) -> String {
    let bindir = std::process::Command::new("pg_config")
        .arg("--bindir")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| PathBuf::from(text(&o.stdout).trim()))
        .unwrap_or_default();
    let pg_dump = bindir.join("pg_dump");
    let pg_dump = if pg_dump.is_file() {
        pg_dump
    } else {
        PathBuf::from("pg_dump")
    };
    let out = std::process::Command::new(&pg_dump)
        .args(["--data-only", "--no-owner", "--dbname"])
        .arg(pg.url())
        .output()
        .unwrap_or_else(|e| panic!("{}: {e}", pg_dump.display()));
    assert!(out.status.success(), "pg_dump: {}", text(&out.stderr));
    text(&out.stdout)
}

/// How many rows of `table` a `pg_dump --data-only` holds.
fn rows_of(dump: &str, table: &str) -> usize {
    let start = format!("COPY public.{table} (");
    dump.lines()
        .skip_while(|l| !l.starts_with(&start))
        .skip(1)
        .take_while(|l| *l != "\\.")
        .count()
}

async fn stop(child: &mut Child, what: &str) {
    if let Some(pid) = child.id() {
        let _ = std::process::Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status();
    }
    match tokio::time::timeout(Duration::from_secs(30), child.wait()).await {
        Ok(status) => eprintln!("secrets: {what} ended: {}", status.unwrap()),
        Err(_) => panic!("{what} did not stop within 30 s of SIGTERM"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_password_in_the_store_the_events_the_output_or_the_logs() {
    let started = Instant::now();
    let secret = Secret::random();
    let dir = tempfile::Builder::new()
        .prefix("reshard-secrets-")
        .tempdir()
        .unwrap();

    // A state store of the test's own (its server log is searched too) and two servers that
    // require authentication.
    let server = || {
        MongoServer::builder()
            .storage(Storage::Persistent)
            .sync_on_commit(true)
    };
    let (pg, a, b) = tokio::join!(
        PrivatePg::start(),
        server().name("a").start(),
        server().name("b").start()
    );
    tokio::join!(
        a.require_auth(USER, &secret.raw),
        b.require_auth(USER, &secret.raw)
    );
    eprintln!("secrets: servers up in {:?}", started.elapsed());
    // The servers really refuse a client without the password.
    let anonymous = a.client().await;
    let refused = anonymous
        .database("shop_s1")
        .run_command(mongodb::bson::doc! { "count": "orders" })
        .await
        .expect_err("a server with --auth answered an unauthenticated count");
    assert_eq!(support::error_code(&refused), Some(13), "{refused}");

    let s1_uri = auth_uri(&a, "${RESHARD_MONGO_PASSWORD}");
    let s2_file = dir.path().join("s2.uri");
    std::fs::write(&s2_file, format!("{}\n", auth_uri(&b, &secret.encoded))).unwrap();
    let s3_uri = auth_uri(&a, &secret.encoded);
    let mut run = Run {
        dir: dir.path().to_owned(),
        url: pg.url(),
        secret_env: vec![
            ("RESHARD_MONGO_PASSWORD".into(), secret.encoded.clone()),
            ("RESHARD_S3_URI".into(), s3_uri.clone()),
        ],
        texts: Vec::new(),
    };

    // Controls: the search finds the password where it must be.
    let control = std::fs::read_to_string(&s2_file).unwrap();
    assert!(secret.found_in(&control).contains(&secret.encoded));
    assert_eq!(secret.found_in(&s3_uri).len(), 4, "{s3_uri}");
    assert_eq!(secret.found_in(&secret.raw).len(), 4);

    // The layout before reshard: s1 by a variable, s2 by a file.
    run.reshard_ok(&["db", "migrate"]).await;
    run.reshard_ok(&[
        "shard",
        "add",
        "s1",
        "--uri",
        &s1_uri,
        "--database",
        "shop_s1",
    ])
    .await;
    let s2_path = s2_file.display().to_string();
    run.reshard_ok(&[
        "shard",
        "add",
        "s2",
        "--uri-file",
        &s2_path,
        "--database",
        "shop_s2",
    ])
    .await;
    // s3 by a variable holding the whole URI, registered before the worker starts (a worker
    // connects to the shards registered when it starts).
    run.reshard_ok(&[
        "shard",
        "add",
        "s3",
        "--uri",
        "${RESHARD_S3_URI}",
        "--database",
        "shop_s3",
    ])
    .await;
    let v1 = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/campaign/v1.yaml");
    run.reshard_ok(&[
        "version",
        "create",
        "--collection",
        "orders",
        "--file",
        v1.to_str().unwrap(),
    ])
    .await;

    // Refusals and failures: each says what is wrong in a sentence, never the password.
    let dead_port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let inline = auth_uri(&a, &secret.encoded);
    run.reshard_refused(
        &["shard", "add", "x1", "--uri", &inline, "--database", "x"],
        &[],
        "holds a password in plain text",
    )
    .await;
    let wrong = auth_uri(&a, "${RESHARD_WRONG_PASSWORD}");
    let wrong_password = format!("{}0", secret.encoded);
    run.reshard_refused(
        &["shard", "add", "x2", "--uri", &wrong, "--database", "x"],
        &[("RESHARD_WRONG_PASSWORD", &wrong_password)],
        "authentication failed: authentication failed (code 18 AuthenticationFailed)",
    )
    .await;
    let dead = format!(
        "mongodb://{USER}:${{RESHARD_MONGO_PASSWORD}}@127.0.0.1:{dead_port}/?authSource=admin&\
         serverSelectionTimeoutMS=1000&{MONGO_URI_OPTIONS}"
    );
    run.reshard_refused(
        &["shard", "add", "x3", "--uri", &dead, "--database", "x"],
        &[],
        &format!("did not answer a ping on database \"x\": no server could be reached in time: 127.0.0.1:{dead_port}: connection refused"),
    )
    .await;
    // The password put in the variable as it is, not percent-encoded: the driver cannot
    // parse the URI, and its reason quotes the text around the '?'.
    let not_encoded = auth_uri(&a, "${RESHARD_RAW_PASSWORD}");
    run.reshard_refused(
        &[
            "shard",
            "add",
            "x5",
            "--uri",
            &not_encoded,
            "--database",
            "x",
        ],
        &[("RESHARD_RAW_PASSWORD", &secret.raw)],
        "is not a usable MongoDB connection string",
    )
    .await;
    let unset = auth_uri(&a, "${RESHARD_UNSET_PASSWORD}");
    run.reshard_refused(
        &["shard", "add", "x4", "--uri", &unset, "--database", "x"],
        &[],
        "RESHARD_UNSET_PASSWORD",
    )
    .await;
    let bad_playbook = dir.path().join("inline.yaml");
    std::fs::write(
        &bad_playbook,
        playbook(&inline, &s2_path).replace("name: secrets", "name: inline"),
    )
    .unwrap();
    run.reshard_refused(
        &["playbook", "validate", bad_playbook.to_str().unwrap()],
        &[],
        "holds a password in plain text",
    )
    .await;

    // The orders before reshard, then the application writing throughout.
    let seed = run
        .command(&example_binary())
        .args(["--seed-orders", "3000", "--hot-share", "0.3"])
        .stdout(run.log("seed.log"))
        .stderr(run.log("seed.log"))
        .status()
        .await
        .unwrap();
    assert!(seed.success(), "seeding failed: see seed.log");
    run.keep_log("seed.log");
    let ledger = dir.path().join("ledger.jsonl");
    let mut app = run
        .command(&example_binary())
        .args(["--duration", "600s", "--rate", "40", "--workers", "2"])
        .args(["--list-percent", "2", "--hot-share", "0.3"])
        .arg("--ledger")
        .arg(&ledger)
        .stdout(run.log("app.out"))
        .stderr(run.log("app.log"))
        .spawn()
        .unwrap();
    let mut worker = run
        .reshard()
        .args(["--log-format", "json", "worker", "--concurrency", "2"])
        .args(["--lease-ttl", "5s", "--name", "secrets-w1"])
        .stdout(run.log("worker.out"))
        .stderr(run.log("worker.log"))
        .spawn()
        .unwrap();

    // The whole migration through `reshard run`, stopping at its approval.
    let file = dir.path().join("secrets.yaml");
    std::fs::write(&file, playbook(&s1_uri, &s2_path)).unwrap();
    let file = file.to_str().unwrap().to_owned();
    run.reshard_ok(&["playbook", "validate", &file]).await;
    run.reshard_ok(&["plan", &file]).await;
    let first: Value = serde_json::from_str(
        &run.reshard_ok(&["--output", "json", "run", &file, "--workers", "0"])
            .await,
    )
    .unwrap();
    assert_eq!(first["end"], "waiting_for_approval", "{first}");
    let id = first["migration_id"].as_i64().unwrap().to_string();
    // The read commands, in the middle of the run and in both formats.
    for args in read_commands(&id) {
        run.reshard_ok(&args.iter().map(String::as_str).collect::<Vec<_>>())
            .await;
    }
    run.reshard_ok(&["approve", &id, "--step", "approve-cleanup"])
        .await;
    let end: Value = serde_json::from_str(
        &run.reshard_ok(&["--output", "json", "run", &file, "--workers", "0"])
            .await,
    )
    .unwrap();
    assert_eq!(end["end"], "done", "{end}");
    assert_eq!(end["phase"], "completed", "{end}");
    let status: Value = serde_json::from_str(
        &run.reshard_ok(&["--output", "json", "migration", "status", &id])
            .await,
    )
    .unwrap();
    assert_eq!(status["phase"], "completed", "{status}");
    for args in read_commands(&id) {
        run.reshard_ok(&args.iter().map(String::as_str).collect::<Vec<_>>())
            .await;
    }
    let shards: Value =
        serde_json::from_str(&run.reshard_ok(&["--output", "json", "shard", "list"]).await)
            .unwrap();
    let uris: Vec<&str> = shards
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["uri"].as_str().unwrap())
        .collect();
    assert_eq!(
        uris,
        [
            auth_uri(&a, "***").as_str(),
            &format!("${{file:{s2_path}}}"),
            "${RESHARD_S3_URI}"
        ],
        "the shards as stored (shown redacted)"
    );

    // The application checks what it wrote against the final layout.
    stop(&mut worker, "reshard worker").await;
    stop(&mut app, "orders_app").await;
    let check = run
        .command(&example_binary())
        .arg("--check")
        .arg("--ledger")
        .arg(&ledger)
        .stdout(run.log("check.out"))
        .stderr(run.log("check.log"))
        .status()
        .await
        .unwrap();
    for log in [
        "app.out",
        "app.log",
        "worker.out",
        "worker.log",
        "check.out",
        "check.log",
    ] {
        run.keep_log(log);
    }
    assert!(check.success(), "the ledger check failed: see check.out");
    let worker_log = &run
        .texts
        .iter()
        .find(|(w, _)| w == "log worker.log")
        .unwrap()
        .1;
    assert!(
        worker_log.contains("\"level\":\"DEBUG\""),
        "the worker logged nothing at debug level: RESHARD_LOG=debug did not take"
    );

    // The search. The state store: every row of every table, the event log among them.
    let rows = dump(&pg);
    for (table, least) in [("migration_events", 10), ("shards", 3), ("playbooks", 1)] {
        let n = rows_of(&rows, table);
        assert!(n >= least, "pg_dump holds {n} rows of {table}:\n{rows}");
    }
    assert!(rows.contains("${RESHARD_MONGO_PASSWORD}"), "{rows}");
    run.texts.push(("pg_dump --data-only".into(), rows));
    run.texts.push((
        "the state store's server log".into(),
        std::fs::read_to_string(pg.log_path()).unwrap(),
    ));
    let bytes: usize = run.texts.iter().map(|(_, t)| t.len()).sum();
    let leaks: Vec<String> = run
        .texts
        .iter()
        .filter_map(|(what, t)| {
            let found = secret.found_in(t);
            (!found.is_empty()).then(|| format!("{what}: {found:?}"))
        })
        .collect();
    assert!(
        leaks.is_empty(),
        "the password leaked:\n{}\n(logs in {})",
        leaks.join("\n"),
        dir.keep().display()
    );

    // Control: the same dump and search find the password once it is in a table.
    let pool = pg.new_pool().await;
    sqlx::query("CREATE TABLE secrets_control (value text)")
        .execute(&pool)
        .await
        .unwrap();
    sqlx::query("INSERT INTO secrets_control VALUES ($1)")
        .bind(&secret.raw)
        .execute(&pool)
        .await
        .unwrap();
    assert!(
        secret.found_in(&dump(&pg)).contains(&secret.raw),
        "the dump misses a table"
    );
    eprintln!(
        "secrets: {} texts ({bytes} bytes) searched; no password; {:?} in all",
        run.texts.len(),
        started.elapsed()
    );
}

/// The read commands, each in text and JSON.
fn read_commands(id: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    for args in [
        vec!["shard", "list"],
        vec!["db", "status"],
        vec!["version", "list", "--collection", "orders"],
        vec!["migration", "list"],
        vec!["migration", "show", id],
        vec!["migration", "status", id],
        vec!["migration", "status", id, "--partitions"],
        vec!["migration", "history", id],
        vec!["router", "list"],
        vec!["throttle", "show", id],
        vec!["deadletter", "list", id],
        vec!["reconcile", "show", id],
        vec![
            "route",
            "explain",
            "--collection",
            "orders",
            "--tenant",
            "cust-hot",
            "--id",
            "seed-0000001",
        ],
    ] {
        let args: Vec<String> = args.into_iter().map(String::from).collect();
        out.push(args.clone());
        out.push(
            ["--output", "json"]
                .into_iter()
                .map(String::from)
                .chain(args)
                .collect(),
        );
    }
    out
}

/// The playbook: orders from two shards to three, the hot customer over 8 buckets, with an
/// approval before cleanup; every task on the external worker.
fn playbook(s1_uri: &str, s2_file: &str) -> String {
    format!(
        r#"apiVersion: reshard/v1
name: secrets
collection: orders
shards:
  - {{name: s1, uri: "{s1_uri}", database: shop_s1}}
  - {{name: s2, uri: "${{file:{s2_file}}}", database: shop_s2}}
  - {{name: s3, uri: "${{RESHARD_S3_URI}}", database: shop_s3}}
source:
  version: 1
target:
  tenant_key: customerId
  layout: hashed
  virtual_buckets: 1024
  tenant_buckets: [{{tenant: cust-hot, buckets: 8}}]
  routing_field: bucket
  placement:
    - {{vbuckets: [0, 340], shard: s1}}
    - {{vbuckets: [340, 680], shard: s2}}
    - {{vbuckets: [680, 1024], shard: s3}}
settings:
  max_docs_per_sec: 20000
  batch_size: 200
  documents_per_partition: 600
capacity:
  per_shard_write_limit: 100
  headroom: 0.3
  timestamp_field: createdAt
  window: 10m
steps:
  - advance: dual_read
  - advance: {{to: write_switch, switch_timeout: 10s}}
  - backfill: {{workers: 0}}
  - reconcile: {{sample: 50, repair: true}}
  - advance: new_reads
  - name: approve-cleanup
    approve: {{message: "After cleanup the migration can no longer roll back."}}
  - cleanup: {{workers: 0}}
  - complete: {{}}
"#
    )
}
