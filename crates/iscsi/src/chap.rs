//! CHAP (RFC 1994 as used by RFC 7143 §12.1.3) with the algorithms Linux supports: MD5 (5,
//! the only one RFC 7143 mandates), SHA-1 (6), SHA-256 (7) and SHA3-256 (8).
//!
//! Secrets never appear in `Debug` output or logs; responses are compared in constant time.

use alloc::string::String;
use alloc::vec::Vec;
use core::fmt;
use subtle::ConstantTimeEq;

/// A CHAP hash algorithm (CHAP_A value).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ChapAlgorithm {
    /// MD5 (5).
    Md5,
    /// SHA-1 (6).
    Sha1,
    /// SHA-256 (7).
    Sha256,
    /// SHA3-256 (8).
    Sha3_256,
}

impl ChapAlgorithm {
    /// All, strongest first (the order open-iscsi offers).
    pub const ALL: [Self; 4] = [Self::Sha3_256, Self::Sha256, Self::Sha1, Self::Md5];

    /// The CHAP_A code.
    pub const fn code(self) -> u8 {
        match self {
            Self::Md5 => 5,
            Self::Sha1 => 6,
            Self::Sha256 => 7,
            Self::Sha3_256 => 8,
        }
    }
    /// From a CHAP_A code.
    pub const fn from_code(c: u64) -> Option<Self> {
        match c {
            5 => Some(Self::Md5),
            6 => Some(Self::Sha1),
            7 => Some(Self::Sha256),
            8 => Some(Self::Sha3_256),
            _ => None,
        }
    }
    /// Digest length in bytes.
    pub const fn digest_len(self) -> usize {
        match self {
            Self::Md5 => 16,
            Self::Sha1 => 20,
            Self::Sha256 | Self::Sha3_256 => 32,
        }
    }
    /// The challenge length riser sends: at least 16 bytes and the digest length.
    pub const fn challenge_len(self) -> usize {
        if self.digest_len() > 16 { self.digest_len() } else { 16 }
    }

    /// CHAP response: Hash(identifier ‖ secret ‖ challenge).
    pub fn response(self, id: u8, secret: &Secret, challenge: &[u8]) -> Vec<u8> {
        fn h<D: md5::Digest>(id: u8, s: &[u8], c: &[u8]) -> Vec<u8> {
            let mut d = D::new();
            d.update([id]);
            d.update(s);
            d.update(c);
            d.finalize().to_vec()
        }
        let s = &secret.0;
        match self {
            Self::Md5 => h::<md5::Md5>(id, s, challenge),
            Self::Sha1 => h::<sha1::Sha1>(id, s, challenge),
            Self::Sha256 => h::<sha2::Sha256>(id, s, challenge),
            Self::Sha3_256 => h::<sha3::Sha3_256>(id, s, challenge),
        }
    }

    /// Check a received response in constant time.
    pub fn verify(self, id: u8, secret: &Secret, challenge: &[u8], response: &[u8]) -> bool {
        let expected = self.response(id, secret, challenge);
        expected.len() == response.len() && bool::from(expected.ct_eq(response))
    }
}

/// Parse a CHAP_A list into known algorithms, keeping the sender's order.
pub fn parse_algorithms(list: &str) -> Vec<ChapAlgorithm> {
    list.split(',').filter_map(|v| crate::text::parse_number(v).ok().and_then(ChapAlgorithm::from_code)).collect()
}

/// A CHAP secret. Its `Debug` shows only the length.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(Vec<u8>);

impl Secret {
    /// Wrap secret bytes.
    pub fn new(bytes: impl Into<Vec<u8>>) -> Self {
        Self(bytes.into())
    }
    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.0.len()
    }
    /// Whether empty.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Secret(<{} bytes redacted>)", self.0.len())
    }
}

/// Minimum secret length RFC 7143 §12.1.3 allows without IPsec (96 bits).
pub const MIN_SECRET_LEN: usize = 12;

/// A CHAP user name and secret.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChapCredentials {
    /// CHAP_N.
    pub user: String,
    /// The secret.
    pub secret: Secret,
}

/// Credentials that cannot be used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CredentialsError {
    /// Secret shorter than 12 bytes (RFC 7143 §12.1.3) or longer than 255.
    #[error("CHAP secret must be 12 to 255 bytes long (got {0})")]
    SecretLength(usize),
    /// Empty user name or one that cannot travel in a text value.
    #[error("invalid CHAP user name")]
    BadUser,
    /// Credentials text not in the form [`ChapCredentials::parse`] reads (the message never
    /// quotes the text: it may hold the secret).
    #[error("malformed CHAP credentials: {0}")]
    Malformed(&'static str),
}

impl ChapCredentials {
    /// Validated credentials.
    pub fn new(user: impl Into<String>, secret: impl Into<Vec<u8>>) -> Result<Self, CredentialsError> {
        let user = user.into();
        let secret = Secret::new(secret);
        if user.is_empty() || user.len() > 255 || user.contains('\0') {
            return Err(CredentialsError::BadUser);
        }
        if !(MIN_SECRET_LEN..=255).contains(&secret.len()) {
            return Err(CredentialsError::SecretLength(secret.len()));
        }
        Ok(Self { user, secret })
    }

    /// Credentials from text, as a credentials file or an environment variable holds them:
    ///
    /// * lines end with `\n` or `\r\n`; empty lines and lines starting with `#` are ignored;
    /// * one line `USER:SECRET` (split at the first `:`), or
    /// * two lines, `USER` then `SECRET`, for a user or secret with a `:` in it (a user name is
    ///   often an iSCSI name, `iqn.…:…`).
    ///
    /// Nothing else is trimmed: spaces belong to the user name or secret.
    pub fn parse(text: &str) -> Result<Self, CredentialsError> {
        let mut lines = text.split('\n').map(|l| l.strip_suffix('\r').unwrap_or(l)).filter(|l| !l.is_empty() && !l.starts_with('#'));
        let (first, second) = (lines.next(), lines.next());
        if lines.next().is_some() {
            return Err(CredentialsError::Malformed("more than two lines (expected USER:SECRET, or USER and SECRET on two lines)"));
        }
        match (first, second) {
            (Some(user), Some(secret)) => Self::new(user, secret.as_bytes()),
            (Some(line), None) => match line.split_once(':') {
                Some((user, secret)) => Self::new(user, secret.as_bytes()),
                None => Err(CredentialsError::Malformed("no ':' between user and secret (expected USER:SECRET)")),
            },
            _ => Err(CredentialsError::Malformed("empty (expected USER:SECRET)")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn md5_rfc1994_shape() {
        // MD5(0x01 ‖ "secret" ‖ challenge) computed independently with Python's hashlib.
        let s = Secret::new(*b"secret");
        let r = ChapAlgorithm::Md5.response(1, &s, &[0xde, 0xad, 0xbe, 0xef]);
        assert_eq!(crate::text::encode_hex(&r), "0x816e5cad18ced100f1b4bc86d990f6bc");
        assert!(ChapAlgorithm::Md5.verify(1, &s, &[0xde, 0xad, 0xbe, 0xef], &r));
        assert!(!ChapAlgorithm::Md5.verify(2, &s, &[0xde, 0xad, 0xbe, 0xef], &r));
        assert!(!ChapAlgorithm::Md5.verify(1, &s, &[0xde, 0xad, 0xbe, 0xef], &r[..15]));
        for a in ChapAlgorithm::ALL {
            assert_eq!(a.response(7, &s, b"c").len(), a.digest_len());
            assert_eq!(ChapAlgorithm::from_code(u64::from(a.code())), Some(a));
        }
    }

    #[test]
    fn secrets_are_redacted_and_validated() {
        let c = ChapCredentials::new("user", *b"averysecretvalue").unwrap();
        let dbg = format!("{c:?}");
        assert!(!dbg.contains("averysecretvalue"), "{dbg}");
        assert_eq!(ChapCredentials::new("u", *b"short").unwrap_err(), CredentialsError::SecretLength(5));
        assert_eq!(ChapCredentials::new("", *b"averysecretvalue").unwrap_err(), CredentialsError::BadUser);
        assert_eq!(parse_algorithms("8,7,99,5,x"), [ChapAlgorithm::Sha3_256, ChapAlgorithm::Sha256, ChapAlgorithm::Md5]);
    }

    #[test]
    fn debug_of_credentials_and_secrets_shows_no_secret_byte() {
        let c = ChapCredentials::new("iqn.2026-11.io.riser:alice", *b"s3cr3t-v4lue-xyz").unwrap();
        for dbg in [format!("{c:?}"), format!("{c:#?}"), format!("{:?}", c.secret), format!("{:?}", Some(&c))] {
            assert!(!dbg.contains("s3cr3t") && !dbg.contains("xyz"), "{dbg}");
            // Nor as bytes, as a derived Debug of a Vec<u8> would print them.
            assert!(!dbg.contains("115, 51"), "{dbg}");
            assert!(dbg.contains("16 bytes redacted"), "{dbg}");
        }
        assert!(format!("{c:?}").contains("iqn.2026-11.io.riser:alice"), "the user name is no secret");
    }

    #[test]
    fn credentials_text_one_line_or_two() {
        let c = ChapCredentials::parse("alice:averysecretvalue\n").unwrap();
        assert_eq!((c.user.as_str(), &c.secret), ("alice", &Secret::new(*b"averysecretvalue")));
        // A ':' in the secret stays in the secret.
        let c = ChapCredentials::parse("alice:a:very:secret:value").unwrap();
        assert_eq!(c.secret, Secret::new(*b"a:very:secret:value"));
        // Two lines (CRLF too), comments and blank lines: the user may contain ':'.
        let c = ChapCredentials::parse("# riser CHAP\r\n\r\niqn.2026-11.io.riser:alice\r\nsecret with spaces \r\n").unwrap();
        assert_eq!((c.user.as_str(), &c.secret), ("iqn.2026-11.io.riser:alice", &Secret::new(*b"secret with spaces ")));
        let bad = ["", "# only a comment\n", "alicesecretvalue\n", "a\nb\nc\n"];
        for t in bad {
            assert!(matches!(ChapCredentials::parse(t), Err(CredentialsError::Malformed(_))), "{t:?}");
        }
        assert_eq!(ChapCredentials::parse("alice:short").unwrap_err(), CredentialsError::SecretLength(5));
        assert_eq!(ChapCredentials::parse(":averysecretvalue").unwrap_err(), CredentialsError::BadUser);
        // Errors never quote the text.
        let e = ChapCredentials::parse("averysecretvalue").unwrap_err().to_string();
        assert!(!e.contains("averysecretvalue"), "{e}");
    }
}
