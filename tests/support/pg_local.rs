//! [`PgDb`] on an existing PostgreSQL server (`RESHARD_TEST_PG_URL`).

use sqlx::postgres::PgPool;

use super::common::unique_name;

pub const DEFAULT_PG_URL: &str = "postgres://postgres@127.0.0.1:5432/postgres";

/// A fresh, uniquely named database (`reshard_t_...`), dropped `WITH (FORCE)` on `Drop`.
pub struct PgDb {
    name: String,
    admin_url: String,
    url: String,
    pool: tokio::sync::OnceCell<PgPool>,
}

impl PgDb {
    /// The admin URL test databases are created from: `$RESHARD_TEST_PG_URL`, else
    /// `postgres://postgres@127.0.0.1:5432/postgres`.
    pub fn default_admin_url() -> String {
        match std::env::var("RESHARD_TEST_PG_URL") {
            Ok(u) if !u.is_empty() => u,
            _ => DEFAULT_PG_URL.to_string(),
        }
    }

    /// Admin URL (maintenance database) of the server holding this database.
    pub fn admin_url(&self) -> String {
        self.admin_url.clone()
    }

    /// Creates the database (the pool connects on the first `pool().await`).
    pub async fn fresh() -> PgDb {
        let admin_url = Self::default_admin_url();
        let name = unique_name("reshard_t");
        super::pg_common::create_database(&admin_url, &name).await;
        let url = super::pg_common::with_database(&admin_url, &name);
        PgDb {
            name,
            admin_url,
            url,
            pool: tokio::sync::OnceCell::new(),
        }
    }

    /// URL of this database (for `RESHARD_DATABASE_URL`).
    pub fn url(&self) -> String {
        self.url.clone()
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// A pool (max 8 connections) on this database, connected on first call; later calls
    /// return clones of it. Bound to the tokio runtime of the first call.
    pub async fn pool(&self) -> PgPool {
        self.pool
            .get_or_init(|| super::pg_common::connect_pool(&self.url))
            .await
            .clone()
    }
}

impl Drop for PgDb {
    fn drop(&mut self) {
        super::pg_common::drop_database_blocking(&self.admin_url, &self.name);
    }
}

impl std::fmt::Debug for PgDb {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgDb").field("url", &self.url).finish()
    }
}
