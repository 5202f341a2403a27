//! iWARP framing: FPDU header emit + MPA CRC32C over the segment (what the transmitter does
//! per FPDU), DDP header parse, MPA frame parse; the iSER header's parse and emit.

use criterion::{BenchmarkId, Criterion, Throughput, black_box, criterion_group, criterion_main};
use riser::iser::header::{IserHeader, IserOpcode, RemoteBuf};
use riser::iwarp::wire::{self, Header, IrdOrd, MpaFrame, Opcode};

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("iwarp/fpdu_frame");
    for size in [4096usize, 65516] {
        let payload = vec![0x5au8; size];
        for crc in [true, false] {
            // Without the CRC the payload is not touched: per frame, not per byte.
            g.throughput(if crc { Throughput::Bytes(size as u64) } else { Throughput::Elements(1) });
            g.bench_with_input(BenchmarkId::new(if crc { "crc" } else { "nocrc" }, size), &payload, |b, p| {
                b.iter(|| {
                    let mut head = [0u8; 16];
                    let n = Header::Tagged { op: Opcode::Write, last: true, stag: 0x1234_5600, to: 0x7f00_0000_0000 }.emit(&mut head[2..]);
                    head[..2].copy_from_slice(&((n + p.len()) as u16).to_be_bytes());
                    let pad = [0u8; 3];
                    let pad = &pad[..wire::fpdu_pad(n + p.len())];
                    if crc { wire::fpdu_crc(&[&head[..2 + n], black_box(p), pad]) } else { [0; 4] }
                })
            });
        }
    }
    g.finish();
    let mut hb = [0u8; 18];
    Header::Untagged { op: Opcode::Send, last: true, inv_stag: 0, qn: 0, msn: 7, mo: 0 }.emit(&mut hb);
    c.bench_function("iwarp/ddp_header/parse", |b| b.iter(|| Header::parse(black_box(&hb)).unwrap()));
    let mpa = MpaFrame {
        reply: true,
        flags: 0,
        rev: 2,
        ird_ord: Some(IrdOrd { ird: 4, ord: 4, ..IrdOrd::default() }),
        private_data: vec![0; 28],
    }
    .emit();
    c.bench_function("iwarp/mpa_frame/parse", |b| b.iter(|| MpaFrame::parse(black_box(&mpa)).unwrap()));
    let iser = IserHeader {
        opcode: IserOpcode::Control,
        write: Some(RemoteBuf { stag: 0x1234_5601, va: 0x7f00_0000_1000 }),
        read: Some(RemoteBuf { stag: 0x1234_5602, va: 0x7f00_0010_0000 }),
    };
    let ib = iser.emit();
    c.bench_function("iser/header/parse", |b| b.iter(|| IserHeader::parse(black_box(&ib)).unwrap()));
    c.bench_function("iser/header/emit", |b| b.iter(|| black_box(&iser).emit()));
}

criterion_group!(benches, bench);
criterion_main!(benches);
