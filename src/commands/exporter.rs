//! `--metrics-addr`: installs the Prometheus recorder and serves `/metrics` (the text
//! exposition format; every metric is named, with its help, from the start, recorded or not)
//! and `/healthz` on a plain HTTP listener; and `reshard exporter`, which serves every
//! migration's state read from the state store, so that a dashboard shows a migration between
//! its workers too.
//!
//! The listener is ours rather than the exporter crate's `http-listener`: that one answers
//! every path with the metrics (no 404, `/health` not `/healthz`), renders only what was
//! recorded (so a family not recorded yet would be missing, see
//! [`telemetry::with_every_family`]) and brings hyper's server into the build.

use std::net::SocketAddr;
use std::time::Duration;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use crate::cli::ExporterArgs;
use crate::commands::Ctx;
use crate::error::{Error, Result};
use crate::phase::Phase;
use crate::telemetry::{self, Sample};

/// Installs the recorder and starts serving at `addr`. Returns the address bound (the port
/// may be 0 in `addr`).
pub async fn serve(addr: SocketAddr) -> Result<SocketAddr> {
    serve_with(addr, None).await
}

/// [`serve`], dropping a gauge not set again within `gauges_age_out` (the exporter's: a
/// migration deleted or a router forgotten leaves no series behind).
async fn serve_with(addr: SocketAddr, gauges_age_out: Option<Duration>) -> Result<SocketAddr> {
    let listener = TcpListener::bind(addr).await.map_err(|e| {
        Error::bad_input(format!("--metrics-addr {addr}: cannot listen there: {e}"))
    })?;
    let bound = listener
        .local_addr()
        .map_err(|e| Error::failed(e.to_string()))?;
    let mut builder = PrometheusBuilder::new();
    if let Some(after) = gauges_age_out {
        builder = builder.idle_timeout(metrics_util::MetricKindMask::GAUGE, Some(after));
    }
    let handle = builder
        .set_buckets_for_metric(
            Matcher::Suffix("_seconds".into()),
            telemetry::SECONDS_BUCKETS,
        )
        .map_err(|e| Error::failed(format!("metrics: {e}")))?
        .install_recorder()
        .map_err(|e| Error::failed(format!("metrics: {e}")))?;
    telemetry::describe();
    telemetry::build_info();
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

/// A migration that ended is still exported this long after it ended (its last phase shows on
/// a dashboard); then its series age out.
const ENDED_SHOWN_FOR: Duration = Duration::from_secs(24 * 3600);

/// `reshard exporter`: reads every migration's state every `--interval` and serves it.
pub async fn run(ctx: &Ctx, args: ExporterArgs) -> Result<()> {
    // A build_info gauge set once must not age out: it is set again at every refresh.
    let bound = serve_with(args.metrics_addr, Some(args.interval * 3)).await?;
    tracing::info!(%bound, interval = ?args.interval, "exporting every migration's state");
    let stop = super::worker::wait_for_signal();
    tokio::pin!(stop);
    let mut tick = tokio::time::interval(args.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut refreshes = 0_u64;
    loop {
        tokio::select! {
            _ = &mut stop => break,
            _ = tick.tick() => {}
        }
        match refresh(ctx).await {
            Ok(n) => {
                refreshes += 1;
                telemetry::refreshed(true);
                tracing::debug!(migrations = n, "refreshed");
            }
            Err(e) => {
                telemetry::refreshed(false);
                tracing::warn!(error = %e, "could not read the state store; the last values stay until they age out");
            }
        }
    }
    let value = serde_json::json!({ "metrics_addr": bound.to_string(), "refreshes": refreshes });
    crate::output::emit(ctx.output, &value, || {
        crate::output::fields(&[
            ("metrics addr", bound.to_string()),
            ("refreshes", refreshes.to_string()),
        ])
    })
}

/// Sets every gauge from the store once; returns how many migrations it exported.
async fn refresh(ctx: &Ctx) -> Result<usize> {
    telemetry::build_info();
    let now = chrono::Utc::now();
    let mut exported = 0;
    for m in ctx.store.migrations(true).await? {
        let ended_long_ago = m
            .finished_at
            .is_some_and(|at| (now - at).to_std().unwrap_or_default() > ENDED_SHOWN_FOR);
        if ended_long_ago {
            continue;
        }
        let status = crate::driver::status::value(&ctx.store, m.id).await?;
        for sample in samples(&status) {
            telemetry::set(&sample);
        }
        exported += 1;
    }
    Ok(exported)
}

/// The gauges of one migration, from what `migration status --output json` prints of it.
fn samples(status: &serde_json::Value) -> Vec<Sample> {
    let migration = status["migration_id"].to_string();
    let collection = status["collection"].as_str().unwrap_or_default().to_owned();
    let labels = || {
        vec![
            ("migration", migration.clone()),
            ("collection", collection.clone()),
        ]
    };
    let with = |k: &'static str, v: &str| {
        let mut l = labels();
        l.push((k, v.to_owned()));
        l
    };
    let number = |v: &serde_json::Value| v.as_f64().unwrap_or(0.0);
    let count = |v: &serde_json::Value| match v {
        serde_json::Value::Array(items) => items.len() as f64,
        other => number(other),
    };
    let phase = status["phase"].as_str().unwrap_or_default();
    let mut out: Vec<Sample> = Phase::ALL
        .iter()
        .map(|p| Sample {
            name: telemetry::MIGRATION_PHASE,
            labels: with("phase", p.as_str()),
            value: f64::from(u8::from(p.as_str() == phase)),
        })
        .collect();
    let epoch = status["epoch"].as_i64().unwrap_or(0);
    for (name, value) in [
        (telemetry::MIGRATION_EPOCH, epoch as f64),
        (
            telemetry::MIGRATION_PAUSED,
            f64::from(u8::from(status["paused"].as_bool().unwrap_or(false))),
        ),
        (
            telemetry::MIGRATION_RATE,
            number(&status["backfill"]["docs_per_sec"]),
        ),
        (telemetry::MIGRATION_WORKERS, count(&status["workers"])),
        (
            telemetry::MIGRATION_FINDINGS_OPEN,
            number(&status["findings_open"]),
        ),
        (
            telemetry::MIGRATION_BYPASSES_OPEN,
            number(&status["bypasses"]["open"]),
        ),
        (
            telemetry::MIGRATION_DEAD_LETTERS_OPEN,
            number(&status["backfill"]["dead_letters_open"]),
        ),
        (
            telemetry::MIGRATION_SHADOW_MISMATCHES_OPEN,
            number(&status["shadow_reads"]["open_mismatches"]),
        ),
    ] {
        out.push(Sample {
            name,
            labels: labels(),
            value,
        });
    }
    let progress = &status["progress"];
    if let (Some(task), Some(left)) = (
        progress["task"].as_str(),
        progress["documents_left"].as_f64(),
    ) {
        out.push(Sample {
            name: telemetry::MIGRATION_DOCUMENTS_LEFT,
            labels: with("task", task),
            value: left,
        });
    }
    if let Some(eta) = progress["eta_secs"].as_f64() {
        out.push(Sample {
            name: telemetry::MIGRATION_ETA,
            labels: labels(),
            value: eta,
        });
    }
    for router in status["routers"].as_array().into_iter().flatten() {
        let behind = match router["acknowledged_epoch"].as_i64() {
            Some(acked) => (epoch - acked).max(0),
            None => epoch + 1,
        };
        out.push(Sample {
            name: telemetry::ROUTER_EPOCHS_BEHIND,
            labels: with("router", router["name"].as_str().unwrap_or_default()),
            value: behind as f64,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn value_of(samples: &[Sample], name: &str, label: Option<(&str, &str)>) -> Option<f64> {
        samples
            .iter()
            .find(|s| {
                s.name == name
                    && label
                        .is_none_or(|(k, v)| s.labels.iter().any(|(lk, lv)| *lk == k && lv == v))
            })
            .map(|s| s.value)
    }

    #[test]
    fn a_migration_in_backfill_exports_its_phase_progress_and_lagging_router() {
        let status = json!({
            "migration_id": 7, "collection": "shop.orders", "phase": "backfill", "epoch": 4,
            "paused": true, "findings_open": 2,
            "backfill": { "docs_per_sec": 120.5, "dead_letters_open": 3 },
            "bypasses": { "open": 1 }, "shadow_reads": { "open_mismatches": 0 },
            "workers": [{ "name": "w1" }],
            "progress": { "task": "backfill", "documents_left": 900, "eta_secs": 8 },
            "routers": [
                { "name": "app-1", "acknowledged_epoch": 4 },
                { "name": "app-2", "acknowledged_epoch": 2 },
                { "name": "app-3", "acknowledged_epoch": null }
            ],
        });
        let s = samples(&status);
        let phases: Vec<&Sample> = s
            .iter()
            .filter(|s| s.name == telemetry::MIGRATION_PHASE)
            .collect();
        assert_eq!(phases.len(), Phase::ALL.len());
        assert_eq!(phases.iter().map(|p| p.value).sum::<f64>(), 1.0);
        assert_eq!(
            value_of(&s, telemetry::MIGRATION_PHASE, Some(("phase", "backfill"))),
            Some(1.0)
        );
        assert_eq!(
            value_of(&s, telemetry::MIGRATION_PHASE, Some(("phase", "cleanup"))),
            Some(0.0)
        );
        assert_eq!(value_of(&s, telemetry::MIGRATION_EPOCH, None), Some(4.0));
        assert_eq!(value_of(&s, telemetry::MIGRATION_PAUSED, None), Some(1.0));
        assert_eq!(value_of(&s, telemetry::MIGRATION_RATE, None), Some(120.5));
        assert_eq!(value_of(&s, telemetry::MIGRATION_WORKERS, None), Some(1.0));
        assert_eq!(
            value_of(&s, telemetry::MIGRATION_FINDINGS_OPEN, None),
            Some(2.0)
        );
        assert_eq!(
            value_of(&s, telemetry::MIGRATION_BYPASSES_OPEN, None),
            Some(1.0)
        );
        assert_eq!(
            value_of(&s, telemetry::MIGRATION_DEAD_LETTERS_OPEN, None),
            Some(3.0)
        );
        assert_eq!(
            value_of(
                &s,
                telemetry::MIGRATION_DOCUMENTS_LEFT,
                Some(("task", "backfill"))
            ),
            Some(900.0)
        );
        assert_eq!(value_of(&s, telemetry::MIGRATION_ETA, None), Some(8.0));
        let behind = |r| value_of(&s, telemetry::ROUTER_EPOCHS_BEHIND, Some(("router", r)));
        assert_eq!(behind("app-1"), Some(0.0));
        assert_eq!(behind("app-2"), Some(2.0));
        assert_eq!(behind("app-3"), Some(5.0));
        for sample in &s {
            assert!(
                sample.labels.contains(&("migration", "7".to_owned())),
                "{sample:?}"
            );
            assert!(
                sample
                    .labels
                    .contains(&("collection", "shop.orders".to_owned())),
                "{sample:?}"
            );
        }
    }

    #[test]
    fn an_unknown_eta_or_no_active_task_exports_no_value_rather_than_zero() {
        let status = json!({
            "migration_id": 3, "collection": "c", "phase": "dual_read", "epoch": 2,
            "progress": null, "routers": [],
        });
        let s = samples(&status);
        assert_eq!(
            value_of(&s, telemetry::MIGRATION_DOCUMENTS_LEFT, None),
            None
        );
        assert_eq!(value_of(&s, telemetry::MIGRATION_ETA, None), None);
        assert_eq!(
            value_of(&s, telemetry::MIGRATION_PHASE, Some(("phase", "dual_read"))),
            Some(1.0)
        );
        let eta_unknown = json!({ "migration_id": 3, "collection": "c", "phase": "backfill",
            "progress": { "task": "backfill", "documents_left": 10, "eta_secs": null } });
        assert_eq!(
            value_of(&samples(&eta_unknown), telemetry::MIGRATION_ETA, None),
            None
        );
    }
}
