//! [`Shards`]: several [`MongoServer`]s named `s1..sn`.

use super::{MongoServer, MongoServerBuilder};

/// `n` independent servers named `s1..sn` (one process each), started concurrently.
/// Derefs to `[MongoServer]`: `shards[0]` is `s1`.
#[derive(Debug)]
pub struct Shards {
    servers: Vec<MongoServer>,
}

impl Shards {
    /// `n` servers with default options.
    pub async fn start(n: usize) -> Shards {
        Self::start_with(n, MongoServer::builder()).await
    }

    /// `n` servers built from `builder` (its name is replaced by `s1..sn`).
    pub async fn start_with(n: usize, builder: MongoServerBuilder) -> Shards {
        let servers = futures::future::join_all(
            (1..=n).map(|i| builder.clone().name(format!("s{i}")).start()),
        )
        .await;
        Shards { servers }
    }

    /// The server named `name` (`s1`, ...); panics if there is none.
    pub fn get(&self, name: &str) -> &MongoServer {
        self.servers
            .iter()
            .find(|s| s.name() == name)
            .unwrap_or_else(|| panic!("no shard named {name}"))
    }

    /// `s1..sn`.
    pub fn names(&self) -> Vec<String> {
        self.servers.iter().map(|s| s.name().to_string()).collect()
    }

    /// `(name, uri)` for each shard, in order.
    pub fn uris(&self) -> Vec<(String, String)> {
        self.servers
            .iter()
            .map(|s| (s.name().to_string(), s.uri()))
            .collect()
    }

    pub fn into_vec(self) -> Vec<MongoServer> {
        self.servers
    }
}

impl std::ops::Deref for Shards {
    type Target = [MongoServer];
    fn deref(&self) -> &[MongoServer] {
        &self.servers
    }
}
