//! CDB parse and emit for the hot commands.

use criterion::{Criterion, black_box, criterion_group, criterion_main};
use riser::scsi::cdb::Cdb;

fn bench(c: &mut Criterion) {
    let read10 = [0x28u8, 0, 0, 0x12, 0x34, 0x56, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0];
    let write16 = [0x8au8, 0x08, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0x10, 0, 0, 0];
    c.bench_function("cdb/parse/read10", |b| b.iter(|| Cdb::parse(black_box(&read10)).unwrap()));
    c.bench_function("cdb/parse/write16", |b| b.iter(|| Cdb::parse(black_box(&write16)).unwrap()));
    let cdb = Cdb::parse(&read10).unwrap();
    c.bench_function("cdb/emit/read10", |b| {
        let mut out = [0u8; 16];
        b.iter(|| black_box(&cdb).emit(&mut out).unwrap())
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
