//! SendTargets discovery: a discovery session whose one request is `SendTargets=All`, driven
//! through [`InitiatorSession`] (numbering, the answer gathered across continuations, the
//! target's pings answered) on a connection of its own.

use crate::login::login;
use crate::{Connector, Error};
use riser_datamover::{ControlPdu, DmEvent, SharedDatamover};
use riser_iscsi::login::{InitiatorAuth, InitiatorLoginConfig};
use riser_iscsi::session::{InitiatorEvent, InitiatorSession};
use riser_iscsi::text::{TextBuilder, parse_pairs};
use std::time::Duration;

/// How long the target has for each answer of a discovery session (and for the login).
const ANSWER_TIMEOUT: Duration = Duration::from_secs(15);
/// How long the Logout Response is waited for once the list is in.
const LOGOUT_TIMEOUT: Duration = Duration::from_secs(2);

/// SendTargets discovery over TCP: the targets and their addresses (`host:port,tpgt`).
#[cfg(feature = "tcp")]
pub async fn discover(
    addr: impl tokio::net::ToSocketAddrs,
    initiator_name: &str,
    auth: InitiatorAuth,
) -> Result<Vec<(String, Vec<String>)>, Error> {
    discover_via(&crate::TcpConnector::default(), crate::login::resolve(addr).await?, initiator_name, auth).await
}

/// SendTargets discovery over any transport (a discovery session on iSER runs over iSER).
pub async fn discover_via(
    connector: &dyn Connector,
    addr: std::net::SocketAddr,
    initiator_name: &str,
    auth: InitiatorAuth,
) -> Result<Vec<(String, Vec<String>)>, Error> {
    let cfg = InitiatorLoginConfig::new(initiator_name, None, crate::random_isid()).auth(auth).login_timeout(ANSWER_TIMEOUT);
    let (dm, o) = login(connector, addr, cfg).await?;
    let mut m = InitiatorSession::new(&o);
    let mut text = TextBuilder::new();
    text.push("SendTargets", "All");
    let asked = m.text(text.into_bytes());
    let answer = exchange(&mut m, &dm, ANSWER_TIMEOUT, |e| match e {
        InitiatorEvent::TextDone { itt, text } if itt == asked => Some(Ok(text)),
        InitiatorEvent::Rejected { itt, reason } if itt == asked => Some(Err(Error::Rejected(reason))),
        InitiatorEvent::TextTooLong { itt, limit } if itt == asked => {
            Some(Err(Error::Protocol(format!("the SendTargets answer goes on beyond {limit} bytes"))))
        }
        _ => None,
    })
    .await;
    if answer.is_ok() {
        // The target answers before it closes; a short wait, the list is ours anyway.
        let bye = m.logout();
        let _ =
            exchange(&mut m, &dm, LOGOUT_TIMEOUT, |e| matches!(e, InitiatorEvent::LoggedOut { itt } if itt == bye).then_some(Ok(()))).await;
    }
    dm.terminate();
    let answer = answer?;
    let pairs = parse_pairs(&answer).map_err(|e| Error::Protocol(e.to_string()))?;
    let mut out: Vec<(String, Vec<String>)> = Vec::new();
    for (k, v) in pairs {
        match k {
            "TargetName" => out.push((v.to_string(), Vec::new())),
            "TargetAddress" => {
                if let Some(last) = out.last_mut() {
                    last.1.push(v.to_string());
                }
            }
            _ => {}
        }
    }
    Ok(out)
}

/// Drive `m` over `dm` (send what it queues, feed it what arrives, each answer within
/// `timeout`) until `done` picks an event as the outcome.
async fn exchange<T>(
    m: &mut InitiatorSession,
    dm: &SharedDatamover,
    timeout: Duration,
    mut done: impl FnMut(InitiatorEvent) -> Option<Result<T, Error>>,
) -> Result<T, Error> {
    loop {
        while let Some(t) = m.poll_transmit() {
            dm.send_control(ControlPdu::new(t.header, t.data)).await.map_err(|_| Error::ConnectionLost)?;
        }
        while let Some(e) = m.poll_event() {
            if let InitiatorEvent::Unexpected(h) = &e {
                tracing::debug!(?h, "discovery: unexpected PDU");
            }
            if let Some(outcome) = done(e) {
                return outcome;
            }
        }
        match tokio::time::timeout(timeout, dm.next_event()).await {
            Ok(DmEvent::Control(p)) => m.handle_pdu(&p.header, p.data),
            Ok(_) => return Err(Error::ConnectionLost),
            Err(_) => return Err(Error::Timeout),
        }
    }
}
