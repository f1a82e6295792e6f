//! `reshard front --listen HOST:PORT`: serves the MongoDB wire protocol until SIGINT/SIGTERM,
//! then prints what it served.

use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::cli::{FrontArgs, OutputFormat};
use crate::error::{Error, Result};
use crate::front::{self, Front, Settings};
use crate::output;

pub async fn run(format: OutputFormat, args: FrontArgs) -> Result<()> {
    let listener = TcpListener::bind(args.listen)
        .await
        .map_err(|e| Error::failed(format!("cannot listen on {}: {e}", args.listen)))?;
    let listening = listener.local_addr().unwrap_or(args.listen);
    let settings = Settings {
        // `getCmdLineOpts` reports the command line; a connection string on it (a future
        // passthrough URI) must not carry its password to every client that asks.
        argv: std::env::args()
            .map(|arg| crate::redact::redact_uri(&arg))
            .collect(),
        ..Settings::default()
    };
    let front = Arc::new(Front::new(settings));
    let (stop, shutdown) = watch::channel(false);
    tokio::spawn(async move {
        super::worker::wait_for_signal().await;
        tracing::info!("front: stopping: finishing the requests in flight");
        let _ = stop.send(true);
    });
    tracing::info!(listen = %listening, "front: listening (mongodb://{listening}/)");
    front::serve(listener, Arc::clone(&front), shutdown)
        .await
        .map_err(|e| Error::failed(format!("the front on {listening} failed: {e}")))?;
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
