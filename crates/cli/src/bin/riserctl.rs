//! riserctl: the riser target's control plane from the command line.
//!
//! ```text
//! riserctl [--socket PATH] [--json] METHOD [KEY=VALUE...]
//! ```
//!
//! Each call is one JSON-RPC request to the target's control socket (`--control` of
//! riser-target; default `/run/riser/control.sock`, or `$RISER_CONTROL`). `KEY=VALUE` pairs
//! are its parameters: a value that reads as JSON (a number, `true`, `false`, `null`, an array
//! or object, a quoted string) is taken as such, anything else as a string; `KEY=-` reads the
//! value from standard input (for a secret: `chap=- < creds`, `USER:SECRET` or two lines), and
//! `KEY.SUB=VALUE` sets a member of an object (`chap.user=alice`). The answer prints as a table
//! (or as JSON with `--json`); an error prints its code and message and exits 1.
//!
//! ```text
//! riserctl store_add name=disk1 backing=file:/var/lib/riser/disk1.img:10GiB
//! riserctl lun_add target=iqn.2026-11.io.riser:target0 lun=1 store=disk1
//! riserctl acl_add target=iqn.2026-11.io.riser:target0 initiator=iqn.1994-05.com.redhat:host1 chap_file=/etc/riser/host1.chap
//! riserctl session_list
//! ```

use clap::Parser;
use riser::service::control::Client;
use serde_json::{Map, Value};
use std::io::Read as _;
use std::path::PathBuf;

/// The control socket when neither `--socket` nor `$RISER_CONTROL` names one.
const DEFAULT_SOCKET: &str = "/run/riser/control.sock";

#[derive(Parser, Debug)]
#[command(name = "riserctl", about = "riser target control", version)]
struct Args {
    /// The target's control socket (default $RISER_CONTROL, else /run/riser/control.sock).
    #[arg(long, value_name = "PATH")]
    socket: Option<PathBuf>,
    /// Print the answer as JSON.
    #[arg(long)]
    json: bool,
    /// The method (`rpc_get_methods` lists them).
    method: String,
    /// Parameters, KEY=VALUE.
    params: Vec<String>,
}

/// The parameters of `KEY=VALUE` pairs (`read_stdin` gives what `-` stands for).
fn parameters(pairs: &[String], mut read_stdin: impl FnMut() -> Result<String, String>) -> Result<Value, String> {
    let mut obj = Map::new();
    for kv in pairs {
        let (key, text) = kv.split_once('=').ok_or_else(|| format!("{kv:?}: expected KEY=VALUE"))?;
        let value = if text == "-" {
            Value::String(read_stdin()?)
        } else {
            serde_json::from_str::<Value>(text).unwrap_or_else(|_| Value::String(text.to_string()))
        };
        // A path given as a relative one means here, not the target's working directory.
        let value = match (key.ends_with("_file") || key == "path", &value) {
            (true, Value::String(p)) if !p.starts_with('/') => {
                Value::String(std::path::absolute(p).map_err(|e| format!("{p}: {e}"))?.display().to_string())
            }
            _ => value,
        };
        let mut at = &mut obj;
        let mut parts = key.split('.').peekable();
        while let Some(part) = parts.next() {
            if part.is_empty() {
                return Err(format!("{key:?}: an empty key"));
            }
            if parts.peek().is_none() {
                at.insert(part.to_string(), value.clone());
                break;
            }
            let entry = at.entry(part.to_string()).or_insert_with(|| Value::Object(Map::new()));
            at = entry.as_object_mut().ok_or_else(|| format!("{key:?}: {part} is not an object"))?;
        }
    }
    Ok(if obj.is_empty() { Value::Null } else { Value::Object(obj) })
}

/// A cell of a table.
fn cell(v: &Value) -> String {
    match v {
        Value::Null => "-".into(),
        Value::String(s) => s.clone(),
        Value::Array(a) if a.is_empty() => "-".into(),
        Value::Array(a) => a.iter().map(cell).collect::<Vec<_>>().join(","),
        Value::Object(o) if o.contains_key("user") => o.get("user").map(cell).unwrap_or_default(),
        other => other.to_string(),
    }
}

/// Rows under a header, columns aligned.
fn table(header: &[&str], rows: Vec<Vec<String>>) -> String {
    let mut width: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for r in &rows {
        for (w, c) in width.iter_mut().zip(r) {
            *w = (*w).max(c.len());
        }
    }
    let line = |cells: Vec<String>| {
        cells.iter().zip(&width).map(|(c, w)| format!("{c:<w$}")).collect::<Vec<_>>().join("  ").trim_end().to_string()
    };
    let mut out = vec![line(header.iter().map(|h| h.to_string()).collect())];
    out.extend(rows.into_iter().map(line));
    out.join("\n")
}

/// How a method's answer prints.
fn render(method: &str, v: &Value) -> String {
    let items = v.as_array().cloned().unwrap_or_default();
    let col = |item: &Value, key: &str| cell(item.get(key).unwrap_or(&Value::Null));
    match method {
        "target_list" => {
            let rows = items
                .iter()
                .map(|t| {
                    let luns = t["luns"]
                        .as_array()
                        .map(|l| l.iter().map(|x| format!("{}:{}", x["lun"], cell(&x["store"]))).collect::<Vec<_>>().join(","))
                        .unwrap_or_default();
                    let portals = t["portal_groups"]
                        .as_array()
                        .map(|gs| {
                            gs.iter()
                                .flat_map(|g| {
                                    g["portals"]
                                        .as_array()
                                        .cloned()
                                        .unwrap_or_default()
                                        .into_iter()
                                        .map(move |p| format!("{}/{},{}", cell(&p["address"]), cell(&p["transport"]), g["tag"]))
                                })
                                .collect::<Vec<_>>()
                                .join(" ")
                        })
                        .unwrap_or_default();
                    let acl = t["acl"]
                        .as_array()
                        .map(|a| a.iter().map(|e| cell(&e["initiator"])).collect::<Vec<_>>().join(","))
                        .unwrap_or_default();
                    vec![
                        col(t, "name"),
                        col(t, "open"),
                        col(t, "chap"),
                        if luns.is_empty() { "-".into() } else { luns },
                        if acl.is_empty() { "-".into() } else { acl },
                        portals,
                    ]
                })
                .collect();
            table(&["TARGET", "OPEN", "CHAP", "LUNS", "ACL", "PORTALS"], rows)
        }
        "store_list" => table(
            &["STORE", "BACKING", "SIZE", "BLOCK", "THIN", "UUID", "EXPORTED"],
            items
                .iter()
                .map(|s| {
                    let exp = s["exported"]
                        .as_array()
                        .map(|e| e.iter().map(|x| format!("{}/{}", cell(&x["target"]), x["lun"])).collect::<Vec<_>>().join(","))
                        .unwrap_or_default();
                    vec![
                        col(s, "name"),
                        col(s, "backing"),
                        col(s, "size"),
                        col(s, "block_size"),
                        col(s, "thin"),
                        col(s, "uuid"),
                        if exp.is_empty() { "-".into() } else { exp },
                    ]
                })
                .collect(),
        ),
        "session_list" => table(
            &["TSIH", "INITIATOR", "ISID", "TARGET", "PORTAL", "PEER", "TRANSPORT", "CMDS", "LOGOUT"],
            items
                .iter()
                .map(|s| {
                    vec![
                        col(s, "tsih"),
                        col(s, "initiator"),
                        col(s, "isid"),
                        col(s, "target"),
                        col(s, "portal"),
                        col(s, "peer"),
                        col(s, "transport"),
                        col(s, "commands"),
                        col(s, "logout_requested"),
                    ]
                })
                .collect(),
        ),
        "stats_get" => {
            let luns = v["luns"].as_array().cloned().unwrap_or_default();
            let rows = luns
                .iter()
                .map(|l| {
                    let cmds: u64 = l["commands"].as_object().map(|o| o.values().filter_map(Value::as_u64).sum()).unwrap_or(0);
                    let errs: u64 = l["errors"].as_object().map(|o| o.values().filter_map(Value::as_u64).sum()).unwrap_or(0);
                    vec![col(l, "target"), col(l, "lun"), cmds.to_string(), col(l, "read_bytes"), col(l, "write_bytes"), errs.to_string()]
                })
                .collect();
            let mut out = table(&["TARGET", "LUN", "COMMANDS", "READ_BYTES", "WRITE_BYTES", "ERRORS"], rows);
            let failures: u64 = v["login_failures"].as_object().map(|o| o.values().filter_map(Value::as_u64).sum()).unwrap_or(0);
            out.push_str(&format!(
                "\nconnections: tcp {} iser {}; logins {}, failed {failures}; command data {} of {} bytes",
                v["connections"]["tcp"], v["connections"]["iser"], v["logins"], v["data_bytes"], v["data_limit_bytes"]
            ));
            out
        }
        "rpc_get_methods" => items.iter().map(cell).collect::<Vec<_>>().join("\n"),
        _ => match v {
            Value::Bool(true) => "ok".into(),
            Value::Object(o) => o.iter().map(|(k, x)| format!("{k}: {}", cell(x))).collect::<Vec<_>>().join("\n"),
            other => other.to_string(),
        },
    }
}

fn main() {
    let args = Args::parse();
    riser::cli::exit_on_error(run(args));
}

fn run(args: Args) -> Result<(), String> {
    let socket =
        args.socket.clone().or_else(|| std::env::var_os("RISER_CONTROL").map(PathBuf::from)).unwrap_or_else(|| DEFAULT_SOCKET.into());
    let params = parameters(&args.params, || {
        let mut s = String::new();
        std::io::stdin().read_to_string(&mut s).map_err(|e| format!("standard input: {e}"))?;
        Ok(s.trim_end_matches('\n').to_string())
    })?;
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string())?;
    let answer = rt.block_on(async {
        let mut c = Client::connect(&socket).await.map_err(|e| format!("{}: {e}", socket.display()))?;
        c.call(&args.method, params).await.map_err(|e| format!("{}: {e}", socket.display()))
    })?;
    match answer {
        Ok(v) if args.json => println!("{}", serde_json::to_string_pretty(&v).map_err(|e| e.to_string())?),
        Ok(v) => println!("{}", render(&args.method, &v)),
        Err(e) => return Err(format!("{} (code {})", e.message, e.code)),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn pairs_become_parameters() {
        let p = parameters(
            &[
                "lun=3".into(),
                "open=true".into(),
                "name=disk-1".into(),
                "chap.user=alice".into(),
                "chap.secret=-".into(),
                "luns={\"0\":2}".into(),
                "v=\"7\"".into(),
            ],
            || Ok("s3cret-from-stdin".into()),
        )
        .unwrap();
        assert_eq!(
            p,
            json!({ "lun": 3, "open": true, "name": "disk-1", "chap": { "user": "alice", "secret": "s3cret-from-stdin" }, "luns": { "0": 2 }, "v": "7" })
        );
        assert_eq!(parameters(&[], || unreachable!()).unwrap(), Value::Null);
        assert!(parameters(&["novalue".into()], || unreachable!()).is_err());
        assert!(parameters(&["a=1".into(), "a.b=2".into()], || unreachable!()).is_err());
        let rel = parameters(&["chap_file=creds".into()], || unreachable!()).unwrap();
        assert!(rel["chap_file"].as_str().unwrap().starts_with('/'), "relative paths are made absolute here");
    }

    #[test]
    fn lists_print_as_tables_without_secrets() {
        let sessions = json!([{ "tsih": 7, "initiator": "iqn.x", "isid": "800000000001", "target": "iqn.t", "portal": "127.0.0.1:3260", "peer": "127.0.0.1:5000", "transport": "tcp", "commands": 2, "logout_requested": false }]);
        let t = render("session_list", &sessions);
        let lines: Vec<&str> = t.lines().collect();
        assert!(lines[0].starts_with("TSIH  INITIATOR"), "{t}");
        assert!(lines[1].starts_with("7     iqn.x"), "{t}");
        let targets = json!([{ "name": "iqn.t", "open": false, "chap": { "user": "bob", "from_file": true }, "luns": [{ "lun": 0, "store": "lun0" }], "acl": [{ "initiator": "iqn.i" }], "portal_groups": [{ "tag": 1, "portals": [{ "address": "127.0.0.1:3260", "transport": "tcp" }] }] }]);
        let t = render("target_list", &targets);
        assert!(t.contains("iqn.t") && t.contains("bob") && t.contains("0:lun0") && t.contains("127.0.0.1:3260/tcp,1"), "{t}");
        assert_eq!(render("lun_add", &Value::Bool(true)), "ok");
    }
}
