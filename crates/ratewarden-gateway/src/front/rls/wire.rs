//! `RateLimitRequest` read, and `RateLimitResponse` written, as protobuf
//! directly: the request's strings borrowed from the body (prost's message
//! allocates a `String` per domain, key and value, and a `Vec` per list),
//! the answer written from a decision without building prost's message.
//!
//! Both are held to prost's behaviour on the same bytes (tests below, and
//! the `rls_request` fuzz target): a request decodes here exactly when
//! prost decodes it, to the same fields; an answer's bytes equal prost's
//! encoding of the same message.

use std::time::Duration;

/// A few, on the stack.
pub(crate) type Few<T, const N: usize> = smallvec::SmallVec<[T; N]>;

/// `envoy.service.ratelimit.v3.RateLimitRequest`, its strings borrowed.
#[derive(Debug, Default, Clone, PartialEq)]
pub(crate) struct Request<'a> {
    /// `domain` (1).
    pub domain: &'a str,
    /// `descriptors` (2).
    pub descriptors: Few<Descriptor, 2>,
    /// Every descriptor's entries, in order; a descriptor's are a range.
    pub entries: Few<(&'a str, &'a str), 4>,
    /// `hits_addend` (3).
    pub hits_addend: u32,
}

/// `envoy.extensions.common.ratelimit.v3.RateLimitDescriptor`.
#[derive(Debug, Default, Clone, PartialEq)]
pub(crate) struct Descriptor {
    /// Its `entries` (1): `Request::entries[from..to]`.
    pub from: usize,
    pub to: usize,
    /// `limit` (2): requests per unit, unit.
    pub limit: Option<(u32, i32)>,
    /// `hits_addend` (3), a `UInt64Value`: present, or not.
    pub hits_addend: Option<u64>,
    /// `is_negative_hits` (4).
    pub is_negative_hits: bool,
}

impl<'a> Request<'a> {
    /// Descriptor `d`'s entries.
    pub(crate) fn entries_of(&self, d: &Descriptor) -> &[(&'a str, &'a str)] {
        &self.entries[d.from..d.to]
    }
}

/// Why a request does not decode (as prost would refuse it).
pub(crate) type DecodeError = &'static str;

/// Wire types, as keys carry them.
const I64: u8 = 1;
const START_GROUP: u8 = 3;
const END_GROUP: u8 = 4;
const I32: u8 = 5;

/// Nesting allowed, as prost's `RECURSION_LIMIT`.
const DEPTH: u32 = 100;

/// A cursor over a message's bytes.
struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// A varint of at most ten bytes whose tenth is 0 or 1 (no overflow).
    fn varint(&mut self) -> Result<u64, DecodeError> {
        let mut value = 0u64;
        for (i, &b) in self.bytes.iter().take(10).enumerate() {
            value |= u64::from(b & 0x7f) << (7 * i);
            if b < 0x80 {
                if i == 9 && b >= 2 {
                    break;
                }
                self.bytes = &self.bytes[i + 1..];
                return Ok(value);
            }
        }
        Err("invalid varint")
    }

    /// A field's key: its number and wire type.
    fn key(&mut self) -> Result<(u32, u8), DecodeError> {
        let key = self.varint()?;
        let key = u32::try_from(key).map_err(|_| "invalid key")?;
        let wire = (key & 7) as u8;
        if wire > I32 {
            return Err("invalid wire type");
        }
        if key >> 3 == 0 {
            return Err("invalid tag: 0");
        }
        Ok((key >> 3, wire))
    }

    fn take(&mut self, len: u64) -> Result<&'a [u8], DecodeError> {
        let len = usize::try_from(len).map_err(|_| "buffer underflow")?;
        let (taken, rest) = self.bytes.split_at_checked(len).ok_or("buffer underflow")?;
        self.bytes = rest;
        Ok(taken)
    }

    /// A length-delimited field's bytes.
    fn delimited(&mut self, wire: u8) -> Result<&'a [u8], DecodeError> {
        if wire != LEN {
            return Err("invalid wire type for a length-delimited field");
        }
        let len = self.varint()?;
        self.take(len)
    }

    fn string(&mut self, wire: u8) -> Result<&'a str, DecodeError> {
        std::str::from_utf8(self.delimited(wire)?).map_err(|_| "invalid string: not UTF-8")
    }

    fn scalar(&mut self, wire: u8) -> Result<u64, DecodeError> {
        if wire != VARINT {
            return Err("invalid wire type for a varint field");
        }
        self.varint()
    }

    /// Reads a message's fields to its end: `field` takes those it knows
    /// (and says so); the others are skipped as prost skips them, nested
    /// at most to what `depth` leaves.
    #[inline]
    fn fields(
        mut self,
        depth: u32,
        mut field: impl FnMut(&mut Self, u32, u8) -> Result<bool, DecodeError>,
    ) -> Result<(), DecodeError> {
        while !self.is_empty() {
            let (number, wire) = self.key()?;
            if !field(&mut self, number, wire)? {
                self.skip(number, wire, depth)?;
            }
        }
        Ok(())
    }

    /// An embedded message's bytes, to read with [`Reader::fields`]; one
    /// past prost's recursion limit is refused, as prost refuses it.
    #[inline]
    fn message(&mut self, wire: u8, depth: u32) -> Result<Self, DecodeError> {
        if depth == 0 {
            return Err("recursion limit reached");
        }
        Ok(Reader {
            bytes: self.delimited(wire)?,
        })
    }

    /// Skips a field this decoder does not know, as prost does (groups
    /// included, nested at most to what `depth` leaves).
    fn skip(&mut self, number: u32, wire: u8, depth: u32) -> Result<(), DecodeError> {
        if depth == 0 {
            return Err("recursion limit reached");
        }
        match wire {
            VARINT => self.varint().map(drop),
            I64 => self.take(8).map(drop),
            I32 => self.take(4).map(drop),
            LEN => {
                let len = self.varint()?;
                self.take(len).map(drop)
            }
            START_GROUP => loop {
                let (inner, inner_wire) = self.key()?;
                if inner_wire == END_GROUP {
                    if inner != number {
                        return Err("unexpected end group tag");
                    }
                    return Ok(());
                }
                self.skip(inner, inner_wire, depth - 1)?;
            },
            _ => Err("unexpected end group tag"),
        }
    }
}

/// Decodes a `RateLimitRequest`.
pub(crate) fn decode(bytes: &[u8]) -> Result<Request<'_>, DecodeError> {
    let mut req = Request::default();
    Reader { bytes }.fields(DEPTH, |r, number, wire| {
        match number {
            1 => req.domain = r.string(wire)?,
            2 => descriptor(&mut req, r.message(wire, DEPTH)?, DEPTH - 1)?,
            3 => req.hits_addend = r.scalar(wire)? as u32,
            _ => return Ok(false),
        }
        Ok(true)
    })?;
    Ok(req)
}

/// One `RateLimitDescriptor`, read from `body`, appended to `req`.
fn descriptor<'a>(req: &mut Request<'a>, body: Reader<'a>, depth: u32) -> Result<(), DecodeError> {
    let from = req.entries.len();
    let mut d = Descriptor {
        from,
        to: from,
        ..Default::default()
    };
    body.fields(depth, |r, number, wire| {
        match number {
            1 => {
                let (mut key, mut value) = ("", "");
                r.message(wire, depth)?
                    .fields(depth - 1, |e, number, wire| {
                        match number {
                            1 => key = e.string(wire)?,
                            2 => value = e.string(wire)?,
                            _ => return Ok(false),
                        }
                        Ok(true)
                    })?;
                req.entries.push((key, value));
            }
            2 => {
                // A second occurrence merges into the first.
                let (mut rpu, mut unit) = d.limit.unwrap_or_default();
                r.message(wire, depth)?
                    .fields(depth - 1, |o, number, wire| {
                        match number {
                            1 => rpu = o.scalar(wire)? as u32,
                            2 => unit = o.scalar(wire)? as i32,
                            _ => return Ok(false),
                        }
                        Ok(true)
                    })?;
                d.limit = Some((rpu, unit));
            }
            3 => {
                let mut value = d.hits_addend.unwrap_or_default();
                r.message(wire, depth)?
                    .fields(depth - 1, |w, number, wire| {
                        if number != 1 {
                            return Ok(false);
                        }
                        value = w.scalar(wire)?;
                        Ok(true)
                    })?;
                d.hits_addend = Some(value);
            }
            4 => d.is_negative_hits = r.scalar(wire)? != 0,
            _ => return Ok(false),
        }
        Ok(true)
    })?;
    // Only this descriptor's entries were pushed while it was read.
    d.to = req.entries.len();
    req.descriptors.push(d);
    Ok(())
}

/// One descriptor's status.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Status<'a> {
    /// `Code` (1 OK, 2 OVER_LIMIT).
    pub code: i32,
    /// `current_limit`: name, requests per unit, unit.
    pub limit: Option<(&'a str, u32, i32)>,
    /// `limit_remaining`.
    pub remaining: u32,
    /// `duration_until_reset`.
    pub until_reset: Option<Duration>,
}

/// Protobuf wire types.
const VARINT: u8 = 0;
const LEN: u8 = 2;

fn varint_len(v: u64) -> usize {
    // 1 byte per 7 bits, at least one.
    (64 - (v | 1).leading_zeros() as usize).div_ceil(7)
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn put_key(out: &mut Vec<u8>, field: u8, wire: u8) {
    out.push(field << 3 | wire);
}

/// An `int32`/enum as protobuf has it: a negative one as ten bytes.
fn int32(v: i32) -> u64 {
    i64::from(v) as u64
}

fn seconds(d: Duration) -> i64 {
    i64::try_from(d.as_secs()).unwrap_or(i64::MAX)
}

/// A varint field's size, key included; 0 for a default (omitted) value.
fn varint_field(v: u64) -> usize {
    if v == 0 { 0 } else { 1 + varint_len(v) }
}

fn put_varint_field(out: &mut Vec<u8>, field: u8, v: u64) {
    if v != 0 {
        put_key(out, field, VARINT);
        put_varint(out, v);
    }
}

fn str_field(s: &str) -> usize {
    if s.is_empty() {
        0
    } else {
        1 + varint_len(s.len() as u64) + s.len()
    }
}

fn put_str_field(out: &mut Vec<u8>, field: u8, s: &str) {
    if !s.is_empty() {
        put_key(out, field, LEN);
        put_varint(out, s.len() as u64);
        out.extend_from_slice(s.as_bytes());
    }
}

/// A message field's size, key and length included.
fn message_field(len: usize) -> usize {
    1 + varint_len(len as u64) + len
}

fn put_message_head(out: &mut Vec<u8>, field: u8, len: usize) {
    put_key(out, field, LEN);
    put_varint(out, len as u64);
}

/// `RateLimit` (written in field-number order, as prost does).
fn limit_len((name, rpu, unit): (&str, u32, i32)) -> usize {
    str_field(name) + varint_field(u64::from(rpu)) + varint_field(int32(unit))
}

/// `google.protobuf.Duration`.
fn duration_len(d: Duration) -> usize {
    varint_field(seconds(d) as u64) + varint_field(int32(d.subsec_nanos() as i32))
}

fn status_len(s: &Status<'_>) -> usize {
    varint_field(int32(s.code))
        + s.limit.map_or(0, |l| message_field(limit_len(l)))
        + varint_field(u64::from(s.remaining))
        + s.until_reset.map_or(0, |d| message_field(duration_len(d)))
}

fn header_len((key, value): (&str, &str)) -> usize {
    str_field(key) + str_field(value)
}

/// Appends one gRPC frame (uncompressed, length-prefixed) holding the
/// `RateLimitResponse` of `overall`, `statuses` and
/// `response_headers_to_add`.
pub(crate) fn frame(
    out: &mut Vec<u8>,
    overall: i32,
    statuses: &[Status<'_>],
    headers: &[(&str, &str)],
) {
    // Each status's length once: it is written before the status.
    let lens: Few<usize, 4> = statuses.iter().map(status_len).collect();
    let len = varint_field(int32(overall))
        + lens.iter().map(|&l| message_field(l)).sum::<usize>()
        + headers
            .iter()
            .map(|h| message_field(header_len(*h)))
            .sum::<usize>();
    out.reserve(5 + len);
    out.push(0);
    out.extend_from_slice(&u32::try_from(len).unwrap_or(u32::MAX).to_be_bytes());
    put_varint_field(out, 1, int32(overall));
    for (s, &l) in statuses.iter().zip(&lens) {
        put_message_head(out, 2, l);
        put_varint_field(out, 1, int32(s.code));
        if let Some(l) = s.limit {
            put_message_head(out, 2, limit_len(l));
            put_varint_field(out, 1, u64::from(l.1));
            put_varint_field(out, 2, int32(l.2));
            put_str_field(out, 3, l.0);
        }
        put_varint_field(out, 3, u64::from(s.remaining));
        if let Some(d) = s.until_reset {
            put_message_head(out, 4, duration_len(d));
            put_varint_field(out, 1, seconds(d) as u64);
            put_varint_field(out, 2, int32(d.subsec_nanos() as i32));
        }
    }
    for &(key, value) in headers {
        put_message_head(out, 3, header_len((key, value)));
        put_str_field(out, 1, key);
        put_str_field(out, 2, value);
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use envoy_types::pb::envoy::config::core::v3::HeaderValue;
    use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
        DescriptorStatus, RateLimit,
    };
    use prost::Message as _;

    /// The same answer as prost's message.
    fn prost_of(overall: i32, statuses: &[Status<'_>], headers: &[(&str, &str)]) -> Vec<u8> {
        RateLimitResponse {
            overall_code: overall,
            statuses: statuses
                .iter()
                .map(|s| DescriptorStatus {
                    code: s.code,
                    current_limit: s.limit.map(|(name, rpu, unit)| RateLimit {
                        name: name.to_owned(),
                        requests_per_unit: rpu,
                        unit,
                    }),
                    limit_remaining: s.remaining,
                    duration_until_reset: s.until_reset.map(|d| {
                        envoy_types::pb::google::protobuf::Duration {
                            seconds: seconds(d),
                            nanos: d.subsec_nanos() as i32,
                        }
                    }),
                    ..Default::default()
                })
                .collect(),
            response_headers_to_add: headers
                .iter()
                .map(|(k, v)| HeaderValue {
                    key: (*k).to_owned(),
                    value: (*v).to_owned(),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
        .encode_to_vec()
    }

    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
        Entry, RateLimitOverride,
    };
    use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;

    fn agrees(bytes: &[u8]) {
        crate::fuzzing::rls_request(bytes);
    }

    /// A request prost writes, varied by `next`.
    fn request(next: &mut impl FnMut() -> u64) -> Vec<u8> {
        let words = [
            "",
            "k",
            "remote_address",
            "10.0.0.1",
            "é/ü",
            &"x".repeat(130),
        ];
        let word = |n: u64| words[(n % words.len() as u64) as usize].to_owned();
        RateLimitRequest {
            domain: word(next()),
            descriptors: (0..next() % 4)
                .map(|_| RateLimitDescriptor {
                    entries: (0..next() % 4)
                        .map(|_| Entry {
                            key: word(next()),
                            value: word(next()),
                        })
                        .collect(),
                    limit: next().is_multiple_of(4).then(|| RateLimitOverride {
                        requests_per_unit: next() as u32,
                        unit: (next() % 7) as i32,
                    }),
                    hits_addend: next().is_multiple_of(3).then(|| {
                        envoy_types::pb::google::protobuf::UInt64Value { value: next() % 5 }
                    }),
                    is_negative_hits: next().is_multiple_of(5),
                })
                .collect(),
            hits_addend: (next() % 3) as u32,
        }
        .encode_to_vec()
    }

    /// A reproducible stream of numbers from `seed`.
    pub(crate) fn xorshift(mut x: u64) -> impl FnMut() -> u64 {
        move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        }
    }

    #[test]
    fn requests_decode_as_prost_decodes_them() {
        let mut next = xorshift(0x9E37_79B9_7F4A_7C15);
        for _ in 0..20_000 {
            let mut bytes = request(&mut next);
            agrees(&bytes);
            // Then damaged: bytes changed, cut, inserted, and known
            // messages with unknown fields, groups and repeats spliced in.
            for _ in 0..4 {
                let at = if bytes.is_empty() {
                    0
                } else {
                    (next() % bytes.len() as u64) as usize
                };
                match next() % 6 {
                    0 if !bytes.is_empty() => bytes[at] = next() as u8,
                    1 if !bytes.is_empty() => bytes[at] ^= 1 << (next() % 8),
                    2 => bytes.truncate(at),
                    3 => bytes.insert(at, next() as u8),
                    4 => {
                        let tail = request(&mut next);
                        bytes.extend_from_slice(&tail);
                    }
                    _ => {
                        let pieces: [&[u8]; 8] = [
                            &[0x2b, 0x08, 0x01, 0x2c],             // group 5 { 1: 1 }
                            &[0x2c],                               // end group alone
                            &[0x39, 1, 2, 3, 4, 5, 6, 7, 8],       // 7: fixed64
                            &[0x45, 1, 2, 3, 4],                   // 8: fixed32
                            &[0x12, 0x02, 0x12, 0x00],             // a descriptor: empty limit
                            &[0x12, 0x04, 0x1a, 0x02, 0x08, 0x00], // hits_addend { 0 }
                            &[
                                0x18, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01,
                            ],
                            &[
                                0x18, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02,
                            ],
                        ];
                        let piece = pieces[(next() % 8) as usize];
                        bytes.splice(at..at, piece.iter().copied());
                    }
                }
                agrees(&bytes);
            }
        }
    }

    #[test]
    fn edge_cases_decode_as_prost_decodes_them() {
        let mut cases: Vec<Vec<u8>> = vec![
            vec![],
            vec![0x00],                   // tag 0
            vec![0x0e],                   // wire type 6
            vec![0x0f],                   // wire type 7
            vec![0x0a, 0x02, 0xc3, 0x28], // domain not UTF-8
            vec![0x0a, 0x05, b'a'],       // a length past the end
            vec![0x18, 0x80],             // a varint cut short
            vec![0x0d, 1, 2, 3, 4],       // domain as fixed32
            vec![0x10, 0x01],             // descriptors as a varint
            vec![0x12, 0x02, 0x0a, 0x05], // an entry past its descriptor
            vec![0x12, 0x03, 0x0a, 0x01, 0x2a],
            vec![0xf8, 0xff, 0xff, 0xff, 0x0f, 0x01], // the highest field number
            vec![0xf8, 0xff, 0xff, 0xff, 0x1f, 0x01], // a key past u32
            // A descriptor's limit twice: the second merges into the
            // first ({5, MINUTE} then {7}: 7 per minute); hits_addend
            // twice ({4} then {}: 4); an entry's key twice (the last).
            vec![
                0x12, 0x0a, 0x12, 0x04, 0x08, 0x05, 0x10, 0x03, 0x12, 0x02, 0x08, 0x07,
            ],
            vec![0x12, 0x06, 0x1a, 0x02, 0x08, 0x04, 0x1a, 0x00],
            vec![0x12, 0x08, 0x0a, 0x06, 0x0a, 0x01, b'a', 0x0a, 0x01, b'b'],
        ];
        // Groups nested to prost's limit and past it.
        for depth in [1usize, 50, 98, 99, 100, 101] {
            let mut g = vec![0x2b; depth];
            g.extend(std::iter::repeat_n(0x2c, depth));
            cases.push(g.clone());
            // Inside a descriptor, one level deeper.
            let mut d = vec![0x12];
            d.extend(varint_bytes(g.len() as u64));
            d.extend(&g);
            cases.push(d);
        }
        for c in &cases {
            agrees(c);
        }
    }

    fn varint_bytes(v: u64) -> Vec<u8> {
        let mut out = vec![];
        put_varint(&mut out, v);
        out
    }

    #[test]
    fn varint_lengths_are_protobufs() {
        for (v, n) in [
            (0u64, 1),
            (1, 1),
            (127, 1),
            (128, 2),
            (16_383, 2),
            (16_384, 3),
            (u64::from(u32::MAX), 5),
            (u64::MAX, 10),
        ] {
            assert_eq!(varint_len(v), n, "{v}");
            let mut out = vec![];
            put_varint(&mut out, v);
            assert_eq!(out.len(), n, "{v}");
            assert_eq!(prost::encoding::encoded_len_varint(v), n, "{v}");
        }
    }

    #[test]
    fn answers_encode_as_prost_encodes_them() {
        let mut next = xorshift(0x2545_F491_4F6C_DD1D);
        let names = ["", "a", "per_user", &"n".repeat(200)];
        let values = ["", "0", "100, 100;w=60", &"v".repeat(300)];
        for round in 0..5_000 {
            // Numbers at the edges as often as anywhere.
            let num = |r: u64| match r % 4 {
                0 => 0u64,
                1 => r % 200,
                2 => u64::from(u32::MAX) - r % 3,
                _ => r,
            };
            let statuses: Vec<Status<'_>> = (0..next() % 4)
                .map(|_| Status {
                    code: [0, 1, 2, -1][(next() % 4) as usize],
                    limit: (!next().is_multiple_of(3)).then(|| {
                        (
                            names[(next() % 4) as usize],
                            num(next()) as u32,
                            [0, 1, 2, 3, 4, 5, 6, -3][(next() % 8) as usize],
                        )
                    }),
                    remaining: num(next()) as u32,
                    until_reset: (!next().is_multiple_of(3)).then(|| {
                        Duration::new(
                            num(next()) % (1 << 40),
                            (num(next()) % 1_000_000_000) as u32,
                        )
                    }),
                })
                .collect();
            let headers: Vec<(&str, &str)> = (0..next() % 3)
                .map(|_| (names[(next() % 4) as usize], values[(next() % 4) as usize]))
                .collect();
            let overall = [0, 1, 2][(next() % 3) as usize];
            let mut framed = vec![];
            frame(&mut framed, overall, &statuses, &headers);
            let want = prost_of(overall, &statuses, &headers);
            assert_eq!(framed[0], 0, "round {round}: uncompressed");
            assert_eq!(
                u32::from_be_bytes(framed[1..5].try_into().unwrap()) as usize,
                want.len(),
                "round {round}: length prefix"
            );
            assert_eq!(
                &framed[5..],
                &want[..],
                "round {round}: {statuses:?} {headers:?}"
            );
            // And it decodes back.
            RateLimitResponse::decode(&framed[5..]).unwrap();
        }
    }
}
