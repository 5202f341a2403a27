//! BHS parse/emit and whole-PDU parse with 8 KiB and 256 KiB data segments. The PDU parse must
//! not depend on the data size: data segments are views into the receive buffer, not copies.
//! CRC32C (the header and data digests) over 48 bytes, 8 KiB and 256 KiB.

use bytes::Bytes;
use criterion::{BenchmarkId, Criterion, Throughput, black_box, criterion_group, criterion_main};
use riser::iscsi::wire::{BHS_LEN, Bhs, DataIn, Header, Pdu, ScsiCommand};
use riser::scsi::lun::Lun;

fn data_in(len: usize) -> Vec<u8> {
    let h = Header::DataIn(DataIn {
        final_: true,
        lun: Lun::ZERO,
        itt: 7,
        ttt: u32::MAX,
        data_sn: 3,
        buffer_offset: 65536,
        ..DataIn::default()
    });
    let mut out = Vec::new();
    Pdu::new(h, &[][..], &vec![0xa5u8; len][..]).encode(&mut out);
    out
}

fn bench(c: &mut Criterion) {
    let cmd = Header::ScsiCommand(ScsiCommand {
        final_: true,
        read: true,
        attr: 1,
        itt: 42,
        expected_data_len: 4096,
        cmd_sn: 9,
        cdb: [0x28, 0, 0, 0, 0x10, 0, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0],
        ..ScsiCommand::default()
    });
    let mut bhs = [0u8; BHS_LEN];
    cmd.emit(&mut bhs, 0, 0);

    c.bench_function("bhs/parse", |b| b.iter(|| Header::parse(&Bhs::new_checked(black_box(&bhs[..])).unwrap()).unwrap()));
    c.bench_function("bhs/emit", |b| {
        let mut out = [0u8; BHS_LEN];
        b.iter(|| black_box(&cmd).emit(&mut out, 0, 0))
    });

    let mut g = c.benchmark_group("pdu/parse");
    for len in [8 * 1024, 256 * 1024] {
        let bytes = data_in(len);
        let shared = Bytes::from(bytes.clone());
        g.throughput(Throughput::Elements(1));
        g.bench_with_input(BenchmarkId::new("slice", len), &bytes, |b, buf| b.iter(|| Pdu::parse(black_box(buf)).unwrap()));
        g.bench_with_input(BenchmarkId::new("bytes", len), &shared, |b, buf| b.iter(|| Pdu::parse_bytes(black_box(buf)).unwrap()));
    }
    g.finish();

    let mut g = c.benchmark_group("crc32c");
    for len in [48usize, 8 * 1024, 256 * 1024] {
        let data = vec![0x3cu8; len];
        g.throughput(Throughput::Bytes(len as u64));
        g.bench_with_input(BenchmarkId::from_parameter(len), &data, |b, d| b.iter(|| crc32c::crc32c(black_box(d))));
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
