//! `X-Request-Id`: a client's valid one is kept, else one is made (a
//! UUIDv7: time-ordered, so ids sort as requests arrived). It goes upstream,
//! back to the client, and into every log line about the request.

use std::cell::Cell;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The header's name.
pub(crate) const HEADER: &str = "x-request-id";

/// Longest id kept from a client (longer ones are replaced).
pub(crate) const MAX_LEN: usize = 128;

/// Bytes of an id kept inline: one the gateway makes (36) fits.
const INLINE: usize = 40;

/// A request id: at most [`MAX_LEN`] bytes; one the gateway makes, or a
/// client's as short, inline (no allocation), a longer client's on the
/// heap. Small, since every request's flow carries one (at 129 bytes
/// inline, copying it as the flow moved cost the HTTP/1.1 path more than
/// making it).
#[derive(Clone)]
pub struct RequestId {
    bytes: smallvec::SmallVec<[u8; INLINE]>,
}

impl RequestId {
    /// The client's id when it is one a log and a header can carry whole:
    /// 1 to 128 bytes of letters, digits and `-_.:+/=`; else a new one,
    /// stamped with the request's arrival.
    pub fn keep_or_make(given: Option<&[u8]>, arrived: quanta::Instant) -> Self {
        match given {
            Some(v) if valid(v) => Self {
                bytes: smallvec::SmallVec::from_slice(v),
            },
            _ => Self::at(wall(arrived)),
        }
    }

    /// A new UUIDv7 for now.
    pub fn new() -> Self {
        Self::at(wall(quanta::Instant::now()))
    }

    /// A new UUIDv7 (RFC 9562) for `time` since the epoch: 48 bits of
    /// Unix milliseconds, the version, 74 random bits.
    pub fn at(time: Duration) -> Self {
        /// Each byte's two hex digits.
        const HEX: [[u8; 2]; 256] = {
            let digits = b"0123456789abcdef";
            let mut t = [[0; 2]; 256];
            let mut b = 0;
            while b < 256 {
                t[b] = [digits[b >> 4], digits[b & 0xf]];
                b += 1;
            }
            t
        };
        let ms = time.as_millis() as u64;
        let (a, b) = (random(), random());
        let hi: u64 = (ms << 16) | 0x7000 | (a & 0x0FFF);
        let lo: u64 = (b & 0x3FFF_FFFF_FFFF_FFFF) | 0x8000_0000_0000_0000;
        let mut raw = [0u8; 16];
        raw[..8].copy_from_slice(&hi.to_be_bytes());
        raw[8..].copy_from_slice(&lo.to_be_bytes());
        // 8-4-4-4-12 hex digits: each raw byte's two at a fixed place, a
        // dash before raw bytes 4, 6, 8 and 10 (no branch per byte: this
        // runs for every request without an id).
        const AT: [usize; 16] = [0, 2, 4, 6, 9, 11, 14, 16, 19, 21, 24, 26, 28, 30, 32, 34];
        let mut bytes = [b'-'; INLINE];
        for (byte, at) in raw.into_iter().zip(AT) {
            bytes[at..at + 2].copy_from_slice(&HEX[usize::from(byte)]);
        }
        Self {
            bytes: smallvec::SmallVec::from_buf_and_len(bytes, 36),
        }
    }

    /// The id's bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes
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

/// The wall-clock time (since the epoch) at `at`, from quanta's clock
/// (a TSC read where the CPU has an invariant one) tied to the system
/// clock once a second per thread: request ids and access-log lines take
/// their time from the arrival instant they already have, without a
/// system clock read each, and follow the system clock within a second of
/// a step.
pub(crate) fn wall(at: quanta::Instant) -> Duration {
    thread_local! {
        static TIE: Cell<Option<(quanta::Instant, Duration)>> = const { Cell::new(None) };
    }
    TIE.with(|tie| {
        let (base, base_wall) = match tie.get() {
            Some((base, w)) if at >= base && at.duration_since(base) < Duration::from_secs(1) => {
                (base, w)
            }
            _ => {
                let now = quanta::Instant::now();
                let w = SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .unwrap_or_default();
                tie.set(Some((now, w)));
                (now, w)
            }
        };
        if at >= base {
            base_wall + at.duration_since(base)
        } else {
            base_wall.saturating_sub(base.duration_since(at))
        }
    })
}

/// Whether a client's id can be kept: it goes into headers and log lines
/// (JSON and text) unescaped, so only a safe alphabet.
pub(crate) fn valid(v: &[u8]) -> bool {
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
    fn made_ids_spell_their_bits_in_order() {
        // The milliseconds are the first 12 hex digits, then the version.
        let t = Duration::from_millis(0x0123_4567_89ab);
        let s = RequestId::at(t).as_str().to_owned();
        assert!(s.starts_with("01234567-89ab-7"), "{s}");
    }

    #[test]
    fn the_wall_clock_follows_the_system_clock() {
        let at = quanta::Instant::now();
        let sys = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
        let w = wall(at);
        let gap = w.abs_diff(sys);
        assert!(gap < Duration::from_millis(50), "{w:?} vs {sys:?}");
        // An instant before the tie reads earlier, by as much.
        let later = quanta::Instant::now();
        assert!(wall(later) >= w);
    }

    #[test]
    fn a_client_id_is_kept_only_when_safe() {
        assert_eq!(
            RequestId::keep_or_make(Some(b"abc-123_x.y:z"), quanta::Instant::now()).as_str(),
            "abc-123_x.y:z"
        );
        for bad in [
            &b""[..],
            b"has space",
            b"quote\"",
            b"new\nline",
            &[b'a'; 129],
        ] {
            let id = RequestId::keep_or_make(Some(bad), quanta::Instant::now());
            assert_eq!(id.as_str().len(), 36, "{bad:?} replaced by a new id");
        }
        assert_eq!(
            RequestId::keep_or_make(None, quanta::Instant::now())
                .as_str()
                .len(),
            36
        );
    }
}
