//! `--metrics-addr`: installs the Prometheus recorder and serves `/metrics` (the text
//! exposition format; every metric is named, with its help, from the start, recorded or not)
//! and `/healthz` on a plain HTTP listener.

use std::net::SocketAddr;
use std::time::Duration;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use crate::error::{Error, Result};
use crate::telemetry;

/// Installs the recorder and starts serving at `addr`. Returns the address bound (the port
/// may be 0 in `addr`).
pub async fn serve(addr: SocketAddr) -> Result<SocketAddr> {
    let listener = TcpListener::bind(addr).await.map_err(|e| {
        Error::bad_input(format!("--metrics-addr {addr}: cannot listen there: {e}"))
    })?;
    let bound = listener
        .local_addr()
        .map_err(|e| Error::failed(e.to_string()))?;
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(
            Matcher::Suffix("_seconds".into()),
            telemetry::SECONDS_BUCKETS,
        )
        .map_err(|e| Error::failed(format!("metrics: {e}")))?
        .install_recorder()
        .map_err(|e| Error::failed(format!("metrics: {e}")))?;
    telemetry::describe();
    let upkeep = handle.clone();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_secs(5)).await;
            upkeep.run_upkeep();
        }
    });
    tokio::spawn(async move {
        loop {
            let Ok((socket, _)) = listener.accept().await else {
                continue;
            };
            let handle = handle.clone();
            tokio::spawn(async move {
                let _ = answer(socket, &handle).await;
            });
        }
    });
    tracing::info!(%bound, "serving /metrics and /healthz");
    Ok(bound)
}

async fn answer(
    mut socket: tokio::net::TcpStream,
    handle: &PrometheusHandle,
) -> std::io::Result<()> {
    let mut request = Vec::new();
    let mut buf = [0_u8; 1024];
    // The request line and headers; a scraper sends no body with GET.
    while !request.windows(4).any(|w| w == b"\r\n\r\n") && request.len() < 16 * 1024 {
        let n = tokio::time::timeout(Duration::from_secs(5), socket.read(&mut buf))
            .await
            .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))??;
        if n == 0 {
            break;
        }
        request.extend_from_slice(&buf[..n]);
    }
    let line = String::from_utf8_lossy(&request);
    let path = line
        .lines()
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .unwrap_or("");
    let (status, content_type, body) = match path.split('?').next().unwrap_or("") {
        "/metrics" => (
            "200 OK",
            "text/plain; version=0.0.4",
            telemetry::with_every_family(&handle.render()),
        ),
        "/healthz" => ("200 OK", "text/plain", "ok\n".to_owned()),
        _ => (
            "404 Not Found",
            "text/plain",
            "reshard serves /metrics and /healthz\n".to_owned(),
        ),
    };
    let head = format!(
        "HTTP/1.1 {status}\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    socket.write_all(head.as_bytes()).await?;
    socket.write_all(body.as_bytes()).await?;
    socket.shutdown().await
}
