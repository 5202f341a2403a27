//! `GET /metrics`: the documented series in the OpenMetrics text format, counters that grow with
//! I/O, cumulative histograms, no series per session, and an endpoint no client can hold.

use crate::support::{ME, ONE_TARGET, Running, TARGET, WAIT, connect, pattern, session};
use riser_initiator::Lun;
use riser_service::metrics::{self, CONTENT_TYPE};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// An HTTP answer: status, headers (names in lower case), body.
struct Answer {
    status: u16,
    headers: BTreeMap<String, String>,
    body: String,
}

/// Send `request` and read the answer to the end (the endpoint closes after each).
async fn http(addr: SocketAddr, request: &[u8]) -> Answer {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(request).await.unwrap();
    let mut raw = Vec::new();
    tokio::time::timeout(WAIT, s.read_to_end(&mut raw)).await.expect("answered and closed in time").unwrap();
    let text = String::from_utf8(raw).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or_else(|| panic!("an HTTP answer: {text:?}"));
    let mut lines = head.split("\r\n");
    let status = lines.next().unwrap().split(' ').nth(1).unwrap().parse().unwrap();
    let headers = lines
        .map(|l| {
            let (k, v) = l.split_once(':').unwrap();
            (k.trim().to_ascii_lowercase(), v.trim().to_string())
        })
        .collect::<BTreeMap<_, _>>();
    assert_eq!(headers.get("content-length").map(|n| n.parse::<usize>().unwrap()), Some(body.len()), "Content-Length is the body's");
    Answer { status, headers, body: body.to_string() }
}

async fn scrape(addr: SocketAddr) -> String {
    let a = http(addr, b"GET /metrics HTTP/1.1\r\nHost: riser\r\nAccept: application/openmetrics-text\r\n\r\n").await;
    assert_eq!(a.status, 200);
    assert_eq!(a.headers.get("content-type").map(String::as_str), Some(CONTENT_TYPE));
    assert!(a.body.ends_with("# EOF\n"), "an OpenMetrics exposition ends with # EOF");
    a.body
}

/// One sample: its name, labels and value.
#[derive(Debug, Clone)]
struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

fn samples(text: &str) -> Vec<Sample> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            let (series, value) = l.rsplit_once(' ').unwrap_or_else(|| panic!("a sample line: {l:?}"));
            let value = value.parse::<f64>().unwrap_or_else(|_| panic!("a number: {l:?}"));
            let (name, labels) = match series.split_once('{') {
                None => (series.to_string(), BTreeMap::new()),
                Some((n, rest)) => {
                    let inner = rest.strip_suffix('}').unwrap_or_else(|| panic!("labels: {l:?}"));
                    let mut labels = BTreeMap::new();
                    let mut s = inner;
                    while !s.is_empty() {
                        let (k, rest) = s.split_once("=\"").unwrap();
                        let end = rest.find('"').unwrap();
                        labels.insert(k.to_string(), rest[..end].to_string());
                        s = rest[end + 1..].trim_start_matches(',');
                    }
                    (n.to_string(), labels)
                }
            };
            Sample { name, labels, value }
        })
        .collect()
}

/// The value of the one sample named `name` whose labels include `with`.
fn value(all: &[Sample], name: &str, with: &[(&str, &str)]) -> f64 {
    let found: Vec<&Sample> =
        all.iter().filter(|s| s.name == name && with.iter().all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))).collect();
    assert_eq!(found.len(), 1, "one sample {name} {with:?}: {found:?}");
    found[0].value
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_show_the_documented_series_and_grow_with_io() {
    let r = Running::start("metrics", ONE_TARGET).await;
    let ep = metrics::serve(r.svc.target().clone(), "127.0.0.1:0".parse().unwrap()).await.unwrap();
    let addr = ep.local_addr();
    assert_ne!(addr.port(), 0);
    let s = session(r.addr, ME, TARGET).await;
    s.write(Lun::ZERO, 0, pattern(1, 4096), 512).await.unwrap();
    assert!(s.read(Lun::ZERO, 1 << 30, 1, 512).await.is_err(), "an error, counted");
    assert!(connect(r.addr, ME, "iqn.2026-11.io.riser:nothing").await.is_err(), "a failed login, counted");

    // The failed login's connection is counted until the target has closed it.
    crate::support::until("one TCP connection", || async {
        samples(&scrape(addr).await).iter().any(|s| s.name == "riser_connections" && s.labels["transport"] == "tcp" && s.value == 1.0)
    })
    .await;
    let first = scrape(addr).await;
    assert_eq!(first, metrics::render(r.svc.target()), "render is what the endpoint serves");
    for name in [
        "riser_lun_read_bytes_total",
        "riser_lun_write_bytes_total",
        "riser_lun_commands_total",
        "riser_lun_errors_total",
        "riser_lun_command_duration_seconds_bucket",
        "riser_lun_command_duration_seconds_count",
        "riser_lun_command_duration_seconds_sum",
        "riser_sessions",
        "riser_connections",
        "riser_logins_total",
        "riser_login_failures_total",
        "riser_command_data_bytes",
        "riser_command_data_limit_bytes",
        "riser_build_info",
    ] {
        assert!(first.lines().any(|l| l.starts_with(&format!("{name}{{")) || l.starts_with(&format!("{name} "))), "{name} is served");
    }
    for (name, kind) in
        [("riser_lun_read_bytes", "counter"), ("riser_lun_command_duration_seconds", "histogram"), ("riser_sessions", "gauge")]
    {
        assert!(first.contains(&format!("# TYPE {name} {kind}\n")), "{name} is a {kind}");
    }
    let a = samples(&first);
    let lun0 = [("target", TARGET), ("lun", "0")];
    assert_eq!(value(&a, "riser_sessions", &[("target", TARGET)]), 1.0);
    assert_eq!(value(&a, "riser_connections", &[("transport", "tcp")]), 1.0);
    assert_eq!(value(&a, "riser_lun_errors_total", &[("target", TARGET), ("lun", "0"), ("sense_key", "illegal_request")]), 1.0);
    assert_eq!(a.iter().filter(|s| s.name == "riser_login_failures_total").map(|s| s.value).sum::<f64>(), 1.0);
    assert_eq!(value(&a, "riser_build_info", &[("version", env!("CARGO_PKG_VERSION"))]), 1.0);
    assert!(value(&a, "riser_command_data_limit_bytes", &[]) > 0.0);
    let ops: Vec<&str> = a
        .iter()
        .filter(|s| s.name == "riser_lun_commands_total" && s.labels.get("lun").map(String::as_str) == Some("0"))
        .map(|s| s.labels["op"].as_str())
        .collect();
    for op in ["read", "write", "write_same", "unmap", "compare_and_write", "sync_cache", "verify", "other"] {
        assert!(ops.contains(&op), "op {op}: {ops:?}");
    }

    // I/O between two scrapes: the counters grow by what was done.
    s.write(Lun::ZERO, 8, pattern(2, 8192), 512).await.unwrap();
    s.read(Lun::ZERO, 0, 24, 512).await.unwrap();
    let b = samples(&scrape(addr).await);
    let grew = |name: &str, with: &[(&str, &str)]| value(&b, name, with) - value(&a, name, with);
    assert_eq!(grew("riser_lun_write_bytes_total", &lun0), 8192.0);
    assert_eq!(grew("riser_lun_read_bytes_total", &lun0), 12288.0);
    assert_eq!(grew("riser_lun_commands_total", &[("target", TARGET), ("lun", "0"), ("op", "write")]), 1.0);
    assert_eq!(grew("riser_lun_commands_total", &[("target", TARGET), ("lun", "0"), ("op", "read")]), 1.0);
    assert_eq!(grew("riser_lun_command_duration_seconds_count", &lun0), 2.0);
    assert!(grew("riser_lun_command_duration_seconds_sum", &lun0) > 0.0);

    // Histogram buckets: cumulative, non-decreasing with le, +Inf equal to the count; every
    // command of the LUN counted once.
    for samples in [&a, &b] {
        let mut buckets: Vec<(f64, f64)> = samples
            .iter()
            .filter(|s| s.name == "riser_lun_command_duration_seconds_bucket" && s.labels.get("lun").map(String::as_str) == Some("0"))
            .map(|s| (if s.labels["le"] == "+Inf" { f64::INFINITY } else { s.labels["le"].parse().unwrap() }, s.value))
            .collect();
        assert_eq!(buckets.len(), 17, "16 bounds and +Inf");
        buckets.sort_by(|x, y| x.0.total_cmp(&y.0));
        assert!(buckets.windows(2).all(|w| w[0].1 <= w[1].1), "cumulative: {buckets:?}");
        assert_eq!(buckets.last().unwrap().0, f64::INFINITY);
        let count = value(samples, "riser_lun_command_duration_seconds_count", &lun0);
        assert_eq!(buckets.last().unwrap().1, count, "le=\"+Inf\" is the count");
        let commands: f64 = samples
            .iter()
            .filter(|s| s.name == "riser_lun_commands_total" && s.labels.get("lun").map(String::as_str) == Some("0"))
            .map(|s| s.value)
            .sum();
        assert_eq!(count, commands);
    }
    // No series per session: nothing names a session, an initiator or a peer.
    for s in &b {
        for k in ["tsih", "isid", "initiator", "session", "peer", "cid"] {
            assert!(!s.labels.contains_key(k), "no per-session label {k}: {s:?}");
        }
    }
    assert!(!first.contains(ME), "no initiator name in the metrics");

    // The session goes: the gauge follows, the counters stay.
    s.logout().await.unwrap();
    crate::support::until("the session is gone", || async { !scrape(addr).await.contains("riser_sessions{") }).await;
    let c = samples(&scrape(addr).await);
    assert_eq!(value(&c, "riser_lun_write_bytes_total", &lun0), value(&b, "riser_lun_write_bytes_total", &lun0));
    assert_eq!(value(&c, "riser_connections", &[("transport", "tcp")]), 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_metrics_endpoint_refuses_what_is_not_a_scrape_and_cannot_be_held() {
    let r = Running::start("metrics-bad", ONE_TARGET).await;
    let ep = metrics::serve(r.svc.target().clone(), "127.0.0.1:0".parse().unwrap()).await.unwrap();
    let addr = ep.local_addr();
    for (req, status) in [
        (&b"GET /other HTTP/1.1\r\n\r\n"[..], 404),
        (b"GET / HTTP/1.0\r\n\r\n", 404),
        (b"GET /metrics/x HTTP/1.1\r\n\r\n", 404),
        (b"POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n", 405),
        (b"DELETE /metrics HTTP/1.1\r\n\r\n", 405),
        (b"HEAD /metrics HTTP/1.1\r\n\r\n", 405),
        (b"GET /metrics\r\n\r\n", 400),
        (b"GET /metrics SPDY/3\r\n\r\n", 400),
        (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n", 400),
        (b"hello\n\n", 400),
    ] {
        let a = http(addr, req).await;
        assert_eq!(a.status, status, "{:?}", String::from_utf8_lossy(req));
        assert!(!a.body.contains("riser_"), "no metrics to a bad request");
    }
    // A request head larger than the endpoint reads: 400, not an endless read.
    let mut huge = b"GET /metrics HTTP/1.1\r\n".to_vec();
    huge.extend(std::iter::repeat_n(b"X-Filler: 0123456789abcdef0123456789abcdef\r\n".as_slice(), 400).flatten());
    huge.extend_from_slice(b"\r\n");
    let mut s = TcpStream::connect(addr).await.unwrap();
    let _ = s.write_all(&huge).await;
    let mut raw = Vec::new();
    let _ = tokio::time::timeout(WAIT, s.read_to_end(&mut raw)).await.expect("answered and closed in time");
    assert!(String::from_utf8_lossy(&raw).starts_with("HTTP/1.1 400"), "{:?}", String::from_utf8_lossy(&raw));

    // A client that sends nothing: scrapes are served meanwhile, and it is closed within the
    // head timeout (5 s).
    let t0 = Instant::now();
    let mut silent = TcpStream::connect(addr).await.unwrap();
    let mut half = TcpStream::connect(addr).await.unwrap();
    half.write_all(b"GET /metr").await.unwrap();
    for _ in 0..3 {
        scrape(addr).await;
    }
    assert!(t0.elapsed() < Duration::from_secs(2), "served while others hold connections open");
    for c in [&mut silent, &mut half] {
        let mut raw = Vec::new();
        tokio::time::timeout(Duration::from_secs(8), c.read_to_end(&mut raw)).await.expect("closed within the timeout").unwrap();
        assert!(String::from_utf8_lossy(&raw).starts_with("HTTP/1.1 408"), "{:?}", String::from_utf8_lossy(&raw));
    }
    assert!(t0.elapsed() < Duration::from_secs(8));
    scrape(addr).await;
    // Closed, it stops answering, and its address is free at once (a restart can take it).
    ep.close().await;
    assert!(TcpStream::connect(addr).await.is_err());
    for _ in 0..20 {
        let again = metrics::serve(r.svc.target().clone(), addr).await.expect("the address is free once close returns");
        scrape(addr).await;
        again.close().await;
    }
}
