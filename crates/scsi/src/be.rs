//! Big-endian helpers over slices whose length the caller has already checked.

pub(crate) fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}
pub(crate) fn u24_at(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([0, b[at], b[at + 1], b[at + 2]])
}
pub(crate) fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}
pub(crate) fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_be_bytes(a)
}
pub(crate) fn put_u16(b: &mut [u8], at: usize, v: u16) {
    b[at..at + 2].copy_from_slice(&v.to_be_bytes());
}
pub(crate) fn put_u24(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 3].copy_from_slice(&v.to_be_bytes()[1..]);
}
pub(crate) fn put_u32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_be_bytes());
}
pub(crate) fn put_u64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_be_bytes());
}
pub(crate) fn need(what: &'static str, b: &[u8], n: usize) -> Result<(), crate::Error> {
    if b.len() < n { Err(crate::Error::truncated(what, n, b.len())) } else { Ok(()) }
}
