//! What the control plane shows: targets, stores, sessions and statistics as JSON. Nothing here
//! holds a secret: a CHAP credential shows as whether it is set and its user name.

use crate::config::{Credential, TargetSpec};
use crate::service::Service;
use crate::store::Store;
use riser_iscsi::keys::Transport;
use riser_target::server::Target;
use riser_target::server::stats::{ERROR_NAMES, LATENCY_BOUNDS_US, LoginFailure, LunStats, Op};
use serde_json::{Map, Value, json};

/// `tcp` or `iser`.
pub fn transport_name(t: Transport) -> &'static str {
    if t == Transport::Iser { "iser" } else { "tcp" }
}

/// A credential: its user, never its secret.
fn auth(c: &Option<Credential>) -> Value {
    match c {
        Some(c) => json!({ "user": c.creds.user, "from_file": c.file.is_some() }),
        None => Value::Null,
    }
}

fn target(t: &TargetSpec) -> Value {
    json!({
        "name": t.name,
        "alias": t.alias,
        "open": t.open,
        "chap": auth(&t.chap),
        "mutual_chap": auth(&t.mutual_chap),
        "portal_groups": t.portal_groups.iter().map(|g| json!({
            "tag": g.tag,
            "relative_port": g.relative_port,
            "port_group": g.port_group,
            "portals": g.portals.iter().map(|p| json!({
                "address": p.portal.address.to_string(),
                "transport": transport_name(p.portal.transport),
                "rdma_provider": (p.portal.transport == Transport::Iser).then(|| p.provider.name()),
            })).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
        "luns": t.luns.iter().map(|(l, s)| json!({ "lun": l, "store": s })).collect::<Vec<_>>(),
        "acl": t.acl.iter().map(|a| json!({
            "initiator": a.initiator,
            "chap": auth(&a.chap),
            "mutual_chap": auth(&a.mutual_chap),
            "luns": a.luns.as_ref().map(|m| m.iter().map(|(k, v)| (k.to_string(), json!(v))).collect::<Map<_, _>>()),
        })).collect::<Vec<_>>(),
    })
}

/// `target_list`.
pub async fn targets(svc: &Service) -> Value {
    Value::Array(svc.targets().await.iter().map(target).collect())
}

/// One store.
pub async fn store(svc: &Service, s: &Store) -> Value {
    let targets = svc.targets().await;
    let exported: Vec<Value> = targets
        .iter()
        .flat_map(|t| t.luns.iter().filter(|(_, n)| **n == s.spec.name).map(move |(l, _)| json!({ "target": t.name, "lun": l })))
        .collect();
    let b = s.lu.backend();
    json!({
        "name": s.spec.name,
        "backing": s.spec.backing,
        "uuid": s.uuid().hyphenated().to_string(),
        "serial": s.lu.identity().serial(),
        "naa": format!("3{:015x}", s.lu.identity().naa()),
        "block_size": b.block_size(),
        "size": s.size(),
        "thin": b.thin(),
        "exported": exported,
    })
}

/// `store_list`.
pub async fn stores(svc: &Service) -> Value {
    let mut out = Vec::new();
    for s in svc.stores().await {
        out.push(store(svc, &s).await);
    }
    Value::Array(out)
}

/// A LUN's statistics.
fn lun_stats(s: &LunStats) -> Value {
    let commands: Map<String, Value> = Op::ALL.iter().map(|o| (o.name().to_string(), json!(s.commands[o.index()]))).collect();
    let errors: Map<String, Value> =
        ERROR_NAMES.iter().zip(s.errors).filter(|(_, n)| *n > 0).map(|(k, n)| (k.to_string(), json!(n))).collect();
    json!({
        "commands": commands,
        "read_bytes": s.read_bytes,
        "write_bytes": s.write_bytes,
        "errors": errors,
        "latency": {
            "bounds_us": LATENCY_BOUNDS_US,
            "counts": s.latency_buckets,
            "sum_seconds": s.latency_sum.as_secs_f64(),
        },
    })
}

/// `session_list`.
pub fn sessions(t: &Target) -> Value {
    Value::Array(
        t.sessions()
            .into_iter()
            .map(|s| {
                json!({
                    "tsih": s.tsih,
                    "initiator": s.initiator,
                    "isid": s.isid,
                    "target": s.target,
                    "type": if s.target.is_some() { "normal" } else { "discovery" },
                    "portal": s.portal.to_string(),
                    "peer": s.peer.to_string(),
                    "transport": transport_name(s.transport),
                    "keys": s.keys.iter().map(|(k, v)| (k.to_string(), json!(v))).collect::<Map<_, _>>(),
                    "commands": s.commands,
                    "logout_requested": s.logout_requested,
                })
            })
            .collect(),
    )
}

/// `stats_get`: per LUN (summed over sessions, ended ones included) and per session, the
/// sessions and connections now, logins and their failures by reason, command data held.
pub fn stats(t: &Target) -> Value {
    let st = t.stats();
    let luns: Vec<Value> = st
        .luns
        .iter()
        .map(|((target, lun), s)| {
            let mut v = lun_stats(s);
            v["target"] = json!(target);
            v["lun"] = json!(lun);
            v
        })
        .collect();
    let per_session: Vec<Value> = t
        .sessions()
        .into_iter()
        .filter(|s| s.target.is_some())
        .map(|s| {
            json!({
                "tsih": s.tsih,
                "initiator": s.initiator,
                "target": s.target,
                "commands_in_flight": s.commands,
                "luns": s.luns.iter().map(|(l, st)| { let mut v = lun_stats(st); v["lun"] = json!(l); v }).collect::<Vec<_>>(),
            })
        })
        .collect();
    let failures: Map<String, Value> =
        LoginFailure::ALL.iter().map(|r| (r.name().to_string(), json!(st.login_failures[r.index()]))).collect();
    json!({
        "luns": luns,
        "sessions": per_session,
        "sessions_by_target": st.sessions,
        "discovery_sessions": st.discovery_sessions,
        "connections": { "tcp": st.tcp_connections, "iser": st.iser_connections },
        "logins": st.logins,
        "login_failures": failures,
        "data_bytes": st.data_bytes,
        "data_limit_bytes": st.data_limit_bytes,
    })
}
