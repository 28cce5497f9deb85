//! The access log (`access_log:`): one line per answered request, admitted
//! or refused, as JSON or in nginx's `combined` format.
//!
//! A request never waits for it. The request's thread renders its line
//! straight into a buffer of its own (no allocation, no copy; a lock that
//! only the writer takes, and then the line goes to a second buffer
//! instead of waiting); a thread of its own writes each thread's buffer
//! out when one has grown past [`BATCH`] or every [`FLUSH`], with one
//! call, as nginx's `access_log ... buffer= flush=` does per worker. When
//! a thread's buffer is full (the disk or the terminal cannot keep up),
//! the line is dropped and counted (`ratewarden_access_log_dropped_total`).
//! Lines of one thread keep their order; lines of different threads
//! interleave by batch, as nginx's workers' do.

use std::cell::RefCell;
use std::io::Write as _;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, TryLockError, Weak};
use std::time::Duration;

/// A wall-clock time as the time since the Unix epoch.
pub(crate) type Wall = Duration;

use crate::observe::request_id::RequestId;

/// Bytes waiting in a thread's buffer (and in its spill buffer, while
/// the writer writes the first), at most; past this, lines are dropped.
const CAPACITY: usize = 8 << 20;
/// Bytes after which the writer is woken at once. Small enough that a
/// thread's buffer stays in the core's cache: at 256 KiB the lines'
/// memory evicted the request path's (BENCHMARKS.md, "the access log on
/// and off").
const BATCH: usize = 64 << 10;
/// The longest a line waits before it is written.
const FLUSH: Duration = Duration::from_millis(200);

pub(crate) use crate::config::{AccessFormat as Format, AccessSink as Sink, AccessSpec as Spec};

/// One answered request, borrowed from the connection that answered it.
#[derive(Debug, Clone, Copy)]
pub struct Record<'a> {
    /// When the request arrived.
    pub time: Wall,
    /// The peer's address.
    pub peer: IpAddr,
    /// `GET`, ...
    pub method: &'a str,
    /// The target as the client sent it.
    pub target: &'a [u8],
    /// `HTTP/1.1`, `HTTP/2.0`, ...
    pub version: &'static str,
    /// The status answered.
    pub status: u16,
    /// Body bytes sent, when known (a relayed chunked or close-delimited
    /// body is not counted).
    pub bytes: Option<u64>,
    /// From the request's arrival to its answer's head (or whole answer
    /// for the gateway's own).
    pub duration: Duration,
    /// Its id.
    pub request_id: &'a RequestId,
    /// The client's identity as the rules saw it (when a rule limits it).
    pub identity: Option<&'a str>,
    /// The key the refusing rule counted, if a rule refused (the identity
    /// with the rule's other key parts).
    pub key: Option<&'a str>,
    /// The consumer the request's API key named (`consumers:`), never the
    /// key; JSON only, and only then.
    pub consumer: Option<&'a str>,
    /// The rule that refused it, if one did.
    pub rule: Option<&'a str>,
    /// The tier of that rule in force, if it has tiers (`override` for a
    /// key's override); JSON only, and only then.
    pub tier: Option<&'a str>,
    /// `Referer`, as sent.
    pub referer: Option<&'a [u8]>,
    /// `User-Agent`, as sent.
    pub user_agent: Option<&'a [u8]>,
    /// What a rule charged by an LLM's usage read and charged (JSON only).
    pub llm: Option<&'a LlmLine>,
}

/// The access log's account of an LLM call (`cost: {from: llm}`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LlmLine {
    /// The model the answer (else the request) named.
    pub model: Option<String>,
    /// Input tokens (cached ones included) and output tokens, when the
    /// answer reported its usage.
    pub tokens_in: Option<u64>,
    pub tokens_out: Option<u64>,
    /// The units reserved at admission, and charged in the end.
    pub reserved: u64,
    pub charged: u64,
}

/// When a request arrived, for its line: a TSC read, cheaper than the
/// system clocks (two of them would be read per request otherwise).
pub(crate) fn arrived() -> quanta::Instant {
    quanta::Instant::now()
}

/// The wall-clock time a request that arrived at `at` arrived, and how
/// long it has taken since: a [`Record`]'s `time` and `duration`.
pub(crate) fn since(at: quanta::Instant) -> (Wall, Duration) {
    (crate::observe::request_id::wall(at), at.elapsed())
}

/// One request thread's pending lines.
type Lines = Arc<Pending>;

/// A request thread's lines: written by the writer from `main` itself,
/// which the thread then goes on filling (one buffer's memory goes
/// through the core's cache, not two taking turns); lines made while
/// the writer holds `main` go to `spill`, which the writer swaps out and
/// writes after it. Neither makes the request thread wait for a write.
struct Pending {
    main: Mutex<Vec<u8>>,
    spill: Mutex<Vec<u8>>,
}

/// A thread's buffer and the log it belongs to.
type Owned = (Weak<Shared>, Lines);

/// What the request threads and the writer share.
struct Shared {
    /// A buffer per thread that has logged; the writer visits each.
    threads: Mutex<Vec<Lines>>,
    /// Set when a thread's buffer has passed [`BATCH`].
    due: Mutex<bool>,
    wake: Condvar,
    dropped: AtomicU64,
    /// Set by [`AccessLog::close`]: the writer writes what is buffered,
    /// flushes and ends.
    closing: std::sync::atomic::AtomicBool,
    /// The writer thread, joined by [`AccessLog::close`].
    writer: Mutex<Option<std::thread::JoinHandle<()>>>,
}

/// The running access log. Cheap to clone.
#[derive(Clone)]
pub struct AccessLog {
    shared: Arc<Shared>,
    format: Format,
}

impl std::fmt::Debug for AccessLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AccessLog")
            .field("dropped", &self.dropped())
            .finish()
    }
}

impl AccessLog {
    /// Opens the sink and starts the writing thread.
    pub fn start(spec: &Spec) -> std::io::Result<Self> {
        let out: Box<dyn std::io::Write + Send> = match &spec.sink {
            Sink::Stdout => Box::new(std::io::stdout()),
            Sink::File(p) => Box::new(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(p)?,
            ),
        };
        let log = Self::unstarted(spec.format);
        let shared = Arc::clone(&log.shared);
        let writer = std::thread::Builder::new()
            .name("access-log".into())
            .spawn(move || {
                write_all(
                    &shared,
                    || Arc::strong_count(&shared) == 1 || shared.closing.load(Ordering::Relaxed),
                    out,
                )
            })?;
        if let Ok(mut w) = log.shared.writer.lock() {
            *w = Some(writer);
        }
        Ok(log)
    }

    fn unstarted(format: Format) -> Self {
        Self {
            shared: Arc::new(Shared {
                threads: Mutex::new(Vec::new()),
                due: Mutex::new(false),
                wake: Condvar::new(),
                dropped: AtomicU64::new(0),
                closing: std::sync::atomic::AtomicBool::new(false),
                writer: Mutex::new(None),
            }),
            format,
        }
    }

    /// Renders `r` into this thread's buffer; never waits for a write. A
    /// full buffer drops it.
    pub fn log(&self, r: &Record<'_>) {
        thread_local! {
            // This thread's buffer, and whose it is (a reload may start
            // another log; the `Weak` keeps the address from being reused),
            // and its render cache: one thread-local a line, not two.
            static MINE: RefCell<(Option<Owned>, Cache)> = const { RefCell::new((None, Cache::new())) };
        }
        MINE.with_borrow_mut(|(mine, cache)| {
            let lines = match mine {
                Some((owner, lines)) if std::ptr::eq(owner.as_ptr(), Arc::as_ptr(&self.shared)) => {
                    lines
                }
                _ => {
                    let lines = Lines::new(Pending {
                        main: Mutex::new(Vec::with_capacity(BATCH * 2)),
                        spill: Mutex::default(),
                    });
                    let Ok(mut threads) = self.shared.threads.lock() else {
                        return;
                    };
                    threads.push(Arc::clone(&lines));
                    &mut mine.insert((Arc::downgrade(&self.shared), lines)).1
                }
            };
            let mut pending = match lines.main.try_lock() {
                Ok(main) => main,
                // The writer is writing `main` out.
                Err(TryLockError::WouldBlock) => match lines.spill.lock() {
                    Ok(spill) => spill,
                    Err(_) => return,
                },
                Err(TryLockError::Poisoned(_)) => return,
            };
            let before = pending.len();
            render(cache, &mut pending, r, self.format);
            if pending.len() > CAPACITY {
                pending.truncate(before);
                drop(pending);
                self.shared.dropped.fetch_add(1, Ordering::Relaxed);
                return;
            }
            let crossed = before < BATCH && pending.len() >= BATCH;
            drop(pending);
            if crossed {
                if let Ok(mut due) = self.shared.due.lock() {
                    *due = true;
                }
                self.shared.wake.notify_one();
            }
        });
    }

    /// Writes every line buffered so far, flushes the sink and stops the
    /// writer, waiting for it (a stopping gateway calls it once its
    /// requests are done: nginx, too, writes its buffered log on exit).
    /// Lines logged after it are not written.
    pub fn close(&self) {
        self.shared.closing.store(true, Ordering::Relaxed);
        if let Ok(mut due) = self.shared.due.lock() {
            *due = true;
        }
        self.shared.wake.notify_one();
        let writer = self.shared.writer.lock().ok().and_then(|mut w| w.take());
        if let Some(w) = writer {
            let _ = w.join();
        }
    }

    /// Lines dropped so far.
    pub fn dropped(&self) -> u64 {
        self.shared.dropped.load(Ordering::Relaxed)
    }
}

/// The writer: when woken or every [`FLUSH`], writes each thread's lines
/// from its buffer, then the lines that thread spilled meanwhile (a call
/// each). It holds one reference to `shared`; when it holds the only
/// one, every handle is gone (a line is being rendered only under a
/// handle), and after that last round it ends.
fn write_all(shared: &Shared, alone: impl Fn() -> bool, mut out: Box<dyn std::io::Write + Send>) {
    let mut batch = Vec::new();
    loop {
        {
            let Ok(due) = shared.due.lock() else {
                return;
            };
            let Ok((mut due, _)) = shared.wake.wait_timeout_while(due, FLUSH, |d| !*d) else {
                return;
            };
            *due = false;
        }
        let last = alone();
        let Ok(threads) = shared.threads.lock().map(|t| t.clone()) else {
            return;
        };
        for lines in &threads {
            match lines.main.lock() {
                Ok(mut main) => {
                    if !main.is_empty() && !write(&mut *out, &main) {
                        return;
                    }
                    main.clear();
                }
                Err(_) => continue,
            }
            match lines.spill.lock() {
                Ok(mut spill) => std::mem::swap(&mut *spill, &mut batch),
                Err(_) => continue,
            }
            if !batch.is_empty() && !write(&mut *out, &batch) {
                return;
            }
            batch.clear();
        }
        drop(threads);
        // Buffers of threads that have ended (the list's is then the only
        // reference), once written, go.
        if let Ok(mut threads) = shared.threads.lock() {
            let pending = |b: &Mutex<Vec<u8>>| b.lock().is_ok_and(|p| !p.is_empty());
            threads.retain(|t| Arc::strong_count(t) > 1 || pending(&t.main) || pending(&t.spill));
        }
        if last {
            return;
        }
    }
}

/// Writes `lines`; false, with the error logged, if it cannot.
fn write(out: &mut dyn std::io::Write, lines: &[u8]) -> bool {
    if let Err(e) = out.write_all(lines).and_then(|()| out.flush()) {
        // From here the buffers fill and every line is counted as
        // dropped; the requests go on.
        tracing::error!(error = %e, "the access log cannot be written; its lines are dropped from now on");
        return false;
    }
    true
}

/// Appends `s` as the inside of a JSON string: quotes, backslashes and
/// control characters escaped; bytes that are not UTF-8 as U+FFFD.
#[inline]
fn json_str(out: &mut Vec<u8>, s: &[u8]) {
    // Most values (ids, methods, targets) need nothing: copied whole.
    if plain(s) {
        out.extend_from_slice(s);
    } else {
        json_escaped(out, s);
    }
}

/// [`json_str`] of a value that needs escaping, kept out of line: most
/// lines never need it.
#[cold]
#[inline(never)]
fn json_escaped(out: &mut Vec<u8>, s: &[u8]) {
    let mut text = String::with_capacity(s.len() + 8);
    for chunk in s.utf8_chunks() {
        ratewarden::decision::push_json_escaped(&mut text, chunk.valid());
        if !chunk.invalid().is_empty() {
            text.push('\u{fffd}');
        }
    }
    out.extend_from_slice(text.as_bytes());
}

/// What a thread keeps between its lines: the address of the last line
/// rendered (a connection's requests come together) and the second the
/// last time fell in, per format (lines come many to a second). One
/// thread-local for all of it: each access costs a check.
struct Cache {
    ip: Option<IpAddr>,
    ip_text: Vec<u8>,
    second: [(u64, Vec<u8>); 2],
}

impl Cache {
    const fn new() -> Self {
        Self {
            ip: None,
            ip_text: Vec::new(),
            second: [(u64::MAX, Vec::new()), (u64::MAX, Vec::new())],
        }
    }

    /// `ip` as `Display` writes it, IPv4 without the formatting machinery.
    fn ip(&mut self, out: &mut Vec<u8>, ip: IpAddr) {
        if self.ip != Some(ip) {
            self.ip_text.clear();
            ratewarden_tower::identity::push_ip(&mut self.ip_text, ip);
            self.ip = Some(ip);
        }
        out.extend_from_slice(&self.ip_text);
    }

    /// The second `t` falls in, rendered by `render` once per second.
    fn second(
        &mut self,
        out: &mut Vec<u8>,
        t: Wall,
        which: usize,
        render: fn(&mut Vec<u8>, (i64, u32, u32), u64),
    ) {
        let secs = t.as_secs();
        let (at, text) = &mut self.second[which];
        if *at != secs {
            let (date, s, _) = parts(t);
            text.clear();
            render(text, date, s);
            *at = secs;
        }
        out.extend_from_slice(text);
    }
}

/// Whether every byte of `s` is printable ASCII other than `"` and `\\`
/// (nothing to escape), eight bytes at a time.
#[inline]
fn plain(s: &[u8]) -> bool {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    // High bit of each byte of the result set where that byte of `x` is
    // below `n` (n <= 0x80; exact for bytes below 0x80, and bytes from
    // 0x80 up are refused on their own).
    let below = |x: u64, n: u8| x.wrapping_sub(ONES * u64::from(n)) & !x & HIGH;
    let zero = |x: u64| x.wrapping_sub(ONES) & !x & HIGH;
    let word = |x: u64| {
        (x & HIGH) == 0
            && below(x, 0x20) == 0
            && zero(x ^ (ONES * 0x7f)) == 0
            && zero(x ^ (ONES * u64::from(b'"'))) == 0
            && zero(x ^ (ONES * u64::from(b'\\'))) == 0
    };
    let mut chunks = s.chunks_exact(8);
    for c in chunks.by_ref() {
        let mut w = [0; 8];
        w.copy_from_slice(c);
        if !word(u64::from_le_bytes(w)) {
            return false;
        }
    }
    chunks
        .remainder()
        .iter()
        .all(|&b| (0x20..0x7f).contains(&b) && b != b'"' && b != b'\\')
}

/// `"s"` or `null`.
#[inline]
fn json_opt(out: &mut Vec<u8>, s: Option<&[u8]>) {
    match s {
        Some(s) => {
            out.push(b'"');
            json_str(out, s);
            out.push(b'"');
        }
        None => out.extend_from_slice(b"null"),
    }
}

/// `s` inside a `combined` quoted field: `"` and `\` escaped, as nginx
/// escapes them (with control and non-ASCII bytes as `\xHH`).
fn clf_str(out: &mut Vec<u8>, s: &[u8]) {
    for &b in s {
        match b {
            b'"' | b'\\' => {
                out.push(b'\\');
                out.push(b);
            }
            0x20..0x7f => out.push(b),
            _ => {
                let _ = write!(out, "\\x{b:02X}");
            }
        }
    }
}

/// One line, with its newline; `cache` is the thread's (`AccessLog::log`).
fn render(cache: &mut Cache, out: &mut Vec<u8>, r: &Record<'_>, format: Format) {
    let mut n = itoa::Buffer::new();
    match format {
        Format::Json => {
            out.extend_from_slice(b"{\"time\":\"");
            rfc3339(cache, out, r.time);
            out.extend_from_slice(b"\",\"remote_addr\":\"");
            cache.ip(out, r.peer);
            out.extend_from_slice(b"\",\"method\":\"");
            // A method is a token: nothing in it needs escaping.
            out.extend_from_slice(r.method.as_bytes());
            out.extend_from_slice(b"\",\"target\":\"");
            json_str(out, r.target);
            match r.version {
                "HTTP/1.1" => out.extend_from_slice(b"\",\"protocol\":\"HTTP/1.1\",\"status\":"),
                v => {
                    out.extend_from_slice(b"\",\"protocol\":\"");
                    out.extend_from_slice(v.as_bytes());
                    out.extend_from_slice(b"\",\"status\":");
                }
            }
            status(out, r.status);
            out.extend_from_slice(b",\"bytes\":");
            match r.bytes {
                Some(b) => out.extend_from_slice(n.format(b).as_bytes()),
                None => out.extend_from_slice(b"null"),
            }
            out.extend_from_slice(b",\"duration_ms\":");
            millis(out, r.duration);
            out.extend_from_slice(b",\"request_id\":\"");
            // Ids are checked (`request_id::valid`): nothing to escape.
            out.extend_from_slice(r.request_id.as_bytes());
            out.extend_from_slice(b"\",\"identity\":");
            json_opt(out, r.identity.map(str::as_bytes));
            out.extend_from_slice(b",\"rule\":");
            json_opt(out, r.rule.map(str::as_bytes));
            if let Some(t) = r.tier {
                out.extend_from_slice(b",\"tier\":");
                json_opt(out, Some(t.as_bytes()));
            }
            out.extend_from_slice(b",\"key\":");
            json_opt(out, r.key.map(str::as_bytes));
            if let Some(c) = r.consumer {
                out.extend_from_slice(b",\"consumer\":");
                json_opt(out, Some(c.as_bytes()));
            }
            out.extend_from_slice(b",\"referer\":");
            json_opt(out, r.referer);
            out.extend_from_slice(b",\"user_agent\":");
            json_opt(out, r.user_agent);
            if let Some(l) = r.llm {
                out.extend_from_slice(b",\"model\":");
                json_opt(out, l.model.as_deref().map(str::as_bytes));
                for (name, v) in [
                    (&b",\"tokens_in\":"[..], l.tokens_in),
                    (b",\"tokens_out\":", l.tokens_out),
                    (b",\"reserved\":", Some(l.reserved)),
                    (b",\"charged\":", Some(l.charged)),
                ] {
                    out.extend_from_slice(name);
                    match v {
                        Some(v) => out.extend_from_slice(n.format(v).as_bytes()),
                        None => out.extend_from_slice(b"null"),
                    }
                }
            }
            out.push(b'}');
        }
        Format::Combined => {
            // $remote_addr - - [$time_local] "$request" $status
            // $body_bytes_sent "$http_referer" "$http_user_agent", then the
            // request id and the time taken (seconds), as many sites add.
            cache.ip(out, r.peer);
            out.extend_from_slice(b" - - [");
            clf_time(cache, out, r.time);
            out.extend_from_slice(b"] \"");
            clf_str(out, r.method.as_bytes());
            out.push(b' ');
            clf_str(out, r.target);
            out.push(b' ');
            out.extend_from_slice(r.version.as_bytes());
            out.extend_from_slice(b"\" ");
            out.extend_from_slice(n.format(r.status).as_bytes());
            out.push(b' ');
            out.extend_from_slice(n.format(r.bytes.unwrap_or(0)).as_bytes());
            for v in [r.referer, r.user_agent] {
                out.extend_from_slice(b" \"");
                match v {
                    Some(v) => clf_str(out, v),
                    None => out.push(b'-'),
                }
                out.push(b'"');
            }
            out.push(b' ');
            clf_str(out, r.request_id.as_bytes());
            out.push(b' ');
            let ms = r.duration.as_millis();
            let _ = write!(out, "{}.{:03}", ms / 1000, ms % 1000);
        }
    }
    out.push(b'\n');
}

/// A status code: three digits (one from 100 to 999, as every status
/// the gateway answers or forwards is) written without `itoa`.
#[inline]
fn status(out: &mut Vec<u8>, code: u16) {
    if (100..1000).contains(&code) {
        out.extend_from_slice(&[
            b'0' + (code / 100) as u8,
            b'0' + (code / 10 % 10) as u8,
            b'0' + (code % 10) as u8,
        ]);
    } else {
        out.extend_from_slice(itoa::Buffer::new().format(code).as_bytes());
    }
}

/// `d` in milliseconds with three decimals (`1.234`).
fn millis(out: &mut Vec<u8>, d: Duration) {
    let us = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
    let whole = us / 1000;
    // (Most requests take under 10 ms: one digit, no `itoa`.)
    if whole < 10 {
        out.push(b'0' + whole as u8);
    } else {
        out.extend_from_slice(itoa::Buffer::new().format(whole).as_bytes());
    }
    out.push(b'.');
    let frac = (us % 1000) as u16;
    out.extend_from_slice(&[
        b'0' + (frac / 100) as u8,
        b'0' + (frac / 10 % 10) as u8,
        b'0' + (frac % 10) as u8,
    ]);
}

/// Days since 1970-01-01 as (year, month 1-12, day 1-31) (Howard
/// Hinnant's civil-from-days).
fn civil(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

fn parts(d: Wall) -> ((i64, u32, u32), u64, u32) {
    let secs = d.as_secs();
    (
        civil((secs / 86_400) as i64),
        secs % 86_400,
        d.subsec_millis(),
    )
}

/// `2026-11-24T01:02:03.456Z`
fn rfc3339(cache: &mut Cache, out: &mut Vec<u8>, t: Wall) {
    cache.second(out, t, 0, |text, (y, mo, d), s| {
        let _ = write!(
            text,
            "{y:04}-{mo:02}-{d:02}T{:02}:{:02}:{:02}",
            s / 3600,
            s / 60 % 60,
            s % 60
        );
    });
    let ms = t.subsec_millis();
    out.extend_from_slice(&[
        b'.',
        b'0' + (ms / 100) as u8,
        b'0' + (ms / 10 % 10) as u8,
        b'0' + (ms % 10) as u8,
        b'Z',
    ]);
}

/// `24/Nov/2026:01:02:03 +0000` (nginx's `$time_local`, in UTC).
fn clf_time(cache: &mut Cache, out: &mut Vec<u8>, t: Wall) {
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    cache.second(out, t, 1, |text, (y, mo, d), s| {
        let _ = write!(
            text,
            "{d:02}/{}/{y:04}:{:02}:{:02}:{:02} +0000",
            MONTHS[(mo - 1) as usize],
            s / 3600,
            s / 60 % 60,
            s % 60
        );
    });
}

#[cfg(test)]
mod tests;
