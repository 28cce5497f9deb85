//! `X-Request-Id`: a client's valid one is kept, else one is made (a
//! UUIDv7: time-ordered, so ids sort as requests arrived). It goes upstream,
//! back to the client, and into every log line about the request.

use std::cell::Cell;
use std::time::{SystemTime, UNIX_EPOCH};

/// The header's name.
pub const HEADER: &str = "x-request-id";

/// Longest id kept from a client (longer ones are replaced).
pub const MAX_LEN: usize = 128;

/// A request id: at most [`MAX_LEN`] bytes, inline (no allocation).
#[derive(Clone, Copy)]
pub struct RequestId {
    bytes: [u8; MAX_LEN],
    len: u8,
}

impl RequestId {
    /// The client's id when it is one a log and a header can carry whole:
    /// 1 to 128 bytes of letters, digits and `-_.:+/=`; else a new one.
    pub fn keep_or_make(given: Option<&[u8]>) -> Self {
        match given {
            Some(v) if valid(v) => {
                let mut bytes = [0; MAX_LEN];
                bytes[..v.len()].copy_from_slice(v);
                Self {
                    bytes,
                    len: v.len() as u8,
                }
            }
            _ => Self::new(),
        }
    }

    /// A new UUIDv7 (RFC 9562): 48 bits of Unix milliseconds, the version,
    /// 74 random bits.
    pub fn new() -> Self {
        let ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let (a, b) = (random(), random());
        let hi: u64 = (ms << 16) | 0x7000 | (a & 0x0FFF);
        let lo: u64 = (b & 0x3FFF_FFFF_FFFF_FFFF) | 0x8000_0000_0000_0000;
        let mut hex = [0u8; 32];
        for (i, nibble) in hex.iter_mut().enumerate() {
            let word = if i < 16 { hi } else { lo };
            let shift = 60 - 4 * (i % 16);
            *nibble = b"0123456789abcdef"[((word >> shift) & 0xF) as usize];
        }
        let mut bytes = [0; MAX_LEN];
        let mut at = 0;
        for (i, group) in [8, 4, 4, 4, 12].into_iter().enumerate() {
            if i > 0 {
                bytes[at] = b'-';
                at += 1;
            }
            let from = [0, 8, 12, 16, 20][i];
            bytes[at..at + group].copy_from_slice(&hex[from..from + group]);
            at += group;
        }
        Self {
            bytes,
            len: at as u8,
        }
    }

    /// The id's bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }

    /// The id as text (always ASCII).
    pub fn as_str(&self) -> &str {
        std::str::from_utf8(self.as_bytes()).unwrap_or("")
    }
}

impl Default for RequestId {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Display for RequestId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::fmt::Debug for RequestId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RequestId({})", self.as_str())
    }
}

/// Whether a client's id can be kept: it goes into headers and log lines
/// (JSON and text) unescaped, so only a safe alphabet.
pub fn valid(v: &[u8]) -> bool {
    !v.is_empty()
        && v.len() <= MAX_LEN
        && v.iter()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.:+/=".contains(b))
}

/// A per-thread xorshift64* stream, seeded from the process's random hash
/// keys: unique enough for ids and sampling, never a secret.
pub(crate) fn random() -> u64 {
    thread_local! {
        static STATE: Cell<u64> = Cell::new({
            use std::hash::{BuildHasher, Hasher};
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_u64(std::process::id().into());
            h.finish() | 1
        });
    }
    STATE.with(|s| {
        let mut x = s.get();
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        s.set(x);
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_made_id_is_a_uuid_v7_and_ids_differ() {
        let a = RequestId::new();
        let b = RequestId::new();
        let s = a.as_str();
        assert_eq!(s.len(), 36, "{s}");
        assert_eq!(&s[14..15], "7", "version 7: {s}");
        assert!(matches!(&s[19..20], "8" | "9" | "a" | "b"), "variant: {s}");
        assert_eq!(
            s.split('-').map(str::len).collect::<Vec<_>>(),
            [8, 4, 4, 4, 12]
        );
        assert_ne!(a.as_str(), b.as_str());
        // Time-ordered: the first 12 hex digits are the milliseconds.
        let ms = u64::from_str_radix(&s[..8], 16).unwrap() << 16
            | u64::from_str_radix(&s[9..13], 16).unwrap();
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64;
        assert!(now - ms < 5_000, "{ms} vs {now}");
    }

    #[test]
    fn a_client_id_is_kept_only_when_safe() {
        assert_eq!(
            RequestId::keep_or_make(Some(b"abc-123_x.y:z")).as_str(),
            "abc-123_x.y:z"
        );
        for bad in [
            &b""[..],
            b"has space",
            b"quote\"",
            b"new\nline",
            &[b'a'; 129],
        ] {
            let id = RequestId::keep_or_make(Some(bad));
            assert_eq!(id.as_str().len(), 36, "{bad:?} replaced by a new id");
        }
        assert_eq!(RequestId::keep_or_make(None).as_str().len(), 36);
    }
}
