//! rping over riser's software iWARP RNIC (or, built with `rdma-core`, over an RDMA device): the
//! client and server of rdma-core's `rping` protocol, on the wire compatible with it (and so with
//! the Linux kernel's siw and rxe).
//!
//! ```text
//! cargo run --release --example rping -- -s|-c -a ADDR [-p PORT] [-C COUNT] [-S SIZE] [-v] [--crc] [--p2p]
//!     [--rdma-provider soft|rdma-core] [--rdma-keys auto|windows|per-region|fixed-pool]
//! ```
//!
//! Per ping the client advertises its source buffer (address, rkey, size in one 16-byte Send);
//! the server RDMA Reads it and answers "go ahead"; the client advertises its sink buffer; the
//! server RDMA Writes what it read there and answers "go ahead"; the client compares the two
//! buffers. The exit status is 0 only when every ping verified.

use clap::Parser;
use riser::iwarp::{RnicConfig, SoftRnic};
use riser::verbs::{
    Access, CompletionQueue, ConnParam, ConnectionRequest, Listener, MemoryRegion, ProtectionDomain, Provider, QpCaps, QueuePair, RecvWr,
    SendOp, SendWr, Sge, Wc, WcOpcode, WcStatus,
};
use std::cell::RefCell;
use std::collections::VecDeque;
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;

#[derive(Parser, Debug)]
#[command(about = "rping over riser's software iWARP RNIC", disable_help_flag = true)]
struct Args {
    /// Run as the server.
    #[arg(short = 's', conflicts_with = "client")]
    server: bool,
    /// Run as the client.
    #[arg(short = 'c')]
    client: bool,
    /// Address to listen on (server) or connect to (client).
    #[arg(short = 'a')]
    addr: String,
    /// Port (rping's default 7174).
    #[arg(short = 'p', default_value_t = 7174)]
    port: u16,
    /// Number of pings (0 or absent: until interrupted).
    #[arg(short = 'C', default_value_t = 0)]
    count: u64,
    /// Ping size in bytes (at least 26).
    #[arg(short = 'S', default_value_t = 64)]
    size: usize,
    /// Print the ping data.
    #[arg(short = 'v')]
    verbose: bool,
    /// Verify the data (always done; accepted for rping compatibility).
    #[arg(short = 'V')]
    _validate: bool,
    /// Debug output.
    #[arg(short = 'd')]
    debug: bool,
    /// Ask for MPA CRC32C (off unless either side asks).
    #[arg(long)]
    crc: bool,
    /// Client: ask for MPA peer-to-peer mode (RFC 6581) and send the ready-to-receive message.
    #[arg(long)]
    p2p: bool,
    /// soft (riser's software iWARP RNIC) or rdma-core (the RDMA device owning / routing to ADDR).
    #[arg(long, default_value = "soft")]
    rdma_provider: String,
    /// rdma-core: how the ping buffers are keyed.
    #[arg(long)]
    rdma_keys: Option<String>,
    /// Help.
    #[arg(short = 'h', long = "help", action = clap::ArgAction::Help)]
    _help: Option<bool>,
}

/// rping's `struct rping_rdma_info`: 16 bytes, big-endian.
fn advert(addr: u64, rkey: u32, size: u32) -> [u8; 16] {
    let mut b = [0u8; 16];
    b[..8].copy_from_slice(&addr.to_be_bytes());
    b[8..12].copy_from_slice(&rkey.to_be_bytes());
    b[12..].copy_from_slice(&size.to_be_bytes());
    b
}

fn parse_advert(b: &[u8]) -> (u64, u32, u32) {
    let be32 = |o: usize| u32::from_be_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
    ((u64::from(be32(0)) << 32) | u64::from(be32(4)), be32(8), be32(12))
}

/// The client's payload for ping `k`: `rdma-ping-k: ` then a running letter sequence, NUL-terminated.
fn ping_payload(k: u64, size: usize) -> Vec<u8> {
    let mut v = format!("rdma-ping-{k}: ").into_bytes();
    let mut c = b'A' + (k % 58) as u8;
    while v.len() < size - 1 {
        v.push(c);
        c = if c >= b'z' { b'A' } else { c + 1 };
    }
    v.truncate(size - 1);
    v.push(0);
    v
}

fn printable(b: &[u8]) -> String {
    String::from_utf8_lossy(b.split(|&x| x == 0).next().unwrap_or_default()).into_owned()
}

/// One connection's resources.
struct Conn<P: Provider> {
    cq: Arc<P::Cq>,
    qp: Arc<P::Qp>,
    recv: Arc<<P::Pd as ProtectionDomain>::Mr>,
    send: Arc<<P::Pd as ProtectionDomain>::Mr>,
    debug: bool,
    /// Completions polled while waiting for another kind: a peer's answer can complete before
    /// the Send that asked for it is reported, so nothing polled is thrown away.
    pending: RefCell<VecDeque<Wc>>,
}

impl<P: Provider> Conn<P> {
    /// The connection's 16-byte message buffers (receive: local write; send: local only).
    fn new(cq: Arc<P::Cq>, qp: Arc<P::Qp>, pd: &P::Pd, debug: bool) -> Result<Self, String> {
        let reg = |acc| pd.register(vec![0u8; 16], acc).map_err(|e| e.to_string());
        Ok(Self { cq, qp, recv: reg(Access::LOCAL_WRITE)?, send: reg(Access::empty())?, debug, pending: RefCell::new(VecDeque::new()) })
    }

    fn post_recv(&self) -> Result<(), String> {
        self.qp.post_recv(RecvWr { wr_id: 1, sg_list: vec![whole(&*self.recv)].into() }).map_err(|e| e.to_string())
    }

    /// Wait for the next completion of `op` (errors other than flushes end the program).
    fn wait(&self, op: WcOpcode) -> Result<Wc, String> {
        loop {
            let earlier = {
                let mut p = self.pending.borrow_mut();
                p.iter().position(|w| w.opcode == op).and_then(|i| p.remove(i))
            };
            if let Some(wc) = earlier {
                return Ok(wc);
            }
            let mut flushed = false;
            for wc in self.cq.poll(16) {
                if self.debug {
                    eprintln!("cq: {wc:?}");
                }
                match wc.status {
                    // Flushes come with the end of the connection (as rping, they are not errors):
                    // a completion that made it before them still counts.
                    WcStatus::WrFlushErr => flushed = true,
                    WcStatus::Success => self.pending.borrow_mut().push_back(wc),
                    other => return Err(format!("{:?} completed with {other:?}", wc.opcode)),
                }
            }
            if self.pending.borrow().iter().any(|w| w.opcode == op) {
                continue;
            }
            if flushed || !self.qp.is_connected() {
                // Give completions racing the flush a moment before giving up.
                if !self.cq.wait_blocking(Duration::from_millis(200)) {
                    return Err("disconnected".into());
                }
            } else {
                self.cq.wait_blocking(Duration::from_secs(1));
            }
        }
    }

    fn send_advert(&self, addr: u64, rkey: u32, size: u32) -> Result<(), String> {
        self.send.write(&mut |b| b[..16].copy_from_slice(&advert(addr, rkey, size)));
        self.qp
            .post_send(SendWr { wr_id: 2, op: SendOp::Send, sg_list: vec![whole(&*self.send)].into(), unregistered: None, signaled: true })
            .map_err(|e| e.to_string())?;
        self.wait(WcOpcode::Send).map(|_| ())
    }

    /// Receive a 16-byte message and repost the receive.
    fn recv_msg(&self) -> Result<[u8; 16], String> {
        let wc = self.wait(WcOpcode::Recv)?;
        if wc.byte_len != 16 {
            return Err(format!("Received bogus data, size {}", wc.byte_len));
        }
        let mut m = [0u8; 16];
        self.recv.read(&mut |b| m.copy_from_slice(&b[..16]));
        self.post_recv()?;
        Ok(m)
    }
}

fn whole<M: MemoryRegion + ?Sized>(mr: &M) -> Sge {
    Sge { addr: mr.addr(), length: mr.len() as u32, lkey: mr.lkey() }
}

fn resolve(addr: &str, port: u16) -> Result<SocketAddr, String> {
    (addr, port).to_socket_addrs().map_err(|e| format!("{addr}: {e}"))?.next().ok_or_else(|| format!("{addr}: no address"))
}

fn server<P: Provider>(p: &P, a: &Args) -> Result<(), String> {
    let addr = resolve(&a.addr, a.port)?;
    let listener = p.listen(addr).map_err(|e| format!("listen on {addr}: {e}"))?;
    let mut req = listener.get_request().map_err(|e| e.to_string())?;
    let pd = p.alloc_pd().map_err(|e| e.to_string())?;
    let cq = p.create_cq(32).map_err(|e| e.to_string())?;
    let qp = req.create_qp(&pd, &cq, &cq, QpCaps { max_send_wr: 16, max_recv_wr: 2, max_sge: 1 }).map_err(|e| e.to_string())?;
    let reg = |n, acc| pd.register(vec![0u8; n], acc).map_err(|e| e.to_string());
    let conn = Conn::<P>::new(cq, qp, &pd, a.debug)?;
    conn.post_recv()?;
    let (ird, ord) = req.ird_ord();
    // As librdmacm's rdma_accept(id, NULL): IRD/ORD as the request asked.
    req.accept(&ConnParam { private_data: vec![], responder_resources: ord.max(1), initiator_depth: ird.max(1) })
        .map_err(|e| e.to_string())?;
    // Registered once connected: a memory window is bound by a request on the send queue.
    let rdma = reg(a.size, Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE)?;
    if let Some(e) = conn.qp.established() {
        eprintln!("rping server: connection from {} ({})", e.peer.map(|p| p.to_string()).unwrap_or_default(), e.description);
    }
    let mut pings = 0u64;
    loop {
        // Source advert: RDMA Read it.
        let m = match conn.recv_msg() {
            Ok(m) => m,
            Err(e) if e == "disconnected" => break,
            Err(e) => return Err(e),
        };
        let (raddr, rkey, rlen) = parse_advert(&m);
        if rlen as usize > a.size {
            return Err(format!("client's size {rlen} exceeds the server's {}", a.size));
        }
        let sink = Sge { addr: rdma.addr(), length: rlen, lkey: rdma.lkey() };
        conn.qp
            .post_send(SendWr {
                wr_id: 3,
                op: SendOp::RdmaRead { remote_addr: raddr, rkey },
                sg_list: vec![sink].into(),
                unregistered: None,
                signaled: true,
            })
            .map_err(|e| e.to_string())?;
        conn.wait(WcOpcode::RdmaRead)?;
        if a.verbose {
            rdma.read(&mut |b| println!("server ping data: {}", printable(&b[..rlen as usize])));
        }
        conn.send_advert(0, 0, 0)?;
        // Sink advert: RDMA Write what was read.
        let (waddr, wkey, wlen) = parse_advert(&conn.recv_msg()?);
        let n = wlen.min(rlen);
        conn.qp
            .post_send(SendWr {
                wr_id: 4,
                op: SendOp::RdmaWrite { remote_addr: waddr, rkey: wkey },
                sg_list: vec![Sge { addr: rdma.addr(), length: n, lkey: rdma.lkey() }].into(),
                unregistered: None,
                signaled: true,
            })
            .map_err(|e| e.to_string())?;
        conn.wait(WcOpcode::RdmaWrite)?;
        conn.send_advert(0, 0, 0)?;
        pings += 1;
        if a.count > 0 && pings == a.count {
            // As rdma-core's rping server, leave the ending to the client: disconnecting right
            // after the last go-ahead races the client's check of that ping (its CM thread may
            // see DISCONNECTED before its CQ shows the go-ahead). Give it 10 s.
            let t0 = std::time::Instant::now();
            while conn.qp.is_connected() && t0.elapsed() < Duration::from_secs(10) {
                std::thread::sleep(Duration::from_millis(10));
            }
            break;
        }
    }
    conn.qp.disconnect();
    if a.debug {
        eprintln!("server: {pings} pings");
    }
    Ok(())
}

fn client<P: Provider>(p: &P, a: &Args) -> Result<(), String> {
    let addr = resolve(&a.addr, a.port)?;
    let pd = p.alloc_pd().map_err(|e| e.to_string())?;
    let cq = p.create_cq(32).map_err(|e| e.to_string())?;
    let qp = p.create_qp(addr, &pd, &cq, &cq, QpCaps { max_send_wr: 16, max_recv_wr: 2, max_sge: 1 }).map_err(|e| e.to_string())?;
    let reg = |n, acc| pd.register(vec![0u8; n], acc).map_err(|e| e.to_string());
    let conn = Conn::<P>::new(cq, qp, &pd, a.debug)?;
    conn.post_recv()?;
    let est = p
        .connect(&conn.qp, &ConnParam { private_data: vec![], responder_resources: 1, initiator_depth: 1 })
        .map_err(|e| format!("connect to {addr}: {e}"))?;
    // Registered once connected: a memory window is bound by a request on the send queue.
    let all = Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE;
    let start = reg(a.size, all)?;
    let rdma = reg(a.size, all)?;
    eprintln!("rping client: connected to {addr} ({})", est.description);
    let mut k = 0u64;
    while a.count == 0 || k < a.count {
        let payload = ping_payload(k, a.size);
        start.write(&mut |b| b.copy_from_slice(&payload));
        rdma.write(&mut |b| b.fill(0));
        conn.send_advert(start.addr(), start.rkey(), a.size as u32)?;
        conn.recv_msg()?;
        conn.send_advert(rdma.addr(), rdma.rkey(), a.size as u32)?;
        conn.recv_msg()?;
        let mut got = Vec::new();
        rdma.read(&mut |b| got = b.to_vec());
        if got != payload {
            return Err(format!("data mismatch in ping {k}: sent {:?}, got {:?}", printable(&payload), printable(&got)));
        }
        if a.verbose {
            println!("ping data: {}", printable(&got));
        }
        k += 1;
    }
    conn.qp.disconnect();
    println!("rping: {k} pings of {} bytes verified", a.size);
    Ok(())
}

#[cfg(feature = "rdma-core")]
fn rdma_core(a: &Args) -> Result<(), String> {
    use riser::verbs::rdma_core::{RdmaCore, RdmaCoreConfig};
    let addr = resolve(&a.addr, a.port)?;
    let cfg = RdmaCoreConfig {
        keys: a.rdma_keys.as_deref().map(riser::cli::parse_key_mode).transpose()?.unwrap_or_default(),
        ..Default::default()
    };
    let dev =
        if a.server { RdmaCore::for_address(addr.ip(), cfg) } else { RdmaCore::for_destination(addr, cfg) }.map_err(|e| e.to_string())?;
    if a.server { server(&dev, a) } else { client(&dev, a) }
}

#[cfg(not(feature = "rdma-core"))]
fn rdma_core(_: &Args) -> Result<(), String> {
    Err("built without rdma-core support: build with `--features rdma-core`".into())
}

fn main() {
    let a = Args::parse();
    if a.size < 26 {
        eprintln!("error: -S must be at least 26");
        std::process::exit(2);
    }
    if a.server == a.client {
        eprintln!("error: one of -s (server) or -c (client)");
        std::process::exit(2);
    }
    let r = match a.rdma_provider.as_str() {
        "soft" => {
            let rnic = SoftRnic::new(RnicConfig::default().crc(a.crc).p2p(a.p2p));
            if a.server { server(&rnic, &a) } else { client(&rnic, &a) }
        }
        "rdma-core" => rdma_core(&a),
        other => Err(format!("unknown RDMA provider {other:?} (soft, rdma-core)")),
    };
    if let Err(e) = r {
        eprintln!("rping: {e}");
        std::process::exit(1);
    }
}
