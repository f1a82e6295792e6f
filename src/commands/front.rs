//! `reshard front --listen HOST:PORT [--users-file PATH] [--tls-cert-file PATH --tls-key-file
//! PATH]`: serves the MongoDB wire protocol until SIGINT/SIGTERM, then prints what it served.
//! `reshard front hash-user NAME`: prints a users-file entry for a password read from stdin.

use std::io::{BufRead, IsTerminal};
use std::path::Path;
use std::sync::Arc;

use rand::RngCore;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::cli::{FrontArgs, FrontCommand, HashUserArgs, OutputFormat};
use crate::error::{Error, Result};
use crate::front::auth::{self, Credential, UserName, Users};
use crate::front::tls::Tls;
use crate::front::{self, Front, Settings};
use crate::output;

pub async fn run(
    format: OutputFormat,
    database_url: Option<String>,
    args: FrontArgs,
) -> Result<()> {
    if let Some(FrontCommand::HashUser(hash)) = args.command {
        return hash_user(&hash);
    }
    if let Some(database) = &args.database {
        crate::names::database(database)
            .map_err(|e| Error::bad_input(format!("--database: {e}")))?;
    }
    let routing = match (&database_url, &args.database) {
        (Some(url), Some(database)) => Some((url.clone(), database.clone())),
        (Some(_), None) => {
            return Err(Error::bad_input(
                "--database NAME is needed with a state store: the logical database whose \
                 collections with routing versions the front routes",
            ))
        }
        (None, Some(_)) => {
            return Err(Error::bad_input(
                "--database routes collections by their routing versions, which live in the \
                 state store: give --database-url (or RESHARD_DATABASE_URL)",
            ))
        }
        (None, None) => None,
    };
    if let Some(addr) = args.metrics.metrics_addr {
        super::exporter::serve(addr).await?;
    }
    // Everything the front needs is read and checked before it listens.
    let users = args.users_file.as_deref().map(read_users).transpose()?;
    let tls = match (&args.tls_cert_file, &args.tls_key_file) {
        (Some(certificate), Some(key)) => Some(read_tls(certificate, key)?),
        _ => None,
    };
    let listener = TcpListener::bind(args.listen)
        .await
        .map_err(|e| Error::failed(format!("cannot listen on {}: {e}", args.listen)))?;
    let listening = listener.local_addr().unwrap_or(args.listen);
    if users.is_none() && !listening.ip().is_loopback() {
        tracing::warn!(listen = %listening,
            "front: no --users-file: every client that reaches this address may run every command");
    }
    let authentication = if users.is_some() {
        auth::MECHANISM
    } else {
        "off"
    };
    let user_count = users.as_ref().map_or(0, Users::len);
    let settings = Settings {
        // `getCmdLineOpts` reports the command line; a connection string on it (a future
        // passthrough URI) must not carry its password to every client that asks. The users
        // file's path is no secret, and the file holds no password.
        argv: std::env::args()
            .map(|arg| crate::redact::redact_uri(&arg))
            .collect(),
        users: users.map(Arc::new),
        tls: tls.clone(),
        ..Settings::default()
    };
    let engine = match &routing {
        Some((url, database)) => Some(
            start_engine(
                url,
                database,
                args.passthrough_uri.as_deref(),
                args.name.clone(),
                args.lease_ttl,
                listening,
            )
            .await?,
        ),
        None => {
            tracing::warn!("front: no state store (--database-url): answering the handshake and diagnostics only");
            None
        }
    };
    let front = Arc::new(match &engine {
        Some(engine) => Front::with_engine(settings, Arc::clone(engine)),
        None => Front::new(settings),
    });
    let (stop, shutdown) = watch::channel(false);
    tokio::spawn(async move {
        super::worker::wait_for_signal().await;
        tracing::info!("front: stopping: finishing the requests in flight");
        let _ = stop.send(true);
    });
    let uri = if tls.is_some() {
        format!("mongodb://{listening}/?tls=true")
    } else {
        format!("mongodb://{listening}/")
    };
    tracing::info!(listen = %listening, %authentication, users = user_count, tls = tls.is_some(),
        "front: listening ({uri})");
    let served = front::serve(listener, Arc::clone(&front), shutdown).await;
    if let Some(engine) = &engine {
        // Deregistered, so that no barrier waits for this front's lease to run out.
        engine.shutdown().await;
    }
    served.map_err(|e| Error::failed(format!("the front on {listening} failed: {e}")))?;
    let stats = front.stats();
    let value = serde_json::json!({
        "listen": listening.to_string(),
        "connections": stats.connections,
        "requests": stats.requests,
        "refused": stats.refused,
    });
    output::emit(format, &value, || {
        output::fields(&[
            ("listen", listening.to_string()),
            ("connections", stats.connections.to_string()),
            ("requests", stats.requests.to_string()),
            ("refused", stats.refused.to_string()),
        ])
    })
}

/// Connects to the state store (waiting for it up to the routers' start deadline), the
/// shards and the passthrough, and starts a router for every routed collection of `database`.
async fn start_engine(
    url: &str,
    database: &str,
    passthrough: Option<&str>,
    name: Option<String>,
    lease_ttl: Option<std::time::Duration>,
    listening: std::net::SocketAddr,
) -> Result<Arc<crate::front::Engine>> {
    let store = crate::store::Store::connect_lazy(url)?;
    let mut router =
        crate::router::RouterConfig::named(name.unwrap_or_else(|| format!("front {listening}")));
    if let Some(ttl) = lease_ttl {
        router.lease_ttl = ttl;
    }
    let deadline = router
        .connect_deadline
        .unwrap_or(std::time::Duration::from_secs(120));
    let started = std::time::Instant::now();
    loop {
        match store
            .check_reachable()
            .await
            .and(store.check_schema().await)
        {
            Ok(()) => break,
            Err(e) if e.is_unavailable() && started.elapsed() < deadline => {
                tracing::warn!(error = %crate::redact::redact_uri(&e.to_string()),
                    "front: cannot reach the state store; trying again");
                tokio::time::sleep(std::time::Duration::from_secs(2)).await;
            }
            Err(e) => return Err(e.into()),
        }
    }
    let shards = crate::shards::Shards::connect(&store.shards().await?, false)
        .await
        .map_err(|e| Error::failed(e.to_string()))?;
    let passthrough = match passthrough {
        Some(uri) => Some(
            crate::shards::passthrough::Passthrough::connect(uri)
                .await
                .map_err(|e| Error::bad_input(format!("--passthrough-uri: {e}")))?,
        ),
        None => None,
    };
    let config = crate::front::EngineConfig {
        database: database.to_owned(),
        router,
    };
    let engine = crate::front::Engine::start(store, shards, passthrough, config)
        .await
        .map_err(|e| Error::failed(format!("the front cannot start its routers: {e}")))?;
    tokio::spawn(Arc::clone(&engine).follow());
    let reaped = Arc::clone(&engine);
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(std::time::Duration::from_secs(60)).await;
            reaped.cursors.reap();
        }
    });
    let routed: Vec<String> = engine.routed_collections().into_iter().collect();
    tracing::info!(database, routed = ?routed, passthrough = engine.passthrough().is_some(),
        "front: routing");
    Ok(engine)
}

/// The users of `--users-file`; an unreadable or wrong file is bad input naming it and each
/// problem's field.
fn read_users(path: &Path) -> Result<Users> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        Error::bad_input(format!(
            "--users-file {}: cannot read it: {e}",
            path.display()
        ))
    })?;
    Users::from_json(&text).map_err(|error| {
        let mut message = format!("--users-file {}:", path.display());
        for problem in &error.problems {
            message.push_str("\n  ");
            message.push_str(problem);
        }
        Error::bad_input(message)
    })
}

fn read_tls(certificate: &Path, key: &Path) -> Result<Tls> {
    let read = |flag: &str, path: &Path| {
        std::fs::read(path).map_err(|e| {
            Error::bad_input(format!("{flag} {}: cannot read it: {e}", path.display()))
        })
    };
    let certificate_pem = read("--tls-cert-file", certificate)?;
    let key_pem = read("--tls-key-file", key)?;
    Tls::from_pem(&certificate_pem, &key_pem).map_err(|e| {
        Error::bad_input(format!(
            "--tls-cert-file {} and --tls-key-file {}: {e}",
            certificate.display(),
            key.display()
        ))
    })
}

/// Prints the users-file entry of a password read from stdin. The password is never an
/// argument (it would sit in the shell's history and in every process listing) and never
/// printed.
fn hash_user(args: &HashUserArgs) -> Result<()> {
    if args.name.is_empty() {
        return Err(Error::bad_input("the user's name must not be empty"));
    }
    crate::names::database(&args.db).map_err(|e| Error::bad_input(format!("--db: {e}")))?;
    let name = UserName::new(args.name.clone(), args.db.clone());
    let password = read_password(&name)?;
    let mut salt = [0u8; auth::SALT_LEN];
    rand::rngs::OsRng.fill_bytes(&mut salt);
    let credential = Credential::from_password(&password, &salt, args.iterations)
        .map_err(|e| Error::bad_input(e.to_string()))?;
    output::json(&auth::entry(&name, &credential))
}

/// The password: asked twice on the terminal, without echo; else the first line of stdin,
/// without its line ending (so `printf %s "$PW" | reshard front hash-user NAME` and a file
/// with a newline after the password both work).
fn read_password(name: &UserName) -> Result<String> {
    let stdin = std::io::stdin();
    if stdin.is_terminal() {
        let term = console::Term::stderr();
        let ask = |prompt: &str| -> Result<String> {
            term.write_str(prompt)
                .and_then(|()| term.read_secure_line())
                .map_err(|e| Error::failed(format!("cannot read the password: {e}")))
        };
        let password = ask(&format!("password for {name}: "))?;
        if ask("again: ")? != password {
            return Err(Error::bad_input("the two passwords differ"));
        }
        return Ok(password);
    }
    let mut line = String::new();
    stdin
        .lock()
        .read_line(&mut line)
        .map_err(|e| Error::bad_input(format!("cannot read the password from stdin: {e}")))?;
    if let Some(stripped) = line.strip_suffix('\n') {
        line.truncate(stripped.strip_suffix('\r').unwrap_or(stripped).len());
    }
    if line.is_empty() {
        return Err(Error::bad_input(
            "no password on stdin (write it to stdin, never as an argument)",
        ));
    }
    Ok(line)
}
