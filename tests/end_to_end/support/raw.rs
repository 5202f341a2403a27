//! A connection below the initiator library, driven PDU by PDU (the login done with riser's
//! sans-IO machine): through a datamover of any transport, or as bytes on a TCP socket for
//! the tests of TCP framing and of a peer that stops reading.

use super::{ME, TARGET, WAIT};
use bytes::Bytes;
use riser::datamover::{ConnectionResources, ControlPdu, DmEvent, SharedDatamover};
use riser::initiator::Connector;
use riser::iscsi::keys::OperationalConfig;
use riser::iscsi::login::{InitiatorLogin, InitiatorLoginConfig, InitiatorLoginEvent, LoginOutcome};
use riser::iscsi::wire::{Header, Isid, NopOut, Pdu, ScsiCommand, ScsiResponse};
use riser::scsi::lun::Lun;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// What carries the PDUs.
#[derive(Debug)]
pub(crate) enum Link {
    /// A datamover (TCP or iSER): R2Ts and Data-In without status stay inside it.
    Dm(SharedDatamover),
    /// Bytes on a TCP socket: every PDU the target sends is seen, and nothing is read unasked.
    Socket(TcpStream),
}

/// A logged-in connection driven PDU by PDU.
#[derive(Debug)]
pub(crate) struct Raw {
    pub(crate) link: Link,
    pub(crate) o: LoginOutcome,
    /// The CmdSN of the next non-immediate command.
    pub(crate) cmd_sn: u32,
    /// Statuses of other commands that arrived while waiting for one (any order is right).
    stash: Vec<(ScsiResponse, Vec<u8>)>,
}

/// Write one PDU (no digests) to `sock`.
pub(crate) async fn write_pdu(sock: &mut TcpStream, h: Header, data: &[u8]) {
    let mut bytes = Vec::new();
    Pdu::new(h, &[][..], data).encode(&mut bytes);
    sock.write_all(&bytes).await.unwrap();
}

/// Read one PDU (no digests) from `sock`; None at the end of the connection or on a PDU that
/// does not parse.
pub(crate) async fn read_pdu(sock: &mut TcpStream) -> Option<(Header, Vec<u8>)> {
    let mut bhs = [0u8; 48];
    sock.read_exact(&mut bhs).await.ok()?;
    let dsl = u32::from_be_bytes([0, bhs[5], bhs[6], bhs[7]]) as usize;
    let mut rest = vec![0u8; bhs[4] as usize * 4 + dsl.div_ceil(4) * 4];
    sock.read_exact(&mut rest).await.ok()?;
    let mut all = bhs.to_vec();
    all.extend_from_slice(&rest);
    let (p, _) = Pdu::parse(&all).ok()?;
    Some((p.header, p.data.to_vec()))
}

/// Read everything the peer sends on `sock`; whether the connection then ended (EOF or reset)
/// within `t`.
pub(crate) async fn ends_within(sock: &mut TcpStream, t: Duration) -> bool {
    let mut buf = vec![0u8; 1 << 20];
    tokio::time::timeout(t, async {
        loop {
            if matches!(sock.read(&mut buf).await, Ok(0) | Err(_)) {
                return;
            }
        }
    })
    .await
    .is_ok()
}

/// Log in over `dm` with the sans-IO machine (`first_keys` appended to the first request),
/// taking the initiator's steps at the end of login; the datamover is enabled. Panics unless
/// the login succeeds.
pub(crate) async fn login_over(dm: &SharedDatamover, cfg: InitiatorLoginConfig, first_keys: &[u8]) -> LoginOutcome {
    let mut l = InitiatorLogin::new(cfg, Duration::ZERO, [7; 32]);
    let mut first = true;
    loop {
        while let Some(mut p) = l.poll_transmit() {
            if std::mem::take(&mut first) {
                p.data.extend_from_slice(first_keys);
            }
            // As the initiator does: full-feature resources (iSER: its receives) before the
            // request the final Login Response may answer. Without them an iSER link has only
            // its login receives, and a burst of responses overruns them.
            if p.asks_for_full_feature() {
                dm.allocate_connection_resources(ConnectionResources::default()).unwrap();
            }
            dm.send_control(ControlPdu::new(Header::LoginRequest(p.header), p.data.into())).await.unwrap();
        }
        match l.poll_event() {
            Some(InitiatorLoginEvent::Complete(o)) => {
                dm.notice_key_values(&o.params);
                dm.enable();
                return o;
            }
            Some(e) => panic!("login: {e:?}"),
            None => {}
        }
        match tokio::time::timeout(WAIT, dm.next_event()).await.expect("a login answer") {
            DmEvent::Control(p) => l.handle_pdu(Duration::ZERO, &p.header, &p.data),
            other => panic!("login: {other:?}"),
        }
    }
}

impl Raw {
    /// Log in through a datamover of `connector`.
    pub(crate) async fn login(connector: std::sync::Arc<dyn Connector>, addr: SocketAddr, op: OperationalConfig, isid: u8) -> Self {
        let dm = connector.connect(addr).await.unwrap();
        let mut cfg = InitiatorLoginConfig::new(ME, Some(TARGET.into()), Isid([0x80, 0, 0, 0, 0, isid]));
        cfg.transport = connector.transport();
        cfg.operational = op;
        let o = login_over(&dm, cfg, b"").await;
        Self { link: Link::Dm(dm), cmd_sn: o.exp_cmd_sn, o, stash: Vec::new() }
    }

    /// Log in over a TCP socket of its own, PDUs written and read as bytes.
    pub(crate) async fn login_tcp(addr: SocketAddr, op: OperationalConfig, isid: u8) -> Self {
        let mut sock = TcpStream::connect(addr).await.unwrap();
        let mut cfg = InitiatorLoginConfig::new(ME, Some(TARGET.into()), Isid([0x80, 0, 0, 0, 0, isid]));
        cfg.operational = op;
        let mut l = InitiatorLogin::new(cfg, Duration::ZERO, [5; 32]);
        loop {
            while let Some(p) = l.poll_transmit() {
                write_pdu(&mut sock, Header::LoginRequest(p.header), &p.data).await;
            }
            if let Some(InitiatorLoginEvent::Complete(o)) = l.poll_event() {
                return Self { link: Link::Socket(sock), cmd_sn: o.exp_cmd_sn, o, stash: Vec::new() };
            }
            let (h, d) = tokio::time::timeout(WAIT, read_pdu(&mut sock)).await.unwrap().expect("login answer");
            l.handle_pdu(Duration::ZERO, &h, &d);
        }
    }

    /// The datamover (panics on a socket link).
    pub(crate) fn dm(&self) -> &SharedDatamover {
        match &self.link {
            Link::Dm(dm) => dm,
            Link::Socket(_) => panic!("a socket link has no datamover"),
        }
    }

    /// The socket (panics on a datamover link).
    pub(crate) fn sock(&mut self) -> &mut TcpStream {
        match &mut self.link {
            Link::Socket(s) => s,
            Link::Dm(_) => panic!("a datamover link has no socket"),
        }
    }

    /// Send `h` with `data` exactly as built (over iSER: as a control PDU, advertising no
    /// buffer).
    pub(crate) async fn send(&mut self, h: Header, data: &[u8]) {
        match &mut self.link {
            Link::Dm(dm) => dm.send_control(ControlPdu::new(h, Bytes::copy_from_slice(data))).await.unwrap(),
            Link::Socket(sock) => write_pdu(sock, h, data).await,
        }
    }

    /// Send a command with its buffers, as the initiator library does: a read buffer of
    /// `read_len` bytes and the write data (TCP: immediate and unsolicited data as negotiated,
    /// R2Ts answered; iSER: the buffers registered and advertised).
    pub(crate) async fn submit(&mut self, h: Header, read_len: u32, write: Option<Bytes>) {
        let Header::ScsiCommand(c) = h else { panic!("not a command: {h:?}") };
        self.dm().send_command(c, Bytes::new(), read_len, write).await.unwrap();
    }

    /// The next PDU, within `t` (None: nothing came, or the connection ended).
    pub(crate) async fn next_within(&mut self, t: Duration) -> Option<(Header, Vec<u8>)> {
        match &mut self.link {
            Link::Socket(sock) => tokio::time::timeout(t, read_pdu(sock)).await.ok().flatten(),
            Link::Dm(dm) => tokio::time::timeout(t, async {
                loop {
                    match dm.next_event().await {
                        DmEvent::Control(p) => return Some((p.header, p.data.to_vec())),
                        DmEvent::Terminated(_) => return None,
                        _ => {}
                    }
                }
            })
            .await
            .ok()
            .flatten(),
        }
    }

    pub(crate) async fn next(&mut self) -> (Header, Vec<u8>) {
        self.next_within(WAIT).await.expect("an answer from the target")
    }

    /// A SCSI command with the next CmdSN (or an immediate one with the current).
    pub(crate) fn command(&mut self, itt: u32, cdb: &[u8], edtl: u32, write: bool, final_: bool, immediate: bool) -> Header {
        self.command_rw(itt, cdb, edtl, !write && edtl > 0, write, final_, immediate)
    }

    /// As [`command`](Self::command), with the R and W bits as given.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn command_rw(&mut self, itt: u32, cdb: &[u8], edtl: u32, read: bool, write: bool, final_: bool, immediate: bool) -> Header {
        let mut c = [0u8; 16];
        c[..cdb.len()].copy_from_slice(cdb);
        let h = Header::ScsiCommand(ScsiCommand {
            immediate,
            final_,
            read,
            write,
            attr: 1,
            lun: Lun::ZERO,
            itt,
            expected_data_len: edtl,
            cmd_sn: self.cmd_sn,
            exp_stat_sn: self.o.stat_sn,
            cdb: c,
        });
        if !immediate {
            self.cmd_sn = self.cmd_sn.wrapping_add(1);
        }
        h
    }

    /// The connection lives: a whole write (8 KiB, all immediate data, F=1) as task `itt`
    /// ends GOOD. (Needs ImmediateData=Yes.)
    pub(crate) async fn whole_write_succeeds(&mut self, itt: u32) {
        let h = self.command(itt, &super::write10(0, 16), 8192, true, true, false);
        self.send(h, &[7; 8192]).await;
        assert_eq!(self.response(itt, |_| {}).await.0.status, riser::scsi::sense::Status::GOOD);
    }

    /// Wait for the status of `itt` — a SCSI Response, or a Data-In carrying it (phase
    /// collapse); other PDUs are passed to `seen`.
    pub(crate) async fn response(&mut self, itt: u32, mut seen: impl FnMut(&Header)) -> (ScsiResponse, Vec<u8>) {
        if let Some(i) = self.stash.iter().position(|(r, _)| r.itt == itt) {
            return self.stash.swap_remove(i);
        }
        loop {
            let (h, d) = self.next().await;
            match h {
                Header::ScsiResponse(r) if r.itt == itt => return (r, d),
                Header::ScsiResponse(r) => self.stash.push((r, d)),
                Header::DataIn(i) if i.status_present => {
                    let r = ScsiResponse {
                        itt: i.itt,
                        status: i.status,
                        underflow: i.underflow,
                        overflow: i.overflow,
                        residual: i.residual,
                        stat_sn: i.stat_sn,
                        exp_cmd_sn: i.exp_cmd_sn,
                        max_cmd_sn: i.max_cmd_sn,
                        ..ScsiResponse::default()
                    };
                    if i.itt == itt {
                        return (r, Vec::new());
                    }
                    self.stash.push((r, Vec::new()));
                }
                Header::DataIn(_) => {}
                other => seen(&other),
            }
        }
    }

    /// Read everything the target sends; whether the connection then ended (EOF or reset)
    /// within `t`.
    pub(crate) async fn ends_within(&mut self, t: Duration) -> bool {
        match &mut self.link {
            Link::Socket(sock) => ends_within(sock, t).await,
            Link::Dm(dm) => {
                tokio::time::timeout(t, async { while !matches!(dm.next_event().await, DmEvent::Terminated(_)) {} }).await.is_ok()
            }
        }
    }

    /// A NOP-Out (immediate) answered: the connection works. The NOP-In's MaxCmdSN.
    pub(crate) async fn ping(&mut self, itt: u32) -> u32 {
        let p = NopOut { immediate: true, lun: Lun::ZERO, itt, ttt: u32::MAX, cmd_sn: self.cmd_sn, exp_stat_sn: self.o.stat_sn };
        self.send(Header::NopOut(p), &[]).await;
        loop {
            if let (Header::NopIn(n), _) = self.next().await
                && n.itt == itt
            {
                return n.max_cmd_sn;
            }
        }
    }
}

impl Drop for Raw {
    fn drop(&mut self) {
        if let Link::Dm(dm) = &self.link {
            dm.terminate();
        }
    }
}
