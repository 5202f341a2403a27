//! iSCSI text: `key=value\0` pairs (RFC 7143 §6.1), C-bit reassembly across PDUs, splitting for
//! sending, and the value encodings (numbers, hex and base64 binary values).

use alloc::string::String;
use alloc::vec::Vec;
use base64::Engine as _;

/// Longest key name (RFC 7143 §6.1: 63 bytes).
pub const MAX_KEY_LEN: usize = 63;
/// Longest ordinary value (255 bytes); binary and list keys may be longer up to
/// [`MAX_LONG_VALUE_LEN`].
pub const MAX_VALUE_LEN: usize = 255;
/// Longest value of the keys that carry binary or address lists (CHAP_C, CHAP_R, TargetAddress).
pub const MAX_LONG_VALUE_LEN: usize = 8192;
/// Default limit on one reassembled text (all PDUs of one C-bit sequence).
pub const DEFAULT_MAX_TEXT: usize = 64 * 1024;

/// Malformed text.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TextError {
    /// The text does not end in NUL (RFC 7143 §6.1: every pair is NUL-terminated).
    #[error("text is not NUL-terminated")]
    MissingNul,
    /// A pair has no `=`.
    #[error("pair without '='")]
    MissingEquals,
    /// Empty key name.
    #[error("empty key name")]
    EmptyKey,
    /// Key longer than 63 bytes.
    #[error("key name longer than 63 bytes")]
    KeyTooLong,
    /// Value longer than allowed for the key.
    #[error("value of {key} longer than {max} bytes")]
    ValueTooLong {
        /// The key.
        key: String,
        /// Its limit.
        max: usize,
    },
    /// Not UTF-8.
    #[error("text is not UTF-8")]
    NotUtf8,
    /// Reassembled text over the limit.
    #[error("text exceeds {0} bytes")]
    TooLong(usize),
    /// A numeric value does not parse.
    #[error("bad numeric value {0:?}")]
    BadNumber(String),
    /// A binary value does not decode.
    #[error("bad binary value")]
    BadBinary,
}

fn value_limit(key: &str) -> usize {
    match key {
        "CHAP_C" | "CHAP_R" | "TargetAddress" | "SendTargets" => MAX_LONG_VALUE_LEN,
        _ => MAX_VALUE_LEN,
    }
}

/// Parse a complete text (the reassembled data segments) into borrowed pairs, in order.
/// Empty entries (consecutive NULs, as some peers pad with) are skipped.
pub fn parse_pairs(text: &[u8]) -> Result<Vec<(&str, &str)>, TextError> {
    if text.is_empty() {
        return Ok(Vec::new());
    }
    if *text.last().unwrap_or(&1) != 0 {
        return Err(TextError::MissingNul);
    }
    let s = core::str::from_utf8(text).map_err(|_| TextError::NotUtf8)?;
    let mut out = Vec::new();
    for item in s[..s.len() - 1].split('\0') {
        if item.is_empty() {
            continue;
        }
        let (k, v) = item.split_once('=').ok_or(TextError::MissingEquals)?;
        if k.is_empty() {
            return Err(TextError::EmptyKey);
        }
        if k.len() > MAX_KEY_LEN {
            return Err(TextError::KeyTooLong);
        }
        let max = value_limit(k);
        if v.len() > max {
            return Err(TextError::ValueTooLong { key: k.into(), max });
        }
        out.push((k, v));
    }
    Ok(out)
}

/// Builds text: appends `key=value\0`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TextBuilder {
    buf: Vec<u8>,
}

impl TextBuilder {
    /// Empty text.
    pub const fn new() -> Self {
        Self { buf: Vec::new() }
    }
    /// Append a pair.
    pub fn push(&mut self, key: &str, value: &str) -> &mut Self {
        self.buf.extend_from_slice(key.as_bytes());
        self.buf.push(b'=');
        self.buf.extend_from_slice(value.as_bytes());
        self.buf.push(0);
        self
    }
    /// Whether nothing was added.
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }
    /// The encoded text.
    pub fn into_bytes(self) -> Vec<u8> {
        self.buf
    }
    /// Borrow the encoded text.
    pub fn as_bytes(&self) -> &[u8] {
        &self.buf
    }
}

/// Reassembles text split over PDUs with the C (continue) bit.
#[derive(Clone, Debug)]
pub struct Reassembler {
    buf: Vec<u8>,
    max: usize,
}

impl Default for Reassembler {
    fn default() -> Self {
        Self::new(DEFAULT_MAX_TEXT)
    }
}

impl Reassembler {
    /// A reassembler refusing texts over `max` bytes.
    pub const fn new(max: usize) -> Self {
        Self { buf: Vec::new(), max }
    }
    /// Feed one PDU's data segment; returns the whole text when `cont` is false.
    pub fn push(&mut self, data: &[u8], cont: bool) -> Result<Option<Vec<u8>>, TextError> {
        if self.buf.len() + data.len() > self.max {
            self.buf.clear();
            return Err(TextError::TooLong(self.max));
        }
        self.buf.extend_from_slice(data);
        Ok(if cont { None } else { Some(core::mem::take(&mut self.buf)) })
    }
    /// Whether a partial text is pending.
    pub fn is_pending(&self) -> bool {
        !self.buf.is_empty()
    }
}

/// Split `text` into data segments of at most `max` bytes; each item says whether the C bit
/// must be set (more follows). An empty text yields one empty segment.
pub fn split(text: &[u8], max: usize) -> impl Iterator<Item = (&[u8], bool)> {
    let max = max.max(1);
    let n = text.len().div_ceil(max).max(1);
    (0..n).map(move |i| {
        let start = i * max;
        let end = (start + max).min(text.len());
        (&text[start.min(text.len())..end], i + 1 < n)
    })
}

/// Parse a numerical value: decimal, `0x` hexadecimal, or `0b` base64 (RFC 7143 §6.1).
pub fn parse_number(v: &str) -> Result<u64, TextError> {
    let bad = || TextError::BadNumber(v.into());
    if let Some(h) = v.strip_prefix("0x").or_else(|| v.strip_prefix("0X")) {
        if h.is_empty() || h.len() > 16 {
            return Err(bad());
        }
        u64::from_str_radix(h, 16).map_err(|_| bad())
    } else if v.starts_with("0b") || v.starts_with("0B") {
        let bytes = decode_binary(v).map_err(|_| bad())?;
        if bytes.len() > 8 {
            return Err(bad());
        }
        Ok(bytes.iter().fold(0u64, |a, b| (a << 8) | u64::from(*b)))
    } else {
        if v.is_empty() || v.len() > 20 || !v.bytes().all(|c| c.is_ascii_digit()) {
            return Err(bad());
        }
        v.parse().map_err(|_| bad())
    }
}

/// Decode a binary value: `0x` hex (an odd digit count gets a leading zero nibble) or `0b`
/// base64.
pub fn decode_binary(v: &str) -> Result<Vec<u8>, TextError> {
    if let Some(h) = v.strip_prefix("0x").or_else(|| v.strip_prefix("0X")) {
        if h.is_empty() {
            return Err(TextError::BadBinary);
        }
        let digits: Vec<u8> =
            h.bytes().map(|c| (c as char).to_digit(16).map(|d| d as u8).ok_or(TextError::BadBinary)).collect::<Result<_, _>>()?;
        let mut out = Vec::with_capacity(digits.len().div_ceil(2));
        let mut it = digits.iter();
        if digits.len() % 2 == 1 {
            out.push(*it.next().unwrap_or(&0));
        }
        while let (Some(a), Some(b)) = (it.next(), it.next()) {
            out.push((a << 4) | b);
        }
        Ok(out)
    } else if let Some(b) = v.strip_prefix("0b").or_else(|| v.strip_prefix("0B")) {
        base64::engine::general_purpose::STANDARD.decode(b).map_err(|_| TextError::BadBinary)
    } else {
        Err(TextError::BadBinary)
    }
}

/// Encode bytes as a `0x` hex binary value.
pub fn encode_hex(b: &[u8]) -> String {
    const D: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(2 + 2 * b.len());
    s.push_str("0x");
    for x in b {
        s.push(D[usize::from(x >> 4)] as char);
        s.push(D[usize::from(x & 15)] as char);
    }
    s
}

/// Encode bytes as a `0b` base64 binary value.
pub fn encode_base64(b: &[u8]) -> String {
    let mut s = String::from("0b");
    base64::engine::general_purpose::STANDARD.encode_string(b, &mut s);
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs() {
        let t = b"InitiatorName=iqn.x\0SessionType=Normal\0\0";
        assert_eq!(parse_pairs(t).unwrap(), [("InitiatorName", "iqn.x"), ("SessionType", "Normal")]);
        assert_eq!(parse_pairs(b"").unwrap(), []);
        assert_eq!(parse_pairs(b"A=1").unwrap_err(), TextError::MissingNul);
        assert_eq!(parse_pairs(b"A\0").unwrap_err(), TextError::MissingEquals);
        assert_eq!(parse_pairs(b"=1\0").unwrap_err(), TextError::EmptyKey);
        assert_eq!(parse_pairs(b"A=\xff\0").unwrap_err(), TextError::NotUtf8);
        let long_key = alloc::format!("{}=1\0", "K".repeat(64));
        assert_eq!(parse_pairs(long_key.as_bytes()).unwrap_err(), TextError::KeyTooLong);
        let long_val = alloc::format!("K={}\0", "v".repeat(256));
        assert!(matches!(parse_pairs(long_val.as_bytes()), Err(TextError::ValueTooLong { .. })));
        let chap = alloc::format!("CHAP_C=0x{}\0", "ab".repeat(1024));
        assert!(parse_pairs(chap.as_bytes()).is_ok());
        // Values may contain '='.
        assert_eq!(parse_pairs(b"X=a=b\0").unwrap(), [("X", "a=b")]);
    }

    #[test]
    fn reassembly_and_split() {
        let mut b = TextBuilder::new();
        for i in 0..100 {
            b.push("TargetName", &alloc::format!("iqn.2026-11.io.riser:t{i}"));
        }
        let text = b.into_bytes();
        let mut r = Reassembler::default();
        let mut whole = None;
        for (seg, c) in split(&text, 97) {
            assert!(seg.len() <= 97);
            whole = r.push(seg, c).unwrap();
            assert_eq!(whole.is_some(), !c);
        }
        assert_eq!(whole.unwrap(), text);
        assert_eq!(split(b"", 10).collect::<Vec<_>>(), [(&b""[..], false)]);
        let mut small = Reassembler::new(10);
        assert_eq!(small.push(&[1; 8], true).unwrap(), None);
        assert_eq!(small.push(&[1; 8], true).unwrap_err(), TextError::TooLong(10));
        assert!(!small.is_pending());
    }

    #[test]
    fn numbers_and_binary() {
        assert_eq!(parse_number("8192").unwrap(), 8192);
        assert_eq!(parse_number("0x2000").unwrap(), 8192);
        assert_eq!(parse_number("0bIAA=").unwrap(), 8192);
        for bad in ["", "-1", "1e3", "0x", "99999999999999999999999", "0x11111111111111111"] {
            assert!(parse_number(bad).is_err(), "{bad}");
        }
        assert_eq!(decode_binary("0xabc").unwrap(), [0x0a, 0xbc]);
        assert_eq!(decode_binary(&encode_hex(&[1, 2, 255])).unwrap(), [1, 2, 255]);
        assert_eq!(decode_binary(&encode_base64(&[9; 33])).unwrap(), [9; 33]);
        assert!(decode_binary("0xzz").is_err());
        assert!(decode_binary("plain").is_err());
        assert!(decode_binary("0b!!").is_err());
    }
}
