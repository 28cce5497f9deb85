//! Chunked framing.

/// Finds where a chunked body ends while it is relayed byte for byte.
#[derive(Debug, Default)]
pub(crate) struct Chunks {
    state: ChunkState,
    size: u64,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ChunkState {
    #[default]
    Size,
    Extension,
    SizeLf,
    Data,
    DataCr,
    DataLf,
    TrailerLine,
    TrailerStart,
    EndLf,
    Done,
}

impl Chunks {
    /// Reads `bytes`: `Ok(Some(n))` when the body ends after `n` of them,
    /// `Ok(None)` when all of them belong to it, `Err` on bad framing.
    pub(crate) fn feed(&mut self, bytes: &[u8]) -> Result<Option<usize>, ()> {
        use ChunkState::*;
        let mut i = 0;
        while i < bytes.len() {
            let b = bytes[i];
            self.state = match self.state {
                Size => match b {
                    b'0'..=b'9' | b'a'..=b'f' | b'A'..=b'F' => {
                        let digit = (b as char).to_digit(16).expect("hex digit");
                        self.size = self
                            .size
                            .checked_mul(16)
                            .and_then(|s| s.checked_add(u64::from(digit)))
                            .ok_or(())?;
                        Size
                    }
                    b';' | b' ' | b'\t' => Extension,
                    b'\r' => SizeLf,
                    _ => return Err(()),
                },
                Extension => match b {
                    b'\r' => SizeLf,
                    b'\n' => return Err(()),
                    _ => Extension,
                },
                SizeLf if b == b'\n' => {
                    if self.size == 0 {
                        TrailerStart
                    } else {
                        Data
                    }
                }
                Data => {
                    let take = (bytes.len() - i).min(self.size.try_into().unwrap_or(usize::MAX));
                    self.size -= take as u64;
                    i += take;
                    if self.size == 0 {
                        self.state = DataCr;
                    }
                    continue;
                }
                DataCr if b == b'\r' => DataLf,
                DataLf if b == b'\n' => Size,
                TrailerStart if b == b'\r' => EndLf,
                TrailerStart | TrailerLine => {
                    if b == b'\n' {
                        TrailerStart
                    } else {
                        TrailerLine
                    }
                }
                EndLf if b == b'\n' => {
                    self.state = Done;
                    return Ok(Some(i + 1));
                }
                _ => return Err(()),
            };
            i += 1;
        }
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_end_of_a_chunked_body_is_found_however_it_is_split() {
        let body = b"5;ext=1\r\nhello\r\n10\r\n0123456789abcdef\r\n0\r\nx-trailer: 1\r\n\r\nNEXT";
        let end = body.len() - 4;
        for split in 0..body.len() {
            let mut c = Chunks::default();
            let found = match c.feed(&body[..split]).unwrap() {
                Some(n) => n,
                None => split + c.feed(&body[split..]).unwrap().expect("ends"),
            };
            assert_eq!(found, end, "split at {split}");
        }
        assert!(Chunks::default().feed(b"zz\r\n").is_err());
        assert!(Chunks::default().feed(b"2\r\nabX").is_err());
        assert_eq!(Chunks::default().feed(b"0\r\n\r\n"), Ok(Some(5)));
    }
}
