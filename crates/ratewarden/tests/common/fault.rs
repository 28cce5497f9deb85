//! A fault proxy for tests (issue 52): a TCP relay between the store and a
//! Redis server that adds latency (fixed, with jitter), stalls either
//! direction without closing (a blackhole: bytes held, not lost, as TCP
//! retransmits them after a heal), closes every connection at once, and
//! heals. Loopback only; threads, no runtime: it is test tooling.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

#[derive(Default)]
struct Faults {
    /// Added to every chunk's delivery, each direction, in µs.
    delay: AtomicU64,
    /// Up to this much more, at random, in µs (order is kept).
    jitter: AtomicU64,
    /// Client to server held.
    stall_up: AtomicBool,
    /// Server to client held.
    stall_down: AtomicBool,
    /// Moved by [`FaultProxy::cut`]: connections of an older one close.
    epoch: AtomicU64,
    /// Per million chunks sent to the server: the connection is closed
    /// right after the chunk is delivered, before any answer comes back.
    reset_after_send: AtomicU64,
    /// Connections closed so.
    resets: AtomicU64,
}

/// A relay on `127.0.0.1:port` to a server's port, with faults to turn on.
pub struct FaultProxy {
    pub port: u16,
    faults: Arc<Faults>,
}

impl FaultProxy {
    /// Relays to `127.0.0.1:target`.
    pub fn start(target: u16) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let faults = Arc::new(Faults::default());
        let f = faults.clone();
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { continue };
                let Ok(server) = TcpStream::connect(("127.0.0.1", target)) else {
                    continue;
                };
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                let epoch = f.epoch.load(Ordering::SeqCst);
                pump(&client, &server, f.clone(), true, epoch);
                pump(&server, &client, f.clone(), false, epoch);
            }
        });
        Self { port, faults }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Every chunk, each way, `base` later, and up to `jitter` more.
    pub fn delay(&self, base: Duration, jitter: Duration) {
        self.faults
            .delay
            .store(base.as_micros() as u64, Ordering::SeqCst);
        self.faults
            .jitter
            .store(jitter.as_micros() as u64, Ordering::SeqCst);
    }

    /// Holds what goes to the server (`up`) and what comes back (`down`),
    /// the connections left open: a link that stops answering.
    pub fn stall(&self, up: bool, down: bool) {
        self.faults.stall_up.store(up, Ordering::SeqCst);
        self.faults.stall_down.store(down, Ordering::SeqCst);
    }

    /// Closes every connection made so far (new ones are relayed).
    pub fn cut(&self) {
        self.faults.epoch.fetch_add(1, Ordering::SeqCst);
    }

    /// Closes a connection right after `per_million` of the chunks sent to
    /// the server were delivered (the command ran; its answer is lost).
    pub fn reset_after_send(&self, per_million: u64) {
        self.faults
            .reset_after_send
            .store(per_million, Ordering::SeqCst);
    }

    /// Connections closed by [`FaultProxy::reset_after_send`] so far.
    pub fn resets(&self) -> u64 {
        self.faults.resets.load(Ordering::SeqCst)
    }

    /// No delay, nothing held, no resets.
    pub fn heal(&self) {
        self.delay(Duration::ZERO, Duration::ZERO);
        self.stall(false, false);
        self.reset_after_send(0);
    }
}

/// Relays `from` to `to`: a reader that stamps each chunk with its
/// arrival, and a writer that delivers it when the faults say.
fn pump(from: &TcpStream, to: &TcpStream, f: Arc<Faults>, up: bool, epoch: u64) {
    let (tx, rx) = mpsc::channel::<(Instant, Vec<u8>)>();
    let mut from_r = from.try_clone().unwrap();
    let from_w = from.try_clone().unwrap();
    let mut to_w = to.try_clone().unwrap();
    std::thread::spawn(move || {
        let mut buf = vec![0; 64 * 1024];
        loop {
            match from_r.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if tx.send((Instant::now(), buf[..n].to_vec())).is_err() {
                        break;
                    }
                }
            }
        }
    });
    std::thread::spawn(move || {
        let mut last = Instant::now();
        let mut seed = 0x9E37_79B9_7F4A_7C15u64 ^ u64::from(up);
        let stalled = |f: &Faults| {
            if up {
                f.stall_up.load(Ordering::SeqCst)
            } else {
                f.stall_down.load(Ordering::SeqCst)
            }
        };
        let cut = |f: &Faults| f.epoch.load(Ordering::SeqCst) != epoch;
        loop {
            let (at, bytes) = match rx.recv_timeout(Duration::from_millis(20)) {
                Ok(chunk) => chunk,
                Err(mpsc::RecvTimeoutError::Timeout) if !cut(&f) => continue,
                Err(mpsc::RecvTimeoutError::Timeout) => break,
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            };
            while stalled(&f) && !cut(&f) {
                std::thread::sleep(Duration::from_millis(2));
            }
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let jitter = f.jitter.load(Ordering::SeqCst);
            let extra = if jitter == 0 { 0 } else { seed % jitter };
            let due =
                (at + Duration::from_micros(f.delay.load(Ordering::SeqCst) + extra)).max(last);
            while Instant::now() < due && !cut(&f) {
                std::thread::sleep((due - Instant::now()).min(Duration::from_millis(5)));
            }
            if cut(&f) {
                break;
            }
            last = due;
            if to_w.write_all(&bytes).is_err() {
                break;
            }
            let reset = f.reset_after_send.load(Ordering::SeqCst);
            if up && reset > 0 && seed % 1_000_000 < reset {
                f.resets.fetch_add(1, Ordering::SeqCst);
                // Let the command reach the server before the cut.
                std::thread::sleep(Duration::from_millis(1));
                break;
            }
        }
        let _ = to_w.shutdown(Shutdown::Both);
        let _ = from_w.shutdown(Shutdown::Both);
    });
}
