//! The connections the gateway reads and writes, each one type whatever the
//! transport: a client's ([`ClientIo`]: TCP, or TLS over it) and an
//! upstream's ([`UpstreamIo`]), so the HTTP/1.1 path, hyper and the pools
//! serve both.
//!
//! A TLS stream accepts a write before its records are on the wire (they
//! wait in rustls when the socket is full): whoever finishes an answer or
//! a request flushes.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// A client connection.
#[derive(Debug)]
pub enum ClientIo {
    /// Cleartext.
    Plain(TcpStream),
    /// TLS, handshake done. (Boxed: rustls's state is a few hundred bytes,
    /// and most connections of a plain listener never need it.)
    Tls(Box<tokio_rustls::server::TlsStream<TcpStream>>),
}

impl ClientIo {
    /// Ready when a read would not block: bytes on the socket, or for TLS
    /// plaintext rustls already decrypted (a client's pipelined requests
    /// can arrive in one record and be read in two).
    pub fn poll_read_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self {
            ClientIo::Plain(s) => s.poll_read_ready(cx),
            ClientIo::Tls(s) => {
                let (tcp, conn) = s.get_ref();
                // `wants_read` is false while decrypted bytes wait (or after
                // the client's close_notify, which the read then reports).
                if !conn.wants_read() {
                    return Poll::Ready(Ok(()));
                }
                tcp.poll_read_ready(cx)
            }
        }
    }

    /// The server name the client asked for in its TLS handshake (SNI).
    pub fn sni(&self) -> Option<&str> {
        match self {
            ClientIo::Plain(_) => None,
            ClientIo::Tls(s) => s.get_ref().1.server_name(),
        }
    }

    /// Whether the client chose HTTP/2 by ALPN.
    pub fn is_h2(&self) -> bool {
        match self {
            ClientIo::Plain(_) => false,
            ClientIo::Tls(s) => s.get_ref().1.alpn_protocol() == Some(b"h2"),
        }
    }

    /// Whether this is a TLS connection.
    pub fn is_tls(&self) -> bool {
        matches!(self, ClientIo::Tls(_))
    }
}

/// An upstream connection.
#[derive(Debug)]
pub enum UpstreamIo {
    /// Cleartext.
    Plain(TcpStream),
    /// TLS, handshake done.
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
}

impl UpstreamIo {
    /// Whether an idle pooled connection can carry a request: an idle
    /// connection has nothing to say but its close (or garbage). For TCP
    /// this asks tokio's readiness, which the reactor set when the event
    /// arrived: no system call. For TLS a readable socket may only carry
    /// records for rustls (a TLS 1.3 server sends session tickets after
    /// the handshake), so it tries a read: nothing to read is good news.
    pub fn is_reusable(&mut self) -> bool {
        let mut cx = Context::from_waker(std::task::Waker::noop());
        match self {
            UpstreamIo::Plain(s) => s.poll_read_ready(&mut cx).is_pending(),
            UpstreamIo::Tls(s) => {
                if s.get_ref().0.poll_read_ready(&mut cx).is_pending() {
                    return true;
                }
                let mut byte = [0u8; 1];
                let mut buf = ReadBuf::new(&mut byte);
                Pin::new(s).poll_read(&mut cx, &mut buf).is_pending()
            }
        }
    }
}

macro_rules! delegate_io {
    ($t:ident) => {
        impl AsyncRead for $t {
            fn poll_read(
                self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                buf: &mut ReadBuf<'_>,
            ) -> Poll<io::Result<()>> {
                match self.get_mut() {
                    $t::Plain(s) => Pin::new(s).poll_read(cx, buf),
                    $t::Tls(s) => Pin::new(s).poll_read(cx, buf),
                }
            }
        }

        impl AsyncWrite for $t {
            fn poll_write(
                self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                data: &[u8],
            ) -> Poll<io::Result<usize>> {
                match self.get_mut() {
                    $t::Plain(s) => Pin::new(s).poll_write(cx, data),
                    $t::Tls(s) => Pin::new(s).poll_write(cx, data),
                }
            }

            fn poll_write_vectored(
                self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                bufs: &[io::IoSlice<'_>],
            ) -> Poll<io::Result<usize>> {
                match self.get_mut() {
                    $t::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
                    $t::Tls(s) => Pin::new(s).poll_write_vectored(cx, bufs),
                }
            }

            fn is_write_vectored(&self) -> bool {
                match self {
                    $t::Plain(s) => s.is_write_vectored(),
                    $t::Tls(s) => s.is_write_vectored(),
                }
            }

            fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                match self.get_mut() {
                    $t::Plain(s) => Pin::new(s).poll_flush(cx),
                    $t::Tls(s) => Pin::new(s).poll_flush(cx),
                }
            }

            fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                match self.get_mut() {
                    $t::Plain(s) => Pin::new(s).poll_shutdown(cx),
                    $t::Tls(s) => Pin::new(s).poll_shutdown(cx),
                }
            }
        }
    };
}

delegate_io!(ClientIo);
delegate_io!(UpstreamIo);
