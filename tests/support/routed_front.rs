//! A `reshard front` inside the test's runtime: it serves the world's `orders` as database
//! `shop` on a free port of this machine, through an [`Engine`] whose routers answer the
//! phase machine like any other.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use mongodb::Client;
use reshard::front::{Engine, EngineConfig, Front, Settings};
use reshard::router::{Router, RouterConfig};
use reshard::shards::passthrough::Passthrough;
use reshard::shards::Shards;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::support::World;

pub struct RoutedFront {
    addr: SocketAddr,
    engine: Arc<Engine>,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl RoutedFront {
    /// A front whose routers (named `name`) heartbeat every 200 ms and hold a many-document
    /// read in a switch for at most a second.
    pub async fn start(world: &World, name: &str) -> RoutedFront {
        Self::start_with(world, name, None).await
    }

    /// As [`RoutedFront::start`], sending what it does not route to `passthrough`.
    pub async fn start_with(
        world: &World,
        name: &str,
        passthrough: Option<Passthrough>,
    ) -> RoutedFront {
        let mut router = RouterConfig::named(name);
        router.heartbeat_interval = Duration::from_millis(200);
        router.hold_timeout = Duration::from_secs(1);
        let engine = Engine::start(
            world.store.clone(),
            Shards::new(world.shards.clone()),
            passthrough,
            EngineConfig {
                database: "shop".into(),
                router,
            },
        )
        .await
        .unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let front = Arc::new(Front::with_engine(Settings::default(), Arc::clone(&engine)));
        let (stop, shutdown) = watch::channel(false);
        let task = tokio::spawn(reshard::front::serve(listener, front, shutdown));
        RoutedFront {
            addr,
            engine,
            stop,
            task,
        }
    }

    /// The connection string (no retryable writes: each test says what it retries).
    pub fn uri(&self) -> String {
        format!(
            "mongodb://{}/?serverSelectionTimeoutMS=5000&retryWrites=false",
            self.addr
        )
    }

    pub async fn client(&self) -> Client {
        Client::with_uri_str(self.uri()).await.unwrap()
    }

    /// The engine's routers, one per collection it has served.
    pub async fn routers(&self) -> Vec<Router> {
        self.engine
            .routers()
            .await
            .into_iter()
            .map(|(_, r)| r)
            .collect()
    }

    /// Moves the migration through `phases`, the front's routers acknowledging each.
    pub async fn advance(&self, world: &World, phases: &[reshard::phase::Phase]) {
        let routers = self.routers().await;
        let refs: Vec<&Router> = routers.iter().collect();
        world.advance(&refs, phases).await;
    }

    pub async fn stop(self) {
        self.stop.send(true).unwrap();
        let _ = tokio::time::timeout(Duration::from_secs(10), self.task).await;
        self.engine.shutdown().await;
    }
}
