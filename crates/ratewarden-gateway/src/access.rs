//! The access log (`access_log:`): one line per answered request, admitted
//! or refused, as JSON or in nginx's `combined` format.
//!
//! A request never waits for it: the request thread hands a [`Record`] to
//! a bounded channel and goes on; a thread of its own formats and writes.
//! When the channel is full (the disk or the terminal cannot keep up), the
//! record is dropped and counted (`ratewarden_access_log_dropped_total`).

use std::fmt::Write as _;
use std::io::Write as _;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::request_id::RequestId;

/// Records waiting to be written, at most.
const QUEUE: usize = 16 * 1024;

/// How lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// One JSON object per line.
    Json,
    /// nginx's `combined`, with the request id and time appended.
    Combined,
}

/// Where lines go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Sink {
    /// Standard output (beside the log, when that goes there too).
    Stdout,
    /// A file, appended to.
    File(PathBuf),
}

/// `access_log:` as configured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spec {
    /// Where.
    pub sink: Sink,
    /// How.
    pub format: Format,
}

/// One answered request.
#[derive(Debug, Clone)]
pub struct Record {
    /// When the request arrived.
    pub time: SystemTime,
    /// The peer's address.
    pub peer: IpAddr,
    /// `GET`, ...
    pub method: http::Method,
    /// The target as the client sent it.
    pub target: String,
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
    pub request_id: RequestId,
    /// Who the rules saw (the identity), if any rule looked.
    pub identity: Option<String>,
    /// The rule that refused it, if one did.
    pub rule: Option<String>,
    /// `Referer`, for `combined`.
    pub referer: Option<String>,
    /// `User-Agent`, for `combined`.
    pub user_agent: Option<String>,
}

/// The running access log. Cheap to clone.
#[derive(Clone)]
pub struct AccessLog {
    tx: SyncSender<Record>,
    dropped: Arc<AtomicU64>,
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
        let (tx, rx) = std::sync::mpsc::sync_channel(QUEUE);
        let format = spec.format;
        std::thread::Builder::new()
            .name("access-log".into())
            .spawn(move || write_all(rx, out, format))?;
        Ok(Self {
            tx,
            dropped: Arc::new(AtomicU64::new(0)),
        })
    }

    /// Hands `r` to the writer; never waits. A full queue drops it.
    pub fn log(&self, r: Record) {
        match self.tx.try_send(r) {
            Ok(()) => {}
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                self.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Records dropped so far.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

/// The writer: lines in batches, flushed when the queue runs dry.
fn write_all(rx: Receiver<Record>, out: Box<dyn std::io::Write + Send>, format: Format) {
    let mut out = std::io::BufWriter::with_capacity(64 * 1024, out);
    let mut line = String::with_capacity(512);
    while let Ok(first) = rx.recv() {
        let mut next = Some(first);
        while let Some(r) = next {
            line.clear();
            render(&mut line, &r, format);
            if out.write_all(line.as_bytes()).is_err() {
                return;
            }
            next = rx.try_recv().ok();
        }
        if out.flush().is_err() {
            return;
        }
    }
}

/// One line, with its newline.
pub fn render(line: &mut String, r: &Record, format: Format) {
    match format {
        Format::Json => {
            let v = serde_json::json!({
                "time": rfc3339(r.time),
                "remote_addr": r.peer.to_string(),
                "method": r.method.as_str(),
                "target": r.target,
                "protocol": r.version,
                "status": r.status,
                "bytes": r.bytes,
                "duration_ms": (r.duration.as_secs_f64() * 1e6).round() / 1e3,
                "request_id": r.request_id.as_str(),
                "identity": r.identity,
                "rule": r.rule,
                "referer": r.referer,
                "user_agent": r.user_agent,
            });
            let _ = write!(line, "{v}");
        }
        Format::Combined => {
            // $remote_addr - - [$time_local] "$request" $status
            // $body_bytes_sent "$http_referer" "$http_user_agent", then the
            // request id and the time taken (seconds), as many sites add.
            let quoted = |s: Option<&str>| -> String {
                match s {
                    Some(s) => s.replace('\\', "\\\\").replace('"', "\\\""),
                    None => "-".into(),
                }
            };
            let _ = write!(
                line,
                "{} - - [{}] \"{} {} {}\" {} {} \"{}\" \"{}\" {} {:.3}",
                r.peer,
                clf_time(r.time),
                r.method,
                quoted(Some(&r.target)),
                r.version,
                r.status,
                r.bytes.unwrap_or(0),
                quoted(r.referer.as_deref()),
                quoted(r.user_agent.as_deref()),
                r.request_id,
                r.duration.as_secs_f64(),
            );
        }
    }
    line.push('\n');
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

fn parts(t: SystemTime) -> ((i64, u32, u32), u64, u32) {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs();
    (
        civil((secs / 86_400) as i64),
        secs % 86_400,
        d.subsec_millis(),
    )
}

/// `2026-11-24T01:02:03.456Z`
fn rfc3339(t: SystemTime) -> String {
    let ((y, mo, d), s, ms) = parts(t);
    format!(
        "{y:04}-{mo:02}-{d:02}T{:02}:{:02}:{:02}.{ms:03}Z",
        s / 3600,
        s / 60 % 60,
        s % 60
    )
}

/// `24/Nov/2026:01:02:03 +0000` (nginx's `$time_local`, in UTC).
fn clf_time(t: SystemTime) -> String {
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let ((y, mo, d), s, _) = parts(t);
    format!(
        "{d:02}/{}/{y:04}:{:02}:{:02}:{:02} +0000",
        MONTHS[(mo - 1) as usize],
        s / 3600,
        s / 60 % 60,
        s % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record() -> Record {
        Record {
            time: UNIX_EPOCH + Duration::from_millis(1_795_482_123_456),
            peer: "203.0.113.7".parse().unwrap(),
            method: http::Method::POST,
            target: "/api/\"x\"?q=1".into(),
            version: "HTTP/1.1",
            status: 429,
            bytes: Some(251),
            duration: Duration::from_micros(1234),
            request_id: RequestId::keep_or_make(Some(b"abc-1")),
            identity: Some("203.0.113.7".into()),
            rule: Some("per-ip".into()),
            referer: None,
            user_agent: Some("curl/8".into()),
        }
    }

    #[test]
    fn json_lines_parse_and_carry_every_field() {
        let mut line = String::new();
        render(&mut line, &record(), Format::Json);
        assert!(line.ends_with('\n'));
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["time"], "2026-11-24T01:02:03.456Z");
        assert_eq!(v["status"], 429);
        assert_eq!(v["target"], "/api/\"x\"?q=1");
        assert_eq!(v["request_id"], "abc-1");
        assert_eq!(v["rule"], "per-ip");
        assert_eq!(v["duration_ms"], 1.234);
        assert_eq!(v["referer"], serde_json::Value::Null);
    }

    #[test]
    fn combined_lines_read_as_nginx_writes_them() {
        let mut line = String::new();
        render(&mut line, &record(), Format::Combined);
        assert_eq!(
            line,
            "203.0.113.7 - - [24/Nov/2026:01:02:03 +0000] \"POST /api/\\\"x\\\"?q=1 HTTP/1.1\" 429 251 \"-\" \"curl/8\" abc-1 0.001\n"
        );
    }

    #[test]
    fn a_full_queue_drops_and_counts_instead_of_waiting() {
        // A writer that never drains: a sink blocked forever.
        let (tx, _rx) = std::sync::mpsc::sync_channel(2);
        let log = AccessLog {
            tx,
            dropped: Arc::new(AtomicU64::new(0)),
        };
        for _ in 0..5 {
            log.log(record());
        }
        assert_eq!(log.dropped(), 3);
    }
}
