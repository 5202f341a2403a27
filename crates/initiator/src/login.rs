//! Connecting and logging in: the login machine [`InitiatorLogin`] driven over a fresh
//! connection's datamover, up to the full feature phase.

use crate::{Connector, Error};
use riser_datamover::{ConnectionResources, ControlPdu, DmEvent, SharedDatamover};
use riser_iscsi::login::{InitiatorLogin, InitiatorLoginConfig, InitiatorLoginEvent, LoginOutcome};
use riser_iscsi::wire::Header;
use std::time::{Duration, Instant};
use tokio::net::ToSocketAddrs;

/// The login's seed for CHAP identifiers and mutual CHAP challenges, from the OS generator.
/// There is no fallback: a predictable challenge would let a recorded response be replayed.
fn entropy() -> Result<[u8; 32], Error> {
    riser_iscsi::entropy::entropy().map_err(|e| Error::Connect(std::io::Error::other(format!("{e}: no login without it"))))
}

/// Log in on a fresh connection; returns the datamover (enabled for the full feature phase)
/// and the outcome. Connecting and the login both must end within `cfg.login_timeout`
/// (each from its start); `cfg.transport` is the connector's.
pub(crate) async fn login(
    connector: &dyn Connector,
    addr: std::net::SocketAddr,
    mut cfg: InitiatorLoginConfig,
) -> Result<(SharedDatamover, LoginOutcome), Error> {
    cfg.transport = connector.transport();
    let timeout = cfg.login_timeout;
    let seed = entropy()?;
    let dm = tokio::time::timeout(timeout, connector.connect(addr)).await.map_err(|_| Error::Timeout)??;
    if let Some(m) = dm.max_recv_data_segment_length() {
        cfg.operational.max_recv_data_segment_length = cfg.operational.max_recv_data_segment_length.min(m);
    }
    let start = Instant::now();
    let mut l = InitiatorLogin::new(cfg, Duration::ZERO, seed);
    loop {
        while let Some(p) = l.poll_transmit() {
            tracing::debug!(csg = p.header.csg.0, transit = p.header.transit, nsg = p.header.nsg.0, keys = %login_keys(&p.data), "Login Request");
            // The end of login is explicit (RFC 5047 §7): resources before the request that
            // may be answered by the final Login Response, the negotiated values and
            // Enable_Datamover once that response is in.
            if p.asks_for_full_feature()
                && let Err(e) = dm.allocate_connection_resources(ConnectionResources::default())
            {
                dm.terminate();
                return Err(Error::Datamover(e));
            }
            dm.send_control(ControlPdu::new(Header::LoginRequest(p.header), p.data.into())).await.map_err(|_| Error::ConnectionLost)?;
        }
        match l.poll_event() {
            Some(InitiatorLoginEvent::Complete(o)) => {
                dm.notice_key_values(&o.params);
                dm.enable();
                return Ok((dm, o));
            }
            Some(InitiatorLoginEvent::Failed(f)) => {
                dm.terminate();
                return Err(Error::Login(f));
            }
            Some(InitiatorLoginEvent::Redirect { addresses, .. }) => {
                dm.terminate();
                return Err(Error::Redirected(addresses));
            }
            Some(_) | None => {}
        }
        let left = timeout.saturating_sub(start.elapsed());
        match tokio::time::timeout(left, dm.next_event()).await {
            Ok(DmEvent::Control(p)) => {
                if let Header::LoginResponse(r) = &p.header {
                    tracing::debug!(csg = r.csg.0, transit = r.transit, nsg = r.nsg.0, status = r.status_class, keys = %login_keys(&p.data), "Login Response");
                }
                l.handle_pdu(start.elapsed(), &p.header, &p.data)
            }
            Ok(_) => {
                return Err(Error::ConnectionLost);
            }
            Err(_) => {
                dm.terminate();
                return Err(Error::Timeout);
            }
        }
    }
}

/// Login text for the log: `key=value` pairs, CHAP values left out.
fn login_keys(data: &[u8]) -> String {
    data.split(|&b| b == 0)
        .filter(|kv| !kv.is_empty())
        .map(|kv| {
            let kv = String::from_utf8_lossy(kv);
            match kv.split_once('=') {
                Some((k, _)) if k.starts_with("CHAP_") => format!("{k}=..."),
                _ => kv.into_owned(),
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// The first address `addr` resolves to.
pub(crate) async fn resolve(addr: impl ToSocketAddrs) -> Result<std::net::SocketAddr, Error> {
    tokio::net::lookup_host(addr).await.map_err(Error::Connect)?.next().ok_or_else(|| Error::Connect(std::io::ErrorKind::NotFound.into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn login_seeds_come_fresh_from_the_os() {
        // This shows only that seeds differ and are not mostly zero, not that they are
        // unpredictable: that rests on the OS generator.
        let a = entropy().unwrap();
        let b = entropy().unwrap();
        assert_ne!(a, b);
        assert!(a.iter().filter(|&&x| x != 0).count() > 16);
    }

    #[test]
    fn chap_values_stay_out_of_the_log() {
        let keys = login_keys(b"InitiatorName=iqn.x\0CHAP_R=0xabcdef\0CHAP_N=me\0\0");
        assert_eq!(keys, "InitiatorName=iqn.x CHAP_R=... CHAP_N=...");
    }
}
