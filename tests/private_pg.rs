//! Proves the private PostgreSQL fixture (tests/support/private_pg.rs): committed rows
//! survive a fast shutdown and a SIGKILL of the whole server, restarts keep the URL, pools
//! reconnect, `Drop` leaves no process or directory behind, and reshard's store migrates.

mod support;

use std::path::Path;
use std::time::{Duration, Instant};

use sqlx::postgres::PgConnection;
use sqlx::{Connection, PgPool};
use support::PrivatePg;

async fn rows(pool: &PgPool) -> Vec<(i32, String)> {
    sqlx::query_as("SELECT id, v FROM t ORDER BY id")
        .fetch_all(pool)
        .await
        .expect("SELECT from t")
}

async fn insert(pool: &PgPool, id: i32, v: &str) {
    sqlx::query("INSERT INTO t (id, v) VALUES ($1, $2)")
        .bind(id)
        .bind(v)
        .execute(pool)
        .await
        .expect("INSERT into t");
}

async fn assert_unreachable(url: &str) {
    let r = tokio::time::timeout(Duration::from_secs(5), PgConnection::connect(url)).await;
    assert!(
        matches!(r, Ok(Err(_))),
        "connecting to a stopped server should fail at once"
    );
}

/// Gone, or a zombie waiting for PID 1 to reap it.
fn process_gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with(['Z', 'X'])),
    }
}

#[tokio::test]
async fn rows_survive_stop_and_kill_and_restarts_keep_the_url() {
    let t = Instant::now();
    let pg = PrivatePg::start().await;
    let started = t.elapsed();
    let url = pg.url();
    let port = pg.port();
    assert!(pg.is_running());
    assert!(url.ends_with(&format!("127.0.0.1:{port}/reshard")), "{url}");
    assert!(pg.admin_url().ends_with("/postgres"));

    let pool = pg.new_pool().await;
    sqlx::query("CREATE TABLE t (id int PRIMARY KEY, v text NOT NULL)")
        .execute(&pool)
        .await
        .unwrap();
    insert(&pool, 1, "one").await;

    // Fast shutdown: nothing answers, then everything is back on the same URL.
    let t = Instant::now();
    pg.stop().await;
    let stopped = t.elapsed();
    assert!(!pg.is_running());
    assert!(pg.pids().is_empty());
    assert_unreachable(&url).await;
    let t = Instant::now();
    pg.start_again().await;
    let started_again = t.elapsed();
    assert_eq!(pg.port(), port);
    assert!(pg.is_running());
    // The pool made before the stop replaces its dead connections.
    assert_eq!(rows(&pool).await, [(1, "one".to_string())]);

    // SIGKILL of the postmaster and every child right after a commit: crash recovery
    // replays it (fsync is off, but the OS did not crash).
    insert(&pool, 2, "two").await;
    let before_kill = pg.pids();
    assert!(
        before_kill.len() > 1,
        "postmaster and children: {before_kill:?}"
    );
    let t = Instant::now();
    pg.kill().await;
    let killed = t.elapsed();
    assert!(!pg.is_running());
    for pid in &before_kill {
        assert!(process_gone(*pid), "pid {pid} survived kill()");
    }
    assert_unreachable(&url).await;
    let t = Instant::now();
    pg.start_again().await;
    let recovered = t.elapsed();
    assert_eq!(
        rows(&pool).await,
        [(1, "one".to_string()), (2, "two".to_string())]
    );
    assert!(pg.log_tail(20_000).contains("not properly shut down"));

    // restart() = stop + start_again; a fresh connection works too.
    let t = Instant::now();
    pg.restart().await;
    let restarted = t.elapsed();
    let mut conn = PgConnection::connect(&url).await.unwrap();
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM t")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(n, 2);
    conn.close().await.unwrap();

    // Killed twice in a row without a start in between, then Drop: nothing is left.
    pg.kill().await;
    pg.kill().await;
    pg.start_again().await;
    let pids = pg.pids();
    let dir = pg.dir().to_path_buf();
    pool.close().await;
    let t = Instant::now();
    drop(pg);
    let dropped = t.elapsed();
    for pid in &pids {
        assert!(process_gone(*pid), "pid {pid} survived Drop");
    }
    assert!(!Path::new(&dir).exists(), "{} survived Drop", dir.display());

    eprintln!(
        "private pg: start {started:?}, stop {stopped:?}, start again {started_again:?}, \
         kill {killed:?}, start after kill {recovered:?}, restart {restarted:?}, drop {dropped:?}"
    );
}

#[tokio::test]
async fn reshard_store_migrates_on_a_private_server() {
    let pg = PrivatePg::start().await;
    let store = reshard::store::Store::connect_unchecked(&pg.url())
        .await
        .expect("connect_unchecked");
    let applied = store.migrate().await.expect("migrate");
    assert!(!applied.is_empty(), "a fresh database gets every migration");
    assert_eq!(
        store.migrate().await.expect("migrate again"),
        Vec::<i64>::new()
    );

    // The store's pool is usable again after a crash of the server.
    pg.kill().await;
    pg.start_again().await;
    let t = Instant::now();
    loop {
        match store.applied_versions().await {
            Ok(v) => {
                assert_eq!(v.len(), applied.len());
                break;
            }
            Err(e) if t.elapsed() < Duration::from_secs(10) && e.is_unavailable() => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("store after restart: {e}"),
        }
    }
}
