//! Throughput of the software iWARP RNIC over loopback TCP, both ends in this process (like
//! perftest's ib_write_bw / ib_read_bw / ib_send_bw), and of raw TCP the same way as the
//! reference.
//!
//! ```text
//! cargo run --release --example iwarp_perf -- --op write|read|send|tcp --size 1MiB [--total 2GiB] [--depth 16] [--crc]
//! ```
//! Prints one line: `op size MiB/s`.

use clap::Parser;
use riser::iwarp::{RnicConfig, SoftRnic};
use riser::verbs::{
    Access, CompletionQueue, ConnParam, ConnectionRequest, Listener, MemoryRegion, ProtectionDomain, Provider, QpCaps, QueuePair, RecvWr,
    SendOp, SendWr, Sge, WcStatus,
};
use std::io::{Read, Write};
use std::time::{Duration, Instant};

#[derive(Parser, Debug)]
struct Args {
    /// write, read, send, or tcp (raw loopback TCP, the reference).
    #[arg(long)]
    op: String,
    /// Message size.
    #[arg(long, default_value = "1MiB")]
    size: String,
    /// Bytes to move in all.
    #[arg(long, default_value = "2GiB")]
    total: String,
    /// Messages in flight.
    #[arg(long, default_value_t = 16)]
    depth: usize,
    /// Ask for MPA CRC32C.
    #[arg(long)]
    crc: bool,
}

fn main() {
    let a = Args::parse();
    let size = riser::cli::parse_size(&a.size).expect("--size") as usize;
    let total = riser::cli::parse_size(&a.total).expect("--total");
    let count = (total / size as u64).max(1);
    let secs = match a.op.as_str() {
        "tcp" => raw_tcp(size, count),
        op => rdma(op, size, count, a.depth, a.crc),
    };
    let mib = (count * size as u64) as f64 / (1 << 20) as f64;
    println!("{} {} {:.1}", a.op, size, mib / secs);
}

fn raw_tcp(size: usize, count: u64) -> f64 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let rx = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let mut buf = vec![0u8; size];
        for _ in 0..count {
            s.read_exact(&mut buf).unwrap();
        }
        s.write_all(&[1]).unwrap();
    });
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_nodelay(true).unwrap();
    let buf = vec![7u8; size];
    let t0 = Instant::now();
    for _ in 0..count {
        s.write_all(&buf).unwrap();
    }
    let mut ack = [0u8; 1];
    s.read_exact(&mut ack).unwrap();
    let secs = t0.elapsed().as_secs_f64();
    rx.join().unwrap();
    secs
}

fn rdma(op: &str, size: usize, count: u64, depth: usize, crc: bool) -> f64 {
    let cfg = RnicConfig::default().crc(crc);
    let server = SoftRnic::new(cfg.clone());
    let listener = server.listen("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = listener.local_addr().unwrap();
    let spd = server.alloc_pd().unwrap();
    let scq = server.create_cq(1024).unwrap();
    let all = Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE;
    let remote = spd.register(vec![3u8; size], all).unwrap();
    let (raddr, rkey) = (remote.addr(), remote.rkey());
    let is_send = op == "send";
    let accept = std::thread::spawn(move || {
        let mut req = listener.get_request().unwrap();
        // Every receive is posted up front (cycling over `depth` buffers): the sender needs no
        // credits, and the receive side's cost is what is measured.
        let caps = QpCaps { max_send_wr: 1024, max_recv_wr: count as u32 + 1, max_sge: 1 };
        let qp = req.create_qp(&spd, &scq, &scq, caps).unwrap();
        let bufs: Vec<_> = (0..depth).map(|_| spd.register(vec![0u8; size], Access::LOCAL_WRITE).unwrap()).collect();
        if is_send {
            for i in 0..count {
                let b = &bufs[i as usize % depth];
                qp.post_recv(RecvWr { wr_id: i, sg_list: vec![Sge { addr: b.addr(), length: size as u32, lkey: b.lkey() }].into() })
                    .unwrap();
            }
        }
        let qp = req.accept(&ConnParam { private_data: vec![], responder_resources: 16, initiator_depth: 16 }).unwrap();
        if is_send {
            let mut got = 0u64;
            while got < count {
                for wc in scq.poll(64) {
                    assert_eq!(wc.status, WcStatus::Success);
                    got += 1;
                }
                scq.wait_blocking(Duration::from_millis(100));
            }
        }
        (qp, remote)
    });
    let client = SoftRnic::new(cfg);
    let pd = client.alloc_pd().unwrap();
    // The send queue and its completion queue hold `depth` requests in flight (posts beyond the
    // send queue's depth fail).
    let room = (depth as u32).max(1024);
    let cq = client.create_cq(room).unwrap();
    let qp = client.create_qp(addr, &pd, &cq, &cq, QpCaps { max_send_wr: room, max_recv_wr: 16, max_sge: 1 }).unwrap();
    client.connect(&qp, &ConnParam { private_data: vec![], responder_resources: 16, initiator_depth: 16 }).unwrap();
    let local = pd.register(vec![9u8; size], all).unwrap();
    let sge = Sge { addr: local.addr(), length: size as u32, lkey: local.lkey() };
    let op = match op {
        "write" => SendOp::RdmaWrite { remote_addr: raddr, rkey },
        "read" => SendOp::RdmaRead { remote_addr: raddr, rkey },
        "send" => SendOp::Send,
        other => panic!("unknown --op {other}"),
    };
    // As perftest's cq_mod: only every `batch`-th request asks for a completion; requests
    // complete in order, so one completion accounts for the batch before it.
    let batch = (depth as u64 / 4).max(1);
    let t0 = Instant::now();
    let (mut posted, mut done) = (0u64, 0u64);
    while done < count {
        while posted < count && posted - done < depth as u64 {
            let signaled = posted % batch == batch - 1 || posted == count - 1;
            qp.post_send(SendWr { wr_id: posted, op, sg_list: vec![sge].into(), unregistered: None, signaled }).unwrap();
            posted += 1;
        }
        for wc in cq.poll(64) {
            assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
            done = wc.wr_id + 1;
        }
        if done < count && posted - done >= depth as u64 {
            cq.wait_blocking(Duration::from_millis(100));
        }
    }
    // Sends count when the receiver has them all.
    let (_sqp, _remote) = accept.join().unwrap();
    let secs = t0.elapsed().as_secs_f64();
    qp.disconnect();
    secs
}
