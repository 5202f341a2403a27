//! The control plane: JSON-RPC 2.0 over a unix socket.
//!
//! One JSON object per request and per response; each response ends in a newline; requests may
//! be pipelined (answered in order) and batched (a JSON array, answered with an array). Every
//! method applies live ([`METHODS`]). The socket is private to its owner: mode 600, in a
//! directory no one else can write to (the service refuses one others can), and a peer of
//! another user is turned away.
//!
//! Bad input never stops the target: malformed JSON gets a parse error (-32700) and the
//! connection closes (the stream cannot be resynchronised); a request that is not one (params
//! that are neither an object nor an array included) gets -32600, an unknown method -32601,
//! unknown, positional or ill-typed parameters -32602; a request larger
//! than [`MAX_REQUEST_BYTES`] gets -32600 and the connection closes; at most [`MAX_CLIENTS`]
//! clients are served at once (one more gets -32000 and is closed), and a client idle for
//! [`IDLE_TIMEOUT`] is closed. No answer and no log line holds a secret.

use crate::config::{AclSpec, CredentialText, LunsText, StoreOptions, StoreSpec};
use crate::service::{OpError, Service};
use crate::views;
use riser_iscsi::keys::Transport;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};
use tracing::{debug, info, warn};

/// The methods, as `rpc_get_methods` lists them.
pub const METHODS: &[&str] = &[
    "rpc_get_methods",
    "version",
    "target_list",
    "target_add",
    "target_remove",
    "store_list",
    "store_add",
    "store_remove",
    "store_resize",
    "lun_add",
    "lun_remove",
    "acl_add",
    "acl_remove",
    "portal_add",
    "portal_remove",
    "session_list",
    "session_logout",
    "stats_get",
    "config_save",
];

/// The largest request (one JSON text) a client may send.
pub const MAX_REQUEST_BYTES: usize = 1 << 20;

/// Clients served at once.
pub const MAX_CLIENTS: usize = 32;

/// A client that sends nothing for this long is closed.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(300);

/// JSON-RPC's and riser's error codes.
pub mod code {
    /// Invalid JSON.
    pub const PARSE_ERROR: i64 = -32700;
    /// Not a request object.
    pub const INVALID_REQUEST: i64 = -32600;
    /// No such method.
    pub const METHOD_NOT_FOUND: i64 = -32601;
    /// Unknown, missing or ill-typed parameters, or a value out of range.
    pub const INVALID_PARAMS: i64 = -32602;
    /// Too many clients.
    pub const BUSY: i64 = -32000;
    /// The object named does not exist.
    pub const NOT_FOUND: i64 = -32001;
    /// An object of that name exists.
    pub const EXISTS: i64 = -32002;
    /// The object is in use.
    pub const IN_USE: i64 = -32003;
    /// The system refused (a file, an address).
    pub const SYSTEM: i64 = -32004;
}

/// An error answer.
#[derive(Debug, Clone, PartialEq)]
pub struct RpcError {
    /// Its code ([`code`]).
    pub code: i64,
    /// Its message.
    pub message: String,
}

impl RpcError {
    fn new(code: i64, message: impl Into<String>) -> Self {
        Self { code, message: message.into() }
    }
}

impl From<OpError> for RpcError {
    fn from(e: OpError) -> Self {
        let c = match &e {
            OpError::NotFound(_) => code::NOT_FOUND,
            OpError::Exists(_) => code::EXISTS,
            OpError::InUse(_) => code::IN_USE,
            OpError::Invalid(_) => code::INVALID_PARAMS,
            OpError::System(_) => code::SYSTEM,
        };
        Self::new(c, e.to_string())
    }
}

fn response(id: Value, r: Result<Value, RpcError>) -> Value {
    match r {
        Ok(result) => json!({ "jsonrpc": "2.0", "result": result, "id": id }),
        Err(e) => json!({ "jsonrpc": "2.0", "error": { "code": e.code, "message": e.message }, "id": id }),
    }
}

/// Parameters of type `T` (an object; absent or `null` for a method with only optional ones).
fn params<T: DeserializeOwned>(p: Option<Value>) -> Result<T, RpcError> {
    let v = match p {
        None | Some(Value::Null) => Value::Object(Default::default()),
        Some(v @ Value::Object(_)) => v,
        Some(_) => return Err(RpcError::new(code::INVALID_PARAMS, "params must be an object (named parameters)")),
    };
    serde_json::from_value(v).map_err(|e| RpcError::new(code::INVALID_PARAMS, e.to_string()))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NoParams {}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Name {
    name: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TargetAdd {
    name: String,
    alias: Option<String>,
    #[serde(default)]
    open: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StoreAdd {
    name: String,
    backing: String,
    uuid: Option<uuid::Uuid>,
    block_size: Option<u32>,
    #[serde(default)]
    options: StoreOptions,
}

/// A size: bytes, or text with a binary unit (`"2GiB"`).
#[derive(Deserialize)]
#[serde(untagged)]
enum Size {
    Bytes(u64),
    Text(String),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StoreResize {
    name: String,
    size: Size,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Lun {
    target: String,
    lun: u16,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LunAdd {
    target: String,
    lun: u16,
    store: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AclAdd {
    target: String,
    initiator: String,
    chap: Option<CredentialText>,
    chap_file: Option<PathBuf>,
    mutual_chap: Option<CredentialText>,
    mutual_chap_file: Option<PathBuf>,
    luns: Option<LunsText>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AclRemove {
    target: String,
    initiator: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PortalParams {
    target: String,
    address: String,
    #[serde(default)]
    transport: Option<String>,
    rdma_provider: Option<String>,
    group: Option<u16>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Tsih {
    tsih: u16,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Save {
    path: Option<PathBuf>,
}

fn transport(t: Option<&str>) -> Result<Transport, RpcError> {
    match t {
        None | Some("tcp") => Ok(Transport::Tcp),
        Some("iser") => Ok(Transport::Iser),
        Some(other) => Err(RpcError::new(code::INVALID_PARAMS, format!("transport {other:?}: tcp or iser"))),
    }
}

fn invalid(e: String) -> RpcError {
    RpcError::new(code::INVALID_PARAMS, e)
}

/// Run one method.
pub async fn call(svc: &Service, method: &str, p: Option<Value>) -> Result<Value, RpcError> {
    let ok = |_| Value::Bool(true);
    match method {
        "rpc_get_methods" => params::<NoParams>(p).map(|_| json!(METHODS)),
        "version" => params::<NoParams>(p).map(|_| json!({ "name": "riser", "version": env!("CARGO_PKG_VERSION") })),
        "target_list" => {
            params::<NoParams>(p)?;
            Ok(views::targets(svc).await)
        }
        "target_add" => {
            let a: TargetAdd = params(p)?;
            svc.target_add(&a.name, a.alias, a.open).await.map(ok).map_err(Into::into)
        }
        "target_remove" => {
            let a: Name = params(p)?;
            svc.target_remove(&a.name).await.map(ok).map_err(Into::into)
        }
        "store_list" => {
            params::<NoParams>(p)?;
            Ok(views::stores(svc).await)
        }
        "store_add" => {
            let a: StoreAdd = params(p)?;
            let block_size = a.block_size.unwrap_or(512);
            let spec = StoreSpec { name: a.name, backing: a.backing, uuid: a.uuid, block_size, options: a.options };
            let s = svc.store_add(spec).await?;
            Ok(views::store(svc, &s).await)
        }
        "store_remove" => {
            let a: Name = params(p)?;
            svc.store_remove(&a.name).await.map(ok).map_err(Into::into)
        }
        "store_resize" => {
            let a: StoreResize = params(p)?;
            let size = match a.size {
                Size::Bytes(n) => n,
                Size::Text(t) => crate::cli::parse_size(&t).map_err(invalid)?,
            };
            svc.store_resize(&a.name, size).await.map(|n| json!({ "size": n })).map_err(Into::into)
        }
        "lun_add" => {
            let a: LunAdd = params(p)?;
            svc.lun_add(&a.target, a.lun, &a.store).await.map(ok).map_err(Into::into)
        }
        "lun_remove" => {
            let a: Lun = params(p)?;
            svc.lun_remove(&a.target, a.lun).await.map(ok).map_err(Into::into)
        }
        "acl_add" => {
            let a: AclAdd = params(p)?;
            let base = Path::new("");
            let chap = crate::config::credential("chap", a.chap.as_ref(), a.chap_file.as_deref(), base).map_err(invalid)?;
            let mutual_chap =
                crate::config::credential("mutual_chap", a.mutual_chap.as_ref(), a.mutual_chap_file.as_deref(), base).map_err(invalid)?;
            if mutual_chap.is_some() && chap.is_none() {
                return Err(invalid("mutual CHAP needs CHAP".into()));
            }
            let luns = a.luns.as_ref().map(LunsText::to_map).transpose().map_err(invalid)?;
            let spec = AclSpec { initiator: a.initiator, chap, mutual_chap, luns };
            svc.acl_add(&a.target, spec).await.map(ok).map_err(Into::into)
        }
        "acl_remove" => {
            let a: AclRemove = params(p)?;
            svc.acl_remove(&a.target, &a.initiator).await.map(ok).map_err(Into::into)
        }
        "portal_add" => {
            let a: PortalParams = params(p)?;
            let provider = a.rdma_provider.as_deref().map(crate::cli::RdmaProvider::parse).transpose().map_err(invalid)?;
            let spec = svc.portal_add(&a.target, &a.address, transport(a.transport.as_deref())?, provider, a.group).await?;
            Ok(json!({ "address": spec.portal.address.to_string(), "transport": views::transport_name(spec.portal.transport) }))
        }
        "portal_remove" => {
            let a: PortalParams = params(p)?;
            if a.rdma_provider.is_some() || a.group.is_some() {
                return Err(invalid("portal_remove takes target, address and transport".into()));
            }
            svc.portal_remove(&a.target, &a.address, transport(a.transport.as_deref())?).await.map(ok).map_err(Into::into)
        }
        "session_list" => {
            params::<NoParams>(p)?;
            Ok(views::sessions(svc.target()))
        }
        "session_logout" => {
            let a: Tsih = params(p)?;
            svc.target().logout_session(a.tsih).await.map(ok).map_err(|e| OpError::from(e).into())
        }
        "stats_get" => {
            params::<NoParams>(p)?;
            Ok(views::stats(svc.target()))
        }
        "config_save" => {
            let a: Save = params(p)?;
            svc.config_save(a.path.as_deref()).await.map(|p| json!({ "path": p.display().to_string() })).map_err(Into::into)
        }
        _ => Err(RpcError::new(code::METHOD_NOT_FOUND, format!("no method {method:?} (rpc_get_methods lists them)"))),
    }
}

/// Answer one request (`None` for a notification, which gets no answer).
async fn request(svc: &Service, v: Value) -> Option<Value> {
    let Value::Object(mut o) = v else {
        return Some(response(Value::Null, Err(RpcError::new(code::INVALID_REQUEST, "a request is a JSON object"))));
    };
    let id = o.remove("id");
    let id_ok = matches!(&id, None | Some(Value::Null | Value::Number(_) | Value::String(_)));
    let reply_id = if id_ok { id.clone().unwrap_or(Value::Null) } else { Value::Null };
    if o.remove("jsonrpc") != Some(Value::String("2.0".into())) || !id_ok {
        return Some(response(
            reply_id,
            Err(RpcError::new(code::INVALID_REQUEST, "not a JSON-RPC 2.0 request (jsonrpc \"2.0\", method, params, id)")),
        ));
    }
    let Some(Value::String(method)) = o.remove("method") else {
        return Some(response(reply_id, Err(RpcError::new(code::INVALID_REQUEST, "method must be a string"))));
    };
    let p = o.remove("params");
    // params, if given, is a structured value (JSON-RPC 2.0 §4.2; `null` is taken as absent).
    if matches!(&p, Some(Value::Bool(_) | Value::Number(_) | Value::String(_))) {
        return Some(response(reply_id, Err(RpcError::new(code::INVALID_REQUEST, "params must be an object (named parameters)"))));
    }
    if let Some(extra) = o.keys().next() {
        return Some(response(reply_id, Err(RpcError::new(code::INVALID_REQUEST, format!("unknown member {extra:?}")))));
    }
    let r = call(svc, &method, p).await;
    match &r {
        Ok(_) => debug!(method, "control request"),
        Err(e) => info!(method, code = e.code, error = %e.message, "control request refused"),
    }
    id.map(|id| response(id, r))
}

/// Answer one JSON text (a request or a batch).
pub async fn handle(svc: &Service, v: Value) -> Option<Value> {
    match v {
        Value::Array(items) if items.is_empty() => Some(response(Value::Null, Err(RpcError::new(code::INVALID_REQUEST, "an empty batch")))),
        Value::Array(items) => {
            let mut out = Vec::new();
            for item in items {
                if let Some(r) = Box::pin(request(svc, item)).await {
                    out.push(r);
                }
            }
            (!out.is_empty()).then_some(Value::Array(out))
        }
        other => request(svc, other).await,
    }
}

/// The control socket, listening; removed when dropped.
#[derive(Debug)]
pub struct ControlSocket {
    path: PathBuf,
    task: tokio::task::JoinHandle<()>,
}

impl ControlSocket {
    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for ControlSocket {
    fn drop(&mut self) {
        self.task.abort();
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Why a path is no place for a control socket, if it is not: its directory must exist and
/// be writable by its owner alone (else another user could replace the socket).
fn check_directory(path: &Path) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let meta = std::fs::metadata(dir).map_err(|e| format!("control socket directory {}: {e}", dir.display()))?;
    let mode = meta.permissions().mode() & 0o7777;
    if mode & 0o022 != 0 {
        return Err(format!(
            "control socket directory {} has mode {mode:04o}: others can write to it (and replace the socket); use a directory \
             only its owner can write to, such as /run/riser (systemd's RuntimeDirectory)",
            dir.display()
        ));
    }
    Ok(())
}

/// Listen on the control socket at `path` (mode 600; an old socket there that no one answers
/// on is replaced, a live one is an error, and so is anything there that is not a socket).
pub async fn listen(svc: Arc<Service>, path: &Path) -> Result<ControlSocket, String> {
    use std::os::unix::fs::PermissionsExt as _;
    check_directory(path)?;
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        use std::os::unix::fs::FileTypeExt as _;
        // Only a socket is replaced: a path naming a file by mistake must not cost that file.
        if !meta.file_type().is_socket() {
            return Err(format!("{}: exists and is not a socket (it is left as it is)", path.display()));
        }
        if UnixStream::connect(path).await.is_ok() {
            return Err(format!("{}: another process answers on this control socket", path.display()));
        }
        std::fs::remove_file(path).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    // Bound under a temporary name and made private before it takes its name: nobody else can
    // ever connect.
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    let listener = UnixListener::bind(&tmp).map_err(|e| format!("{}: {e}", tmp.display()))?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600)).map_err(|e| format!("{}: {e}", tmp.display()))?;
    std::fs::rename(&tmp, path).map_err(|e| format!("{}: {e}", path.display()))?;
    let owner = {
        use std::os::unix::fs::MetadataExt as _;
        std::fs::metadata(path).map_err(|e| format!("{}: {e}", path.display()))?.uid()
    };
    info!(path = %path.display(), "control socket listening");
    let clients = Arc::new(tokio::sync::Semaphore::new(MAX_CLIENTS));
    let task = tokio::spawn(async move {
        loop {
            let (mut stream, _) = match listener.accept().await {
                Ok(c) => c,
                Err(e) => {
                    warn!("control socket accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            if let Ok(cred) = stream.peer_cred()
                && cred.uid() != owner
                && cred.uid() != 0
            {
                warn!(uid = cred.uid(), "control socket: a client of another user turned away");
                continue;
            }
            let Ok(permit) = clients.clone().try_acquire_owned() else {
                let busy = response(
                    Value::Null,
                    Err(RpcError::new(code::BUSY, format!("the control socket serves {MAX_CLIENTS} clients at once"))),
                );
                let _ = tokio::time::timeout(Duration::from_secs(1), stream.write_all(format!("{busy}\n").as_bytes())).await;
                continue;
            };
            let svc = svc.clone();
            tokio::spawn(async move {
                client(&svc, stream).await;
                drop(permit);
            });
        }
    });
    Ok(ControlSocket { path: path.to_path_buf(), task })
}

/// Serve one client: read JSON texts as they come, answer each in order.
async fn client(svc: &Service, mut stream: UnixStream) {
    let mut buf: Vec<u8> = Vec::with_capacity(4096);
    let mut chunk = vec![0u8; 64 << 10];
    loop {
        // Every complete JSON text in the buffer.
        let mut used = 0;
        let mut close = false;
        let mut too_large = false;
        {
            let mut it = serde_json::Deserializer::from_slice(&buf).into_iter::<Value>();
            loop {
                match it.next() {
                    Some(Ok(v)) => {
                        // A text that arrived whole in one read is as bounded as one that did not.
                        let start = used + buf[used..].iter().take_while(|b| b.is_ascii_whitespace()).count();
                        if it.byte_offset() - start > MAX_REQUEST_BYTES {
                            too_large = true;
                            break;
                        }
                        used = it.byte_offset();
                        if let Some(r) = handle(svc, v).await
                            && stream.write_all(format!("{r}\n").as_bytes()).await.is_err()
                        {
                            return;
                        }
                    }
                    Some(Err(e)) if e.is_eof() => break,
                    Some(Err(e)) => {
                        let r = response(Value::Null, Err(RpcError::new(code::PARSE_ERROR, format!("invalid JSON: {e}"))));
                        let _ = stream.write_all(format!("{r}\n").as_bytes()).await;
                        close = true;
                        break;
                    }
                    None => {
                        used = buf.len();
                        break;
                    }
                }
            }
        }
        if close {
            return;
        }
        buf.drain(..used);
        // Whitespace between texts is no request.
        if buf.iter().all(u8::is_ascii_whitespace) {
            buf.clear();
        }
        if too_large || buf.len() > MAX_REQUEST_BYTES {
            let r =
                response(Value::Null, Err(RpcError::new(code::INVALID_REQUEST, format!("request larger than {MAX_REQUEST_BYTES} bytes"))));
            let _ = stream.write_all(format!("{r}\n").as_bytes()).await;
            return;
        }
        match tokio::time::timeout(IDLE_TIMEOUT, stream.read(&mut chunk)).await {
            Ok(Ok(0)) | Ok(Err(_)) | Err(_) => return,
            Ok(Ok(n)) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

/// A client of the control socket (what riserctl and tests use).
#[derive(Debug)]
pub struct Client {
    stream: tokio::io::BufReader<UnixStream>,
    next_id: u64,
}

impl Client {
    /// Connect to the socket at `path`.
    pub async fn connect(path: &Path) -> std::io::Result<Self> {
        Ok(Self { stream: tokio::io::BufReader::new(UnixStream::connect(path).await?), next_id: 1 })
    }

    /// Call `method` with `params` (an object, or `Value::Null`): its result, or its error.
    pub async fn call(&mut self, method: &str, params: Value) -> std::io::Result<Result<Value, RpcError>> {
        use tokio::io::AsyncBufReadExt as _;
        let id = self.next_id;
        self.next_id += 1;
        let mut req = json!({ "jsonrpc": "2.0", "method": method, "id": id });
        if !params.is_null() {
            req["params"] = params;
        }
        self.stream.get_mut().write_all(format!("{req}\n").as_bytes()).await?;
        let mut line = String::new();
        if self.stream.read_line(&mut line).await? == 0 {
            return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "the target closed the control socket"));
        }
        let v: Value = serde_json::from_str(&line).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
        if let Some(e) = v.get("error") {
            return Ok(Err(RpcError {
                code: e.get("code").and_then(Value::as_i64).unwrap_or(0),
                message: e.get("message").and_then(Value::as_str).unwrap_or_default().to_string(),
            }));
        }
        Ok(Ok(v.get("result").cloned().unwrap_or(Value::Null)))
    }
}
