//! Randomness from the operating system's generator (feature `std`), for everything a peer must
//! not predict: CHAP identifiers and challenges, initial StatSNs, ISIDs, TSIHs. There is no
//! fallback: without the OS generator, a caller refuses the login rather than use guessable
//! values (a predictable challenge lets a recorded CHAP response be replayed).

/// The operating system's generator failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("no OS random generator: {0}")]
pub struct EntropyError(getrandom::Error);

/// Fill `buf` from the operating system's generator.
pub fn fill(buf: &mut [u8]) -> Result<(), EntropyError> {
    getrandom::fill(buf).map_err(EntropyError)
}

/// `N` bytes from the operating system's generator.
pub fn entropy<const N: usize>() -> Result<[u8; N], EntropyError> {
    let mut b = [0u8; N];
    fill(&mut b)?;
    Ok(b)
}

#[cfg(test)]
mod tests {
    #[test]
    fn draws_differ() {
        let a: [u8; 32] = super::entropy().unwrap();
        let b: [u8; 32] = super::entropy().unwrap();
        assert_ne!(a, b, "two 256-bit draws coincide with odds 2^-256");
    }
}
