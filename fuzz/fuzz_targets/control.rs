//! The control plane's request handling (riser-service `control::handle`), fed what a client
//! could write to the socket: JSON texts one after another, each a request or a batch, against
//! a running service (one RAM store, one target, no portal). Nothing may panic, and the service
//! must answer a well-formed request after any input.
//!
//! Requests that would reach outside the fuzzer's sandbox are left out: `config_save` (writes a
//! file where it is told), `portal_add` (listens), and any naming a file or a device
//! (`file:`/`blk:` backings, `*_file` credentials).
#![no_main]
use libfuzzer_sys::fuzz_target;
use riser_service::config::ConfigFile;
use riser_service::{Service, Source, control};
use serde_json::Value;

/// Whether the request stays inside the sandbox.
fn harmless(v: &Value) -> bool {
    match v {
        Value::String(s) => !s.contains("file:") && !s.contains("blk:"),
        Value::Array(a) => a.iter().all(harmless),
        Value::Object(o) => {
            !matches!(o.get("method").and_then(Value::as_str), Some("config_save" | "portal_add"))
                && o.iter().all(|(k, v)| !k.ends_with("_file") && harmless(v))
        }
        _ => true,
    }
}

fuzz_target!(|data: &[u8]| {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let overrides = ConfigFile { portal: vec!["none".into()], lun: vec!["ram:1MiB".into()], ..ConfigFile::default() };
        let svc = Service::start(Source { path: None, overrides }).await.unwrap();
        let mut texts = serde_json::Deserializer::from_slice(data).into_iter::<Value>();
        for _ in 0..64 {
            let Some(Ok(v)) = texts.next() else { break };
            if harmless(&v) {
                let _ = control::handle(&svc, v).await;
            }
        }
        let probe = serde_json::json!({ "jsonrpc": "2.0", "method": "target_list", "id": 1 });
        let answer = control::handle(&svc, probe).await.expect("an answer");
        assert!(answer.get("result").is_some(), "{answer}");
    });
});
