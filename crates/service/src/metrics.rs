//! The statistics as Prometheus metrics (OpenMetrics text, which Prometheus scrapes), at
//! `GET /metrics` on an address the operator gives (none by default).
//!
//! Names follow Prometheus conventions (base units, `_total` on counters): per LUN
//! `riser_lun_read_bytes_total`, `riser_lun_write_bytes_total`, `riser_lun_commands_total{op}`,
//! `riser_lun_errors_total{sense_key}`, `riser_lun_command_duration_seconds` (histogram), all
//! labelled `{target, lun}`; `riser_sessions{target}`, `riser_connections{transport}`,
//! `riser_logins_total`, `riser_login_failures_total{reason}`, `riser_command_data_bytes`,
//! `riser_command_data_limit_bytes`, `riser_build_info{version}`. No per-session labels: a
//! series per session would grow without bound. Everything is read from
//! [`Target::stats`] at each scrape, so counting costs the data path nothing more.
//!
//! The HTTP side is a few lines over tokio rather than an HTTP crate: one method on one path,
//! a bounded request head, a timeout, and the connection closed after each answer — what a
//! scraper needs, and nothing a client could hold open.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;
use riser_target::server::Target;
use riser_target::server::stats::{ERROR_NAMES, LATENCY_BOUNDS_US, LoginFailure, Op};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tracing::{info, warn};

/// The OpenMetrics text content type.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The largest request head the endpoint reads.
const MAX_HEAD: usize = 8 << 10;

/// Scrapes answered at once.
const MAX_SCRAPES: usize = 16;

/// A request head must arrive within this long.
const HEAD_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug)]
struct Riser(Arc<Target>);

type Labels = Vec<(&'static str, String)>;

fn counter(enc: &mut DescriptorEncoder<'_>, name: &str, help: &str, series: &[(Labels, u64)]) -> Result<(), std::fmt::Error> {
    let mut m = enc.encode_descriptor(name, help, None, MetricType::Counter)?;
    for (labels, v) in series {
        ConstCounter::new(*v).encode(m.encode_family(labels)?)?;
    }
    Ok(())
}

fn gauge(enc: &mut DescriptorEncoder<'_>, name: &str, help: &str, series: &[(Labels, i64)]) -> Result<(), std::fmt::Error> {
    let mut m = enc.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for (labels, v) in series {
        ConstGauge::new(*v).encode(m.encode_family(labels)?)?;
    }
    Ok(())
}

impl Collector for Riser {
    fn encode(&self, mut enc: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let st = self.0.stats();
        let lun = |t: &str, l: u16| vec![("target", t.to_string()), ("lun", l.to_string())];
        let per_lun = |f: &dyn Fn(&riser_target::server::stats::LunStats) -> u64| {
            st.luns.iter().map(|((t, l), s)| (lun(t, *l), f(s))).collect::<Vec<_>>()
        };
        counter(&mut enc, "riser_lun_read_bytes", "Bytes sent to initiators from the LUN", &per_lun(&|s| s.read_bytes))?;
        counter(&mut enc, "riser_lun_write_bytes", "Bytes written to the LUN's store", &per_lun(&|s| s.write_bytes))?;
        let mut commands = Vec::new();
        let mut errors = Vec::new();
        for ((t, l), s) in &st.luns {
            for op in Op::ALL {
                let mut labels = lun(t, *l);
                labels.push(("op", op.name().into()));
                commands.push((labels, s.commands[op.index()]));
            }
            for (i, name) in ERROR_NAMES.iter().enumerate() {
                if s.errors[i] > 0 {
                    let mut labels = lun(t, *l);
                    labels.push(("sense_key", (*name).into()));
                    errors.push((labels, s.errors[i]));
                }
            }
        }
        counter(&mut enc, "riser_lun_commands", "Commands ended on the LUN, by kind", &commands)?;
        counter(&mut enc, "riser_lun_errors", "Commands on the LUN that ended in error, by sense key (or status)", &errors)?;
        {
            let mut m = enc.encode_descriptor(
                "riser_lun_command_duration_seconds",
                "Time from a command's arrival to its status",
                None,
                MetricType::Histogram,
            )?;
            for ((t, l), s) in &st.luns {
                // Per bucket, not cumulative (the encoder sums them); +Inf is written as f64::MAX.
                let mut buckets: Vec<(f64, u64)> =
                    LATENCY_BOUNDS_US.iter().zip(s.latency_buckets).map(|(&b, n)| (b as f64 / 1e6, n)).collect();
                buckets.push((f64::MAX, s.latency_buckets[LATENCY_BOUNDS_US.len()]));
                let count = s.latency_buckets.iter().sum();
                let labels = lun(t, *l);
                m.encode_family(&labels)?.encode_histogram::<Labels>(s.latency_sum.as_secs_f64(), count, &buckets, None)?;
            }
        }
        let sessions: Vec<(Labels, i64)> = st.sessions.iter().map(|(t, n)| (vec![("target", t.clone())], *n as i64)).collect();
        gauge(&mut enc, "riser_sessions", "Normal sessions now, per target", &sessions)?;
        gauge(
            &mut enc,
            "riser_connections",
            "Connections now (in login or full feature phase), per transport",
            &[
                (vec![("transport", "tcp".into())], st.tcp_connections as i64),
                (vec![("transport", "iser".into())], st.iser_connections as i64),
            ],
        )?;
        counter(&mut enc, "riser_logins", "Logins that completed", &[(Vec::new(), st.logins)])?;
        let failures: Vec<(Labels, u64)> =
            LoginFailure::ALL.iter().map(|r| (vec![("reason", r.name().into())], st.login_failures[r.index()])).collect();
        counter(&mut enc, "riser_login_failures", "Logins that failed, by reason", &failures)?;
        gauge(
            &mut enc,
            "riser_command_data_bytes",
            "Command data the target holds now (write data collected, read data produced)",
            &[(Vec::new(), st.data_bytes as i64)],
        )?;
        gauge(
            &mut enc,
            "riser_command_data_limit_bytes",
            "The bound on command data the target holds (limits.max_target_bytes)",
            &[(Vec::new(), st.data_limit_bytes as i64)],
        )?;
        gauge(&mut enc, "riser_build_info", "The riser build serving", &[(vec![("version", env!("CARGO_PKG_VERSION").into())], 1)])?;
        Ok(())
    }
}

/// The metrics of `target` now, in the OpenMetrics text format.
pub fn render(target: &Arc<Target>) -> String {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(Riser(target.clone())));
    let mut out = String::new();
    // Writing to a String cannot fail.
    let _ = prometheus_client::encoding::text::encode(&mut out, &registry);
    out
}

/// The metrics endpoint, listening; it stops when dropped.
#[derive(Debug)]
pub struct MetricsEndpoint {
    addr: SocketAddr,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl MetricsEndpoint {
    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stop answering, and wait until the listening socket is closed: the address is free
    /// again when this returns (dropping the endpoint frees it only once the runtime gets round
    /// to dropping its task, so binding it again at once may fail).
    pub async fn close(mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
            let _ = task.await;
        }
    }
}

impl Drop for MetricsEndpoint {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}

/// Answer `GET /metrics` on `addr`.
pub async fn serve(target: Arc<Target>, addr: SocketAddr) -> std::io::Result<MetricsEndpoint> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let addr = listener.local_addr()?;
    info!(%addr, "metrics at GET /metrics");
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_SCRAPES));
    let task = tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            };
            let Ok(slot) = slots.clone().try_acquire_owned() else { continue };
            let target = target.clone();
            tokio::spawn(async move {
                if let Err(e) = answer(&target, stream).await {
                    warn!("metrics request: {e}");
                }
                drop(slot);
            });
        }
    });
    Ok(MetricsEndpoint { addr, task: Some(task) })
}

/// Read one request head, answer it, close.
async fn answer(target: &Arc<Target>, mut stream: tokio::net::TcpStream) -> std::io::Result<()> {
    let mut head = Vec::with_capacity(1024);
    let mut buf = [0u8; 1024];
    let complete = tokio::time::timeout(HEAD_TIMEOUT, async {
        while !head.windows(4).any(|w| w == b"\r\n\r\n") && !head.windows(2).any(|w| w == b"\n\n") {
            let n = stream.read(&mut buf).await?;
            if n == 0 || head.len() + n > MAX_HEAD {
                return Ok::<bool, std::io::Error>(false);
            }
            head.extend_from_slice(&buf[..n]);
        }
        Ok(true)
    })
    .await;
    let (status, content_type, body) = match complete {
        Ok(Ok(true)) => {
            let line = head.split(|&b| b == b'\n').next().unwrap_or_default();
            let line = String::from_utf8_lossy(line);
            let mut parts = line.trim_end().split(' ');
            match (parts.next(), parts.next(), parts.next()) {
                (Some("GET"), Some("/metrics"), Some(v)) if v.starts_with("HTTP/1.") => ("200 OK", CONTENT_TYPE, render(target)),
                (Some("GET"), Some(_), Some(v)) if v.starts_with("HTTP/1.") => {
                    ("404 Not Found", "text/plain", "GET /metrics\n".to_string())
                }
                (Some(_), Some(_), Some(v)) if v.starts_with("HTTP/1.") => {
                    ("405 Method Not Allowed", "text/plain", "GET /metrics\n".to_string())
                }
                _ => ("400 Bad Request", "text/plain", "not an HTTP/1 request\n".to_string()),
            }
        }
        Ok(Ok(false)) => ("400 Bad Request", "text/plain", "request head too large or incomplete\n".to_string()),
        Ok(Err(e)) => return Err(e),
        Err(_) => ("408 Request Timeout", "text/plain", String::new()),
    };
    let reply =
        format!("HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len());
    tokio::time::timeout(HEAD_TIMEOUT, stream.write_all(reply.as_bytes()))
        .await
        .map_err(|_| std::io::Error::other("the scraper takes nothing"))??;
    let _ = stream.shutdown().await;
    Ok(())
}
