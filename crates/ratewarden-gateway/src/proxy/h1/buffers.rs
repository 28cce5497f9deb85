//! Client buffers: released while a connection idles, kept per thread.

use bytes::BytesMut;

use super::Conn;

thread_local! {
    /// Client buffers of connections waiting between requests, for the next
    /// request on any connection of this thread: a pool, because buffers
    /// freed and allocated per request cost 1.8% CPU per forwarded request.
    static SPARE: std::cell::RefCell<Vec<(BytesMut, Vec<u8>)>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

/// At most this many spare buffer pairs (8 KiB each) per thread.
pub(crate) const SPARE_MAX: usize = 64;

/// Buffers grown past this by a large request or answer are freed, not
/// kept: an answer buffer after its exchange, a read buffer when its
/// connection goes idle (not kept as a spare).
pub(crate) const KEEP_BUFFER: usize = 16 * 1024;

impl Conn {
    /// After each exchange: gives back the upstream buffer (mimalloc hands
    /// it back next time at the cost of a thread-local free list pop) and an
    /// answer buffer a large head grew (see [`KEEP_BUFFER`]).
    pub(crate) fn trim(&mut self) {
        self.up = BytesMut::new();
        if self.out.capacity() > KEEP_BUFFER {
            self.out = Vec::with_capacity(4096);
        }
    }

    /// Between requests, nothing read and unanswered: gives back the client
    /// buffers too (as nginx frees its header buffer on a kept-alive
    /// connection), to this thread's spares.
    pub(crate) fn release(&mut self) {
        let mut input = std::mem::take(&mut self.input);
        let out = std::mem::take(&mut self.out);
        // Not kept: none yet, or grown by a large request (whose bytes
        // `input` advanced past still count; `try_reclaim` sees them).
        if out.capacity() == 0 || input.try_reclaim(KEEP_BUFFER) {
            return;
        }
        SPARE.with_borrow_mut(|spare| {
            if spare.len() < SPARE_MAX {
                spare.push((input, out));
            }
        });
    }

    /// Buffers for the next request: spares of this thread, else new ones.
    pub(crate) fn acquire(&mut self) {
        (self.input, self.out) = SPARE
            .with_borrow_mut(Vec::pop)
            .unwrap_or_else(|| (BytesMut::with_capacity(4096), Vec::with_capacity(4096)));
        self.out.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxy::h1::request::MAX_BODY;
    use bytes::Buf;

    #[test]
    fn idle_connections_keep_standard_buffers_as_spares_and_free_grown_ones() {
        let spares = || SPARE.with_borrow(Vec::len);
        let mut c = Conn::default();
        c.release();
        assert_eq!(spares(), 0, "a connection that never read has none");
        c.acquire();
        c.input.extend_from_slice(b"GET / HTTP/1.1\r\n\r\n");
        c.input.advance(18);
        c.out.extend_from_slice(b"HTTP/1.1 200 OK\r\n\r\n");
        c.release();
        assert_eq!(spares(), 1);
        assert!(
            c.input.capacity() == 0 && c.out.capacity() == 0,
            "none held idle"
        );
        // The next request (on any connection) takes them, emptied.
        let mut d = Conn::default();
        d.acquire();
        assert_eq!(spares(), 0);
        assert!(d.input.is_empty() && d.out.is_empty());
        d.input.reserve(4096);
        assert!(d.out.capacity() >= 4096);
        // A 64 KiB body, read and answered: freed, not kept.
        d.input.extend_from_slice(&[b'x'; MAX_BODY]);
        d.input.advance(MAX_BODY);
        d.release();
        assert_eq!(spares(), 0);
        // At most SPARE_MAX are kept.
        let mut all: Vec<Conn> = (0..SPARE_MAX + 3).map(|_| Conn::default()).collect();
        all.iter_mut().for_each(Conn::acquire);
        all.iter_mut().for_each(Conn::release);
        assert_eq!(spares(), SPARE_MAX);
    }
}
