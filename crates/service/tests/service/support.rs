//! What the service tests share: private temporary directories, free ports, a service started
//! from a configuration file with its control socket, raw and typed control clients, sessions
//! of the riser initiator, data patterns, CDBs and sense checks.

use bytes::Bytes;
use riser_initiator::{Error, Lun, Session, SessionConfig};
use riser_iscsi::chap::ChapCredentials;
use riser_scsi::sense::{AscAscq, Sense, SenseKey, Status};
use riser_service::control::{self, Client, ControlSocket, RpcError};
use riser_service::{Service, Source};
use serde_json::Value;
use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};

pub(crate) const TARGET: &str = "iqn.2026-11.io.riser:svc";
pub(crate) const ME: &str = "iqn.2026-11.io.riser:me";
pub(crate) const OTHER: &str = "iqn.2026-11.io.riser:other";
/// How long a test waits for something the service owes.
pub(crate) const WAIT: Duration = Duration::from_secs(10);

/// Logs to the test's output with `RUST_LOG` set.
pub(crate) fn logging() {
    let _ = tracing_subscriber::fmt().with_env_filter(tracing_subscriber::EnvFilter::from_default_env()).with_test_writer().try_init();
}

/// A directory of mode 700 under the system's temporary directory, removed when dropped.
pub(crate) struct TempDir(PathBuf);

impl TempDir {
    pub(crate) fn new(tag: &str) -> Self {
        use std::os::unix::fs::PermissionsExt as _;
        static N: AtomicU32 = AtomicU32::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos();
        let p = std::env::temp_dir().join(format!("riser-svc-{tag}-{}-{n}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&p).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o700)).unwrap();
        Self(p)
    }

    pub(crate) fn path(&self) -> &Path {
        &self.0
    }

    pub(crate) fn join(&self, p: impl AsRef<Path>) -> PathBuf {
        self.0.join(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A TCP port nobody listens on now (bound to 127.0.0.1:0 and released).
pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// `127.0.0.1:port`.
pub(crate) fn local(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// Write `text` to `path` with mode 600.
pub(crate) fn write_private(path: &Path, text: &str) {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
}

/// The file mode of `path` (permission bits).
pub(crate) fn mode(path: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::metadata(path).unwrap().permissions().mode() & 0o7777
}

/// A running service, its configuration file and its control socket, in a private directory.
pub(crate) struct Running {
    pub(crate) svc: Arc<Service>,
    pub(crate) control: Option<ControlSocket>,
    /// Where its TCP portal listens.
    pub(crate) addr: SocketAddr,
    pub(crate) config: PathBuf,
    pub(crate) dir: TempDir,
}

impl Running {
    /// A service started from the configuration `body` (with `PORT` replaced by a free port, and
    /// `DIR` by the test's directory) after a `portal = ["127.0.0.1:PORT"]` line, listening on
    /// its control socket `DIR/control.sock`.
    pub(crate) async fn start(tag: &str, body: &str) -> Self {
        let dir = TempDir::new(tag);
        let port = free_port();
        Self::start_in(dir, port, body).await
    }

    /// As [`start`](Self::start), in `dir` on `port`.
    pub(crate) async fn start_in(dir: TempDir, port: u16, body: &str) -> Self {
        logging();
        let text = format!(
            "portal = [\"127.0.0.1:{port}\"]\n{}",
            body.replace("PORT", &port.to_string()).replace("DIR", &dir.path().display().to_string())
        );
        let config = dir.join("target.toml");
        write_private(&config, &text);
        let svc = Service::start(Source { path: Some(config.clone()), overrides: Default::default() }).await.unwrap();
        let control = control::listen(svc.clone(), &dir.join("control.sock")).await.unwrap();
        Self { svc, control: Some(control), addr: local(port), config, dir }
    }

    /// The control socket's path.
    pub(crate) fn socket(&self) -> PathBuf {
        self.dir.join("control.sock")
    }

    /// A client of its control socket.
    pub(crate) async fn client(&self) -> Rpc {
        Rpc(Client::connect(&self.socket()).await.unwrap())
    }
}

/// The typed control client, failing the test on an I/O error.
pub(crate) struct Rpc(pub(crate) Client);

impl Rpc {
    /// `method` with `params` (JSON), its result or its error.
    pub(crate) async fn call(&mut self, method: &str, params: Value) -> Result<Value, RpcError> {
        tokio::time::timeout(WAIT, self.0.call(method, params)).await.expect("the control socket answers in time").unwrap()
    }

    /// `method`, which must succeed.
    pub(crate) async fn ok(&mut self, method: &str, params: Value) -> Value {
        match self.call(method, params.clone()).await {
            Ok(v) => v,
            Err(e) => panic!("{method} {params}: {e:?}"),
        }
    }

    /// `method`, which must fail with `code`: its message.
    pub(crate) async fn fails(&mut self, method: &str, params: Value, code: i64) -> String {
        match self.call(method, params.clone()).await {
            Err(e) if e.code == code => e.message,
            other => panic!("{method} {params}: expected error {code}, got {other:?}"),
        }
    }
}

/// A raw connection to a control socket: bytes out, lines in.
pub(crate) struct RawControl {
    r: BufReader<OwnedReadHalf>,
    w: OwnedWriteHalf,
}

impl RawControl {
    pub(crate) async fn connect(path: &Path) -> Self {
        let (r, w) = UnixStream::connect(path).await.unwrap().into_split();
        Self { r: BufReader::new(r), w }
    }

    /// Send `bytes` (an error, such as the service having closed, is returned).
    pub(crate) async fn send(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.w.write_all(bytes).await?;
        self.w.flush().await
    }

    /// Send `bytes` while reading the answer (for requests the service may stop reading): the
    /// answer, which must be a JSON-RPC 2.0 response.
    pub(crate) async fn send_and_reply(&mut self, bytes: &[u8]) -> Value {
        let Self { r, w } = self;
        let write = async {
            let _ = tokio::time::timeout(WAIT, w.write_all(bytes)).await;
        };
        let (_, line) = tokio::join!(write, read_line(r));
        let v = line.expect("an answer, not the end of the stream");
        check_response(&v);
        v
    }

    /// The next line, which must come within [`WAIT`]: `None` at the end of the stream. Every
    /// line ends in a newline and is one JSON text.
    pub(crate) async fn line(&mut self) -> Option<Value> {
        read_line(&mut self.r).await
    }

    /// The next answer, which must be a JSON-RPC 2.0 response (or an array of them).
    pub(crate) async fn reply(&mut self) -> Value {
        let v = self.line().await.expect("an answer, not the end of the stream");
        match &v {
            Value::Array(items) => {
                assert!(!items.is_empty(), "a batch answer is never an empty array");
                items.iter().for_each(check_response);
            }
            other => check_response(other),
        }
        v
    }

    /// Whether the service closes the stream within [`WAIT`] (without sending anything more).
    pub(crate) async fn closed(&mut self) -> bool {
        let mut b = [0u8; 256];
        match tokio::time::timeout(WAIT, self.r.read(&mut b)).await {
            Ok(Ok(0)) | Ok(Err(_)) => true,
            Ok(Ok(n)) => panic!("expected the end of the stream, got {:?}", String::from_utf8_lossy(&b[..n])),
            Err(_) => false,
        }
    }

    /// Whether nothing arrives for `d` (and the stream stays open).
    pub(crate) async fn silent_for(&mut self, d: Duration) -> bool {
        let mut b = [0u8; 256];
        tokio::time::timeout(d, self.r.read(&mut b)).await.is_err()
    }
}

/// The next line of `r`, which must come within [`WAIT`]: `None` at the end of the stream. It
/// ends in a newline and is one JSON text.
async fn read_line(r: &mut BufReader<OwnedReadHalf>) -> Option<Value> {
    let mut line = Vec::new();
    let n = tokio::time::timeout(WAIT, r.read_until(b'\n', &mut line)).await.expect("an answer in time");
    match n {
        Ok(0) | Err(_) => None,
        Ok(_) => {
            assert_eq!(line.last(), Some(&b'\n'), "an answer ends in a newline: {:?}", String::from_utf8_lossy(&line));
            let v: Value =
                serde_json::from_slice(&line).unwrap_or_else(|e| panic!("an answer is JSON ({e}): {:?}", String::from_utf8_lossy(&line)));
            Some(v)
        }
    }
}

/// A JSON-RPC 2.0 response object: `"jsonrpc": "2.0"`, an `id`, and exactly one of `result` and
/// `error` (an integer code and a message).
pub(crate) fn check_response(v: &Value) {
    let o = v.as_object().unwrap_or_else(|| panic!("a response is an object: {v}"));
    assert_eq!(o.get("jsonrpc"), Some(&Value::from("2.0")), "{v}");
    assert!(o.contains_key("id"), "a response has an id: {v}");
    assert!(matches!(o.get("id"), Some(Value::Null | Value::Number(_) | Value::String(_))), "{v}");
    assert!(o.contains_key("result") != o.contains_key("error"), "result or error: {v}");
    if let Some(e) = o.get("error") {
        assert!(e.get("code").is_some_and(Value::is_i64), "{v}");
        assert!(e.get("message").is_some_and(Value::is_string), "{v}");
    }
    assert_eq!(o.len(), 3, "nothing else: {v}");
}

/// The error code of a response (`None` for a result).
pub(crate) fn code(v: &Value) -> Option<i64> {
    v.get("error").and_then(|e| e.get("code")).and_then(Value::as_i64)
}

/// A session of `initiator` to `target` at `addr`.
pub(crate) async fn connect(addr: SocketAddr, initiator: &str, target: &str) -> Result<Session, Error> {
    Session::connect(addr, SessionConfig::new(initiator, target).timeout(WAIT)).await
}

/// As [`connect`], which must succeed; its first unit attention (power on) consumed.
pub(crate) async fn session(addr: SocketAddr, initiator: &str, target: &str) -> Session {
    let s = connect(addr, initiator, target).await.unwrap_or_else(|e| panic!("{initiator} to {target} at {addr}: {e}"));
    s.report_luns().await.unwrap();
    s
}

/// A session with CHAP.
pub(crate) async fn chap_session(addr: SocketAddr, initiator: &str, target: &str, user: &str, secret: &str) -> Result<Session, Error> {
    let cfg = SessionConfig::new(initiator, target).timeout(WAIT).with_chap(creds(user, secret), None);
    Session::connect(addr, cfg).await
}

pub(crate) fn creds(u: &str, s: &str) -> ChapCredentials {
    ChapCredentials::new(u, s.as_bytes().to_vec()).unwrap()
}

pub(crate) fn lun(n: u16) -> Lun {
    Lun::from_number(n).unwrap()
}

/// `len` bytes that differ with `seed` and along the buffer (a misplaced block shows).
pub(crate) fn pattern(seed: u8, len: usize) -> Bytes {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 9) as u8).collect::<Vec<_>>().into()
}

/// WRITE(10) of `blocks` at `lba`.
pub(crate) fn write10(lba: u32, blocks: u16) -> [u8; 10] {
    let l = lba.to_be_bytes();
    let b = blocks.to_be_bytes();
    [0x2a, 0, l[0], l[1], l[2], l[3], 0, b[0], b[1], 0]
}

/// READ(10) of `blocks` at `lba`.
pub(crate) fn read10(lba: u32, blocks: u16) -> [u8; 10] {
    let mut c = write10(lba, blocks);
    c[0] = 0x28;
    c
}

pub(crate) const TUR: [u8; 6] = [0; 6];
pub(crate) const READ_CAPACITY_16: [u8; 16] = [0x9e, 0x10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 32, 0, 0];

/// Run `cdb` once (a unit attention is the answer, not retried): its data, or the error.
pub(crate) async fn once(s: &Session, l: Lun, cdb: &[u8], write: Option<Bytes>, read_len: u32) -> Result<Bytes, Error> {
    s.command_once(l, cdb, write, read_len).await?.into_good()
}

/// The sense key and code of a failed command.
pub(crate) fn sense_of<T: std::fmt::Debug>(r: Result<T, Error>) -> (SenseKey, AscAscq) {
    match r {
        Err(Error::Scsi { status: Status::CHECK_CONDITION, sense: Some(Sense { key, asc, .. }) }) => (key, asc),
        other => panic!("expected CHECK CONDITION, got {other:?}"),
    }
}

/// The number of blocks in a READ CAPACITY (16) answer.
pub(crate) fn blocks(d: Bytes) -> u64 {
    u64::from_be_bytes(d[..8].try_into().unwrap()) + 1
}

/// Wait until `done` holds, at most [`WAIT`].
pub(crate) async fn until<F, Fut>(what: &str, mut done: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let t0 = std::time::Instant::now();
    while !done().await {
        assert!(t0.elapsed() < WAIT, "{what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The sessions `session_list` shows.
pub(crate) async fn sessions(rpc: &mut Rpc) -> Vec<Value> {
    rpc.ok("session_list", Value::Null).await.as_array().unwrap().clone()
}

/// The TSIHs of `initiator`'s sessions.
pub(crate) async fn tsihs_of(rpc: &mut Rpc, initiator: &str) -> Vec<u64> {
    sessions(rpc).await.iter().filter(|s| s["initiator"] == initiator).map(|s| s["tsih"].as_u64().unwrap()).collect()
}

/// The minimal configuration: one open target with a 4 MiB RAM store at LUN 0.
pub(crate) const ONE_TARGET: &str = r#"
[limits]
logout_timeout = 1
drain_timeout = 2

[[store]]
name = "disk0"
backing = "ram:4MiB"

[[target]]
name = "iqn.2026-11.io.riser:svc"

[[target.lun]]
lun = 0
store = "disk0"
"#;

/// A TCP relay between an initiator and a portal that can stop passing on what the target sends
/// (keeping it instead): an initiator that hears nothing more, for tests of what the target does
/// about an initiator that does not answer.
pub(crate) struct Relay {
    /// Where initiators connect.
    pub(crate) addr: SocketAddr,
    deaf: Arc<std::sync::atomic::AtomicBool>,
    kept: Arc<std::sync::Mutex<Vec<u8>>>,
    ended: Arc<tokio::sync::Notify>,
    task: tokio::task::JoinHandle<()>,
}

impl Relay {
    /// A relay to `to`, for one connection.
    pub(crate) async fn to(to: SocketAddr) -> Self {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let deaf = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let kept = Arc::new(std::sync::Mutex::new(Vec::new()));
        let ended = Arc::new(tokio::sync::Notify::new());
        let task = tokio::spawn({
            let (deaf, kept, ended) = (deaf.clone(), kept.clone(), ended.clone());
            async move {
                let (initiator, _) = l.accept().await.unwrap();
                let target = tokio::net::TcpStream::connect(to).await.unwrap();
                let (mut ir, mut iw) = initiator.into_split();
                let (mut tr, mut tw) = target.into_split();
                let up = tokio::spawn(async move {
                    let _ = tokio::io::copy(&mut ir, &mut tw).await;
                });
                let mut buf = vec![0u8; 64 << 10];
                loop {
                    match tr.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) if deaf.load(Ordering::SeqCst) => kept.lock().unwrap().extend_from_slice(&buf[..n]),
                        Ok(n) => {
                            if iw.write_all(&buf[..n]).await.is_err() {
                                break;
                            }
                        }
                    }
                }
                up.abort();
                ended.notify_one();
            }
        });
        Self { addr, deaf, kept, ended, task }
    }

    /// From now on the initiator hears nothing; what the target sends is kept.
    pub(crate) fn deafen(&self) {
        self.deaf.store(true, Ordering::SeqCst);
    }

    /// What the target sent since [`deafen`](Self::deafen).
    pub(crate) fn kept(&self) -> Vec<u8> {
        self.kept.lock().unwrap().clone()
    }

    /// Wait (at most `within`) for the target to close the connection: whether it did.
    pub(crate) async fn closed_within(&self, within: Duration) -> bool {
        tokio::time::timeout(within, self.ended.notified()).await.is_ok()
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.task.abort();
    }
}
