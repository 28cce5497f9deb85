//! Chunked framing (RFC 9112 §7.1), read byte by byte.
//!
//! One state machine serves both directions: relaying an upstream's chunked
//! answer as it comes (only its end is needed), and decoding a client's
//! chunked request body before it is forwarded whole (its data is needed).
//! The grammar is hyper's, state for state (`proto/h1/decode.rs`): a size
//! line starts with a hex digit, may have spaces or tabs before `;` and an
//! extension, and ends in CRLF; data ends in CRLF; trailer lines end in CRLF.
//! The two paths of the gateway then agree on where a body ends, which is
//! what request smuggling exploits when they do not.

use std::ops::Range;

/// Where a chunked body ends, and in decoding mode where its data is.
#[derive(Debug, Default)]
pub(crate) struct Chunks {
    state: ChunkState,
    size: u64,
    /// Bytes of trailer section seen (validated at the end when decoding).
    trailer: usize,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ChunkState {
    /// Expecting the first hex digit of a size.
    #[default]
    Start,
    Size,
    SizeLws,
    Extension,
    SizeLf,
    Data,
    DataCr,
    DataLf,
    /// After the last chunk's size line: a trailer line or the final CRLF.
    EndCr,
    Trailer,
    TrailerLf,
    EndLf,
    Done,
}

/// Where decoding records data and trailer spans.
type Spans<'a> = (&'a mut Vec<Range<usize>>, &'a mut Vec<Range<usize>>);

/// Why a chunked body is malformed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BadChunk;

/// Most bytes of trailer section accepted (hyper's limit).
const TRAILER_LIMIT: usize = 16 * 1024;

impl Chunks {
    /// Reads `bytes`: `Ok(Some(n))` when the body ends after `n` of them,
    /// `Ok(None)` when all of them belong to it, `Err` on bad framing.
    pub(crate) fn feed(&mut self, bytes: &[u8]) -> Result<Option<usize>, BadChunk> {
        self.step(bytes, None)
    }

    /// [`feed`](Self::feed), recording the ranges of `bytes` that are chunk
    /// data in `data`, and those of the trailer section in `trailer`.
    pub(crate) fn decode(
        &mut self,
        bytes: &[u8],
        data: &mut Vec<Range<usize>>,
        trailer: &mut Vec<Range<usize>>,
    ) -> Result<Option<usize>, BadChunk> {
        self.step(bytes, Some((data, trailer)))
    }

    fn step(
        &mut self,
        bytes: &[u8],
        mut sink: Option<Spans<'_>>,
    ) -> Result<Option<usize>, BadChunk> {
        use ChunkState::*;
        let mut i = 0;
        while i < bytes.len() {
            let b = bytes[i];
            let in_trailer = match self.state {
                EndCr => b != b'\r',
                Trailer | TrailerLf => true,
                _ => false,
            };
            self.state = match (self.state, b) {
                (Start | Size, b'0'..=b'9' | b'a'..=b'f' | b'A'..=b'F') => {
                    let digit = (b as char).to_digit(16).expect("hex digit");
                    self.size = self
                        .size
                        .checked_mul(16)
                        .and_then(|s| s.checked_add(u64::from(digit)))
                        .ok_or(BadChunk)?;
                    Size
                }
                (Start, _) => return Err(BadChunk),
                (Size | SizeLws, b' ' | b'\t') => SizeLws,
                (Size | SizeLws, b';') => Extension,
                (Size | SizeLws | Extension, b'\r') => SizeLf,
                (Size | SizeLws, _) => return Err(BadChunk),
                (Extension, b'\n') => return Err(BadChunk),
                (Extension, _) => Extension,
                (SizeLf, b'\n') if self.size == 0 => EndCr,
                (SizeLf, b'\n') => Data,
                (Data, _) => {
                    let take = (bytes.len() - i).min(self.size.try_into().unwrap_or(usize::MAX));
                    if let Some((data, _)) = sink.as_mut() {
                        data.push(i..i + take);
                    }
                    self.size -= take as u64;
                    i += take;
                    if self.size == 0 {
                        self.state = DataCr;
                    }
                    continue;
                }
                (DataCr, b'\r') => DataLf,
                (DataLf, b'\n') => Start,
                (EndCr, b'\r') => EndLf,
                (Trailer, b'\r') => TrailerLf,
                (EndCr | Trailer, _) => Trailer,
                (TrailerLf, b'\n') => EndCr,
                (EndLf, b'\n') => {
                    self.state = Done;
                    return Ok(Some(i + 1));
                }
                _ => return Err(BadChunk),
            };
            if in_trailer {
                self.trailer += 1;
                if self.trailer > TRAILER_LIMIT {
                    return Err(BadChunk);
                }
                if let Some((_, trailer)) = sink.as_mut() {
                    match trailer.last_mut() {
                        Some(r) if r.end == i => r.end += 1,
                        _ => trailer.push(i..i + 1),
                    }
                }
            }
            i += 1;
        }
        Ok(None)
    }
}

/// Whether `section` (the bytes between the last chunk's size line and the
/// body's final CRLF) is a valid trailer section, as hyper checks it.
pub(crate) fn valid_trailers(section: &[u8]) -> bool {
    if section.is_empty() {
        return true;
    }
    let mut with_end = Vec::with_capacity(section.len() + 2);
    with_end.extend_from_slice(section);
    with_end.extend_from_slice(b"\r\n");
    // hyper sizes its field array by the CRLF-ended lines it counted (a
    // bare LF inside a line does not count), at most its 100.
    let lines = section.windows(2).filter(|w| w == b"\r\n").count();
    if lines > super::request::MAX_HEADERS {
        return false;
    }
    let mut headers = vec![httparse::EMPTY_HEADER; lines];
    match httparse::parse_headers(&with_end, &mut headers) {
        // hyper then makes each a `HeaderName` and a `HeaderValue`.
        Ok(httparse::Status::Complete((_, fields))) => fields.iter().all(|f| {
            http::HeaderName::from_bytes(f.name.as_bytes()).is_ok()
                && http::HeaderValue::from_bytes(f.value).is_ok()
        }),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_end_of_a_chunked_body_is_found_however_it_is_split() {
        let body =
            b"5;ext=1\r\nhello\r\n10 \t;x\r\n0123456789abcdef\r\n0\r\nx-trailer: 1\r\n\r\nNEXT";
        let end = body.len() - 4;
        for split in 0..body.len() {
            let mut c = Chunks::default();
            let found = match c.feed(&body[..split]).unwrap() {
                Some(n) => n,
                None => split + c.feed(&body[split..]).unwrap().expect("ends"),
            };
            assert_eq!(found, end, "split at {split}");
        }
        assert_eq!(Chunks::default().feed(b"0\r\n\r\n"), Ok(Some(5)));
    }

    #[test]
    fn data_is_found_however_it_is_split() {
        let body = b"5\r\nhello\r\n3;a=b\r\n, w\r\n4\r\norld\r\n0\r\n\r\n";
        for split in 0..body.len() {
            let mut c = Chunks::default();
            let (mut data, mut trailer) = (vec![], vec![]);
            let mut got = vec![];
            let first = c.decode(&body[..split], &mut data, &mut trailer).unwrap();
            got.extend(data.drain(..).flat_map(|r| body[r].to_vec()));
            if first.is_none() {
                let rest = &body[split..];
                c.decode(rest, &mut data, &mut trailer)
                    .unwrap()
                    .expect("ends");
                got.extend(data.drain(..).flat_map(|r| rest[r].to_vec()));
            }
            assert_eq!(got, b"hello, world", "split at {split}");
        }
    }

    #[test]
    fn what_hyper_refuses_is_refused() {
        for bad in [
            &b"zz\r\n"[..],
            b"\r\n",                  // no size digit
            b";x\r\n",                // no size digit
            b"2\r\nabX",              // data not followed by CRLF
            b"5 x\r\n",               // junk after the size
            b"5\n",                   // bare LF after the size
            b"1;a\nb\r\n",            // LF inside an extension
            b"0\r\nx: 1\r\n\r\r",     // final CRLF broken after a trailer
            b"0\r\n\r\r",             // final CRLF broken
            b"fffffffffffffffff\r\n", // size overflow
        ] {
            assert_eq!(Chunks::default().feed(bad), Err(BadChunk), "{bad:?}");
        }
        let body = b"0\r\nx-a: 1\r\nx-b: 2\r\n\r\n";
        let (mut data, mut trailer) = (vec![], vec![]);
        let end = Chunks::default().decode(body, &mut data, &mut trailer);
        assert_eq!((end, data.len()), (Ok(Some(body.len())), 0));
        assert_eq!((trailer.len(), &trailer[0]), (1, &(3..body.len() - 2)));
        assert!(valid_trailers(&body[trailer[0].clone()]));
        assert!(!valid_trailers(b"no colon here\r\n"));
        // Found by the differential fuzz target: hyper refuses these.
        assert!(
            !valid_trailers(b"x-t: a\x7fb\r\n"),
            "a value HeaderValue refuses"
        );
        assert!(
            !valid_trailers(b"x-t: 1\ny: 2\r\n"),
            "more fields than CRLF lines"
        );
    }
}
