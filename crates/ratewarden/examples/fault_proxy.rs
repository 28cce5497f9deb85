//! The tests' fault proxy as a command, for `bench/soak.sh`: relays a
//! loopback port to `127.0.0.1:TARGET` and takes its faults from standard
//! input, one per line, until it closes.
//!
//!     fault_proxy TARGET            prints `port=N` (the port it listens on)
//!
//! Lines: `delay MS JITTER_MS` (each way), `stall UP DOWN` (1 holds that
//! direction), `reset PER_MILLION` (connections closed right after a chunk
//! reaches the server), `cut` (close every connection), `heal`.

#[allow(dead_code, unreachable_pub)]
#[path = "../tests/common/fault.rs"]
mod fault;

use std::io::BufRead as _;
use std::time::Duration;

fn main() {
    let target: u16 = std::env::args()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| {
            eprintln!("usage: fault_proxy TARGET_PORT");
            std::process::exit(2)
        });
    let proxy = fault::FaultProxy::start(target);
    println!("port={}", proxy.port);
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        let words: Vec<&str> = line.split_whitespace().collect();
        let n = |i: usize| {
            words
                .get(i)
                .and_then(|w| w.parse::<u64>().ok())
                .unwrap_or(0)
        };
        match words.first().copied() {
            Some("delay") => proxy.delay(Duration::from_millis(n(1)), Duration::from_millis(n(2))),
            Some("stall") => proxy.stall(n(1) == 1, n(2) == 1),
            Some("reset") => proxy.reset_after_send(n(1)),
            Some("cut") => proxy.cut(),
            Some("heal") => proxy.heal(),
            Some(other) => eprintln!("fault_proxy: `{other}`? (delay, stall, reset, cut, heal)"),
            None => {}
        }
    }
}
