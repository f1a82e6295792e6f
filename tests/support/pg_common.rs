//! PostgreSQL helpers shared by both [`super::PgDb`] backends.

use std::str::FromStr;
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgConnection, PgPool, PgPoolOptions};
use sqlx::{ConnectOptions, Connection, Executor};

/// `url` with its database (path) replaced by `db`; query string kept.
pub fn with_database(url: &str, db: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (url, None),
    };
    let after_scheme = base.find("://").map(|i| i + 3).unwrap_or(0);
    let base = match base[after_scheme..].find('/') {
        Some(i) => &base[..after_scheme + i],
        None => base,
    };
    match query {
        Some(q) => format!("{base}/{db}?{q}"),
        None => format!("{base}/{db}"),
    }
}

fn quiet(url: &str) -> PgConnectOptions {
    PgConnectOptions::from_str(url)
        .unwrap_or_else(|e| panic!("invalid PostgreSQL URL {url}: {e}"))
        .disable_statement_logging()
}

pub async fn create_database(admin_url: &str, name: &str) {
    let mut conn = PgConnection::connect_with(&quiet(admin_url)).await.unwrap_or_else(|e| {
        panic!(
            "cannot connect to PostgreSQL at {admin_url} (set RESHARD_TEST_PG_URL; is the server up? \
             `pg_isready -h 127.0.0.1`): {e}"
        )
    });
    conn.execute(format!(r#"CREATE DATABASE "{name}""#).as_str())
        .await
        .unwrap_or_else(|e| panic!("CREATE DATABASE {name}: {e}"));
    let _ = conn.close().await;
}

pub async fn connect_pool(url: &str) -> PgPool {
    PgPoolOptions::new()
        .max_connections(8)
        .acquire_timeout(Duration::from_secs(10))
        .connect_with(quiet(url))
        .await
        .unwrap_or_else(|e| panic!("connecting to {url}: {e}"))
}

pub async fn drop_database(admin_url: &str, name: &str) -> Result<(), sqlx::Error> {
    let mut conn = PgConnection::connect_with(&quiet(admin_url)).await?;
    conn.execute(format!(r#"DROP DATABASE IF EXISTS "{name}" WITH (FORCE)"#).as_str())
        .await?;
    let _ = conn.close().await;
    Ok(())
}

/// Drops the database from a fresh thread with its own runtime: `Drop` is synchronous and
/// may run inside (or while shutting down) the test's runtime. Never panics.
pub fn drop_database_blocking(admin_url: &str, name: &str) {
    let admin_url = admin_url.to_string();
    let name = name.to_string();
    let joined = std::thread::Builder::new()
        .name("pgdb-drop".into())
        .spawn(move || {
            let rt = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => return Err(format!("runtime: {e}")),
            };
            rt.block_on(async {
                tokio::time::timeout(Duration::from_secs(30), drop_database(&admin_url, &name))
                    .await
                    .map_err(|_| "timed out".to_string())?
                    .map_err(|e| e.to_string())
            })
            .map_err(|e| format!("DROP DATABASE {name}: {e}"))
        })
        .map(|h| h.join());
    match joined {
        Ok(Ok(Ok(()))) => {}
        Ok(Ok(Err(e))) => eprintln!("warning: {e}"),
        Ok(Err(_)) => eprintln!("warning: the thread dropping a test database panicked"),
        Err(e) => eprintln!("warning: cannot spawn a thread to drop a test database: {e}"),
    }
}
