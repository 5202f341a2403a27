//! Bad input on the control socket: every malformed, invalid or hostile request gets the answer
//! JSON-RPC 2.0 prescribes (or none, for a notification), and the target goes on serving.

use crate::support::{ME, ONE_TARGET, RawControl, Running, TARGET, code, pattern, session};
use riser_service::control::{MAX_CLIENTS, MAX_REQUEST_BYTES, code as rpc};
use serde_json::{Value, json};
use std::time::Duration;

/// Send `text` on a fresh connection and read one answer.
async fn one(r: &Running, text: &str) -> (RawControl, Value) {
    let mut c = RawControl::connect(&r.socket()).await;
    c.send(text.as_bytes()).await.unwrap();
    let v = c.reply().await;
    (c, v)
}

/// Send `text` on a fresh connection: the error code of its answer, whose id must be `id`; the
/// connection must stay usable afterwards.
async fn error_of(r: &Running, text: &str, id: Value) -> i64 {
    let (mut c, v) = one(r, &format!("{text}\n")).await;
    assert_eq!(v["id"], id, "{text} -> {v}");
    let code = code(&v).unwrap_or_else(|| panic!("{text}: an error expected, got {v}"));
    // The stream is still in step: the next request is answered.
    c.send(br#"{"jsonrpc":"2.0","method":"version","id":"after"}"#).await.unwrap();
    let next = c.reply().await;
    assert_eq!((next["id"].as_str(), next["result"]["name"].as_str()), (Some("after"), Some("riser")), "after {text}: {next}");
    code
}

/// Send `bytes` on a fresh connection: a parse error (id null), then the connection closes.
async fn parse_error_then_close(r: &Running, bytes: &[u8], what: &str) {
    let mut c = RawControl::connect(&r.socket()).await;
    // The service may close before it has read everything.
    let v = c.send_and_reply(bytes).await;
    assert_eq!((code(&v), &v["id"]), (Some(rpc::PARSE_ERROR), &Value::Null), "{what}: {v}");
    assert!(c.closed().await, "{what}: the connection closes after a parse error");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_and_invalid_requests_get_their_errors_and_the_target_keeps_serving() {
    let r = Running::start("badinput", ONE_TARGET).await;
    // A client connected throughout, unaffected by the others' input.
    let mut bystander = r.client().await;
    bystander.ok("version", Value::Null).await;

    // Malformed JSON: -32700, then the connection closes (the stream cannot be resynchronised).
    parse_error_then_close(&r, b"{\"jsonrpc\":\"2.0\",\"method\":\"version\",\"id\":1,}\n", "a trailing comma").await;
    parse_error_then_close(&r, b"{bad json}\n", "bare words").await;
    parse_error_then_close(&r, b"]\n", "a lone bracket").await;
    // Binary garbage, and invalid UTF-8 inside a string.
    let garbage: Vec<u8> = (0..4096u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    parse_error_then_close(&r, &[&[0u8, 0xff, 0xfe][..], &garbage].concat(), "binary garbage").await;
    parse_error_then_close(&r, b"{\"jsonrpc\":\"2.0\",\"method\":\"\xff\xfe\",\"id\":1}\n", "invalid UTF-8").await;
    // Deeply nested JSON, whole or cut off.
    let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    parse_error_then_close(&r, deep.as_bytes(), "100000 nested arrays").await;
    let deep_obj = format!(r#"{{"jsonrpc":"2.0","method":"version","id":1,"params":{}"#, r#"{"a":"#.repeat(50_000));
    parse_error_then_close(&r, deep_obj.as_bytes(), "50000 nested objects, unfinished").await;

    // Good requests, then garbage in the same write: the good ones answered in order, then the
    // parse error, then the end.
    let mut c = RawControl::connect(&r.socket()).await;
    let v = c
        .send_and_reply(
            b"{\"jsonrpc\":\"2.0\",\"method\":\"version\",\"id\":1}\n[{\"jsonrpc\":\"2.0\",\"method\":\"version\",\"id\":2}]{oops}",
        )
        .await;
    assert_eq!(v["id"], 1);
    assert_eq!(c.reply().await[0]["id"], 2);
    let v = c.reply().await;
    assert_eq!((code(&v), &v["id"]), (Some(rpc::PARSE_ERROR), &Value::Null));
    assert!(c.closed().await);

    // Not requests: -32600 with a null id.
    for text in ["[]", "42", "\"x\"", "null", "true", "{}"] {
        assert_eq!(error_of(&r, text, Value::Null).await, rpc::INVALID_REQUEST, "{text}");
    }
    // Missing or wrong jsonrpc, method not a string, extra members: -32600 with the id.
    for (text, id) in [
        (r#"{"method":"version","id":2}"#, json!(2)),
        (r#"{"jsonrpc":"1.0","method":"version","id":3}"#, json!(3)),
        (r#"{"jsonrpc":2.0,"method":"version","id":"three"}"#, json!("three")),
        (r#"{"jsonrpc":"2.0","method":7,"id":4}"#, json!(4)),
        (r#"{"jsonrpc":"2.0","method":null,"id":5}"#, json!(5)),
        (r#"{"jsonrpc":"2.0","id":6}"#, json!(6)),
        (r#"{"jsonrpc":"2.0","method":"version","id":7,"extra":1}"#, json!(7)),
        // An id that is no string, number or null: refused, answered with a null id.
        (r#"{"jsonrpc":"2.0","method":"version","id":[8]}"#, Value::Null),
        (r#"{"jsonrpc":"2.0","method":"version","id":{"n":9}}"#, Value::Null),
        // params that are no structured value (JSON-RPC 2.0 §4.2: an object or an array).
        (r#"{"jsonrpc":"2.0","method":"version","params":42,"id":10}"#, json!(10)),
        (r#"{"jsonrpc":"2.0","method":"target_list","params":"x","id":11}"#, json!(11)),
    ] {
        assert_eq!(error_of(&r, text, id).await, rpc::INVALID_REQUEST, "{text}");
    }
    // Unknown methods: -32601.
    for text in [r#"{"jsonrpc":"2.0","method":"nope","id":12}"#, r#"{"jsonrpc":"2.0","method":"","id":12}"#] {
        assert_eq!(error_of(&r, text, json!(12)).await, rpc::METHOD_NOT_FOUND, "{text}");
    }
    // Unknown parameter keys, wrong types, missing or positional parameters: -32602.
    for text in [
        r#"{"jsonrpc":"2.0","method":"target_list","params":{"x":1},"id":13}"#,
        r#"{"jsonrpc":"2.0","method":"version","params":{"verbose":true},"id":13}"#,
        r#"{"jsonrpc":"2.0","method":"lun_add","params":{"target":"iqn.2026-11.io.riser:svc","lun":"zero","store":"disk0"},"id":13}"#,
        r#"{"jsonrpc":"2.0","method":"lun_add","params":{"target":"iqn.2026-11.io.riser:svc","lun":70000,"store":"disk0"},"id":13}"#,
        r#"{"jsonrpc":"2.0","method":"lun_add","params":{"target":"iqn.2026-11.io.riser:svc","lun":-1,"store":"disk0"},"id":13}"#,
        r#"{"jsonrpc":"2.0","method":"store_remove","params":{},"id":13}"#,
        r#"{"jsonrpc":"2.0","method":"store_remove","params":{"name":7},"id":13}"#,
        r#"{"jsonrpc":"2.0","method":"store_remove","params":["disk0"],"id":13}"#,
        r#"{"jsonrpc":"2.0","method":"target_list","params":[],"id":13}"#,
        r#"{"jsonrpc":"2.0","method":"store_resize","params":{"name":"disk0","size":"lots"},"id":13}"#,
        r#"{"jsonrpc":"2.0","method":"target_add","params":{"name":"iqn.2026-11.io.riser:x","open":"yes"},"id":13}"#,
        r#"{"jsonrpc":"2.0","method":"session_logout","params":{"tsih":"one"},"id":13}"#,
        r#"{"jsonrpc":"2.0","method":"portal_add","params":{"target":"iqn.2026-11.io.riser:svc","address":"127.0.0.1:1","transport":"udp"},"id":13}"#,
        r#"{"jsonrpc":"2.0","method":"store_add","params":{"name":"x","backing":"ram:1MiB","uuid":"not-a-uuid"},"id":13}"#,
    ] {
        assert_eq!(error_of(&r, text, json!(13)).await, rpc::INVALID_PARAMS, "{text}");
    }
    // Nested within serde_json's depth limit, in an unknown parameter: -32602.
    let nested = format!(r#"{{"jsonrpc":"2.0","method":"version","params":{{"a":{}1{}}},"id":13}}"#, "[".repeat(100), "]".repeat(100));
    assert_eq!(error_of(&r, &nested, json!(13)).await, rpc::INVALID_PARAMS);
    // ids are echoed as given.
    for id in [json!(0), json!(-1), json!(9_007_199_254_740_993u64), json!("a \"quoted\" id"), json!(1.5), Value::Null] {
        let (_, v) = one(&r, &format!("{}\n", json!({"jsonrpc": "2.0", "method": "version", "id": id}))).await;
        assert_eq!(v["id"], id, "{v}");
        assert_eq!(v["result"]["name"], "riser");
    }

    // Notifications (no id) get no answer at all, whatever they do; their effects happen.
    let mut c = RawControl::connect(&r.socket()).await;
    c.send(br#"{"jsonrpc":"2.0","method":"version"}"#).await.unwrap();
    c.send(br#"{"jsonrpc":"2.0","method":"nope"}"#).await.unwrap();
    c.send(br#"{"jsonrpc":"2.0","method":"target_list","params":{"bad":1}}"#).await.unwrap();
    c.send(br#"{"jsonrpc":"2.0","method":"store_add","params":{"name":"by-notification","backing":"ram:1MiB"}}"#).await.unwrap();
    assert!(c.silent_for(Duration::from_millis(300)).await, "no answer to a notification");
    c.send(br#"{"jsonrpc":"2.0","method":"store_list","id":"then"}"#).await.unwrap();
    let v = c.reply().await;
    assert_eq!(v["id"], "then", "the first answer is the first request's: {v}");
    assert!(v["result"].as_array().unwrap().iter().any(|s| s["name"] == "by-notification"), "{v}");

    // A batch: answered with one array, notifications left out, each answer with its id.
    let batch = json!([
        {"jsonrpc": "2.0", "method": "version", "id": 20},
        {"jsonrpc": "2.0", "method": "nope", "id": 21},
        {"jsonrpc": "2.0", "method": "version"},
        42,
        {"jsonrpc": "2.0", "method": "target_list", "params": {"x": 1}, "id": "s"},
        {"jsonrpc": "1.0", "method": "version", "id": 22},
    ]);
    let (mut c, v) = one(&r, &format!("{batch}\n")).await;
    let answers = v.as_array().unwrap_or_else(|| panic!("a batch is answered with an array: {v}"));
    let by_id: Vec<(Value, Option<i64>)> = answers.iter().map(|a| (a["id"].clone(), code(a))).collect();
    assert_eq!(
        by_id,
        vec![
            (json!(20), None),
            (json!(21), Some(rpc::METHOD_NOT_FOUND)),
            (Value::Null, Some(rpc::INVALID_REQUEST)),
            (json!("s"), Some(rpc::INVALID_PARAMS)),
            (json!(22), Some(rpc::INVALID_REQUEST)),
        ]
    );
    // A batch of notifications only: nothing at all (the next answer is the next request's).
    c.send(br#"[{"jsonrpc":"2.0","method":"version"},{"jsonrpc":"2.0","method":"nope"}]"#).await.unwrap();
    c.send(br#"{"jsonrpc":"2.0","method":"version","id":23}"#).await.unwrap();
    assert_eq!(c.reply().await["id"], 23);

    // Pipelined requests in one write: answered in order, each answer a line of its own.
    let mut c = RawControl::connect(&r.socket()).await;
    let mut text = String::new();
    for i in 0..40 {
        let method = ["version", "target_list", "store_list", "nope", "rpc_get_methods"][i % 5];
        text.push_str(&json!({"jsonrpc": "2.0", "method": method, "id": i}).to_string());
        text.push_str(if i % 3 == 0 {
            "\n"
        } else if i % 3 == 1 {
            " "
        } else {
            ""
        });
    }
    c.send(text.as_bytes()).await.unwrap();
    for i in 0..40 {
        let v = c.reply().await;
        assert_eq!(v["id"], i, "in order: {v}");
        assert_eq!(code(&v), (i % 5 == 3).then_some(rpc::METHOD_NOT_FOUND));
    }
    // A request that arrives a byte at a time is answered once whole.
    let req = br#"{"jsonrpc":"2.0","method":"version","id":"slow"}"#;
    for b in req.chunks(1) {
        c.send(b).await.unwrap();
    }
    assert_eq!(c.reply().await["id"], "slow");

    // Larger than MAX_REQUEST_BYTES: -32600, then the connection closes. Well-formed otherwise,
    // and only just too large.
    for extra in [1, 100 << 10, MAX_REQUEST_BYTES] {
        let head = r#"{"jsonrpc":"2.0","method":"version","id":30,"params":{"pad":""#;
        let tail = r#""}}"#;
        let pad = "A".repeat(MAX_REQUEST_BYTES + extra - head.len() - tail.len());
        let big = format!("{head}{pad}{tail}");
        assert_eq!(big.len(), MAX_REQUEST_BYTES + extra);
        let mut c = RawControl::connect(&r.socket()).await;
        // Written while the answer is read: the service may close before taking it all.
        let v = c.send_and_reply(big.as_bytes()).await;
        assert_eq!((code(&v), &v["id"]), (Some(rpc::INVALID_REQUEST), &Value::Null), "{} bytes: {v}", big.len());
        assert!(c.closed().await, "{} bytes: closed after the refusal", big.len());
    }
    // One just within the bound is served.
    {
        let head = r#"{"jsonrpc":"2.0","method":"version","id":31,"params":{"pad":""#;
        let tail = r#""}}"#;
        let big = format!("{head}{}{tail}", "A".repeat(MAX_REQUEST_BYTES - head.len() - tail.len()));
        let (_, v) = one(&r, &big).await;
        assert_eq!((code(&v), &v["id"]), (Some(rpc::INVALID_PARAMS), &json!(31)), "unknown parameter pad, but read whole");
    }

    // After all that: the socket still answers, and an initiator logs in and does I/O.
    let mut rpc = r.client().await;
    assert_eq!(rpc.ok("version", Value::Null).await["name"], "riser");
    assert!(bystander.ok("store_list", Value::Null).await.as_array().unwrap().iter().any(|s| s["name"] == "disk0"));
    let s = session(r.addr, ME, TARGET).await;
    let l = riser_initiator::Lun::ZERO;
    s.write(l, 8, pattern(7, 8192), 512).await.unwrap();
    assert_eq!(s.read(l, 8, 16, 512).await.unwrap(), pattern(7, 8192));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_beyond_the_limit_are_turned_away_and_the_rest_served() {
    let r = Running::start("clients", ONE_TARGET).await;
    // MAX_CLIENTS clients, each served (it has had an answer).
    let mut held = Vec::new();
    for i in 0..MAX_CLIENTS {
        let mut c = RawControl::connect(&r.socket()).await;
        c.send(format!("{}\n", json!({"jsonrpc": "2.0", "method": "version", "id": i})).as_bytes()).await.unwrap();
        assert_eq!(c.reply().await["id"], i);
        held.push(c);
    }
    // One more: -32000, then closed. And another.
    for _ in 0..2 {
        let mut extra = RawControl::connect(&r.socket()).await;
        let v = extra.reply().await;
        assert_eq!((code(&v), &v["id"]), (Some(rpc::BUSY), &Value::Null), "{v}");
        assert!(extra.closed().await);
    }
    // Those served are still served.
    for (i, c) in held.iter_mut().enumerate().take(3) {
        c.send(format!("{}\n", json!({"jsonrpc": "2.0", "method": "target_list", "id": i})).as_bytes()).await.unwrap();
        assert!(c.reply().await["result"].is_array());
    }
    // One leaves: a new client is served again.
    drop(held.pop());
    crate::support::until("a freed place is taken", || async {
        let mut c = RawControl::connect(&r.socket()).await;
        c.send(b"{\"jsonrpc\":\"2.0\",\"method\":\"version\",\"id\":\"new\"}\n").await.is_ok() && c.reply().await["id"] == "new"
    })
    .await;
    // And the target serves initiators throughout.
    let s = session(r.addr, ME, TARGET).await;
    s.test_unit_ready(riser_initiator::Lun::ZERO).await.unwrap();
}
