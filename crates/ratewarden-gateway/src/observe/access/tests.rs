use super::*;

fn record() -> Record<'static> {
    let id = Box::leak(Box::new(RequestId::keep_or_make(
        Some(b"abc-1"),
        quanta::Instant::now(),
    )));
    Record {
        time: Duration::from_millis(1_795_482_123_456),
        peer: "203.0.113.7".parse().unwrap(),
        method: "POST",
        target: b"/api/\"x\"?q=1",
        version: "HTTP/1.1",
        status: 429,
        bytes: Some(251),
        duration: Duration::from_micros(1234),
        request_id: id,
        identity: Some("203.0.113.7"),
        key: None,
        consumer: None,
        rule: Some("per-ip"),
        tier: None,
        referer: None,
        user_agent: Some(b"curl/8"),
        llm: None,
    }
}

fn line(r: &Record<'_>, format: Format) -> String {
    line_in(&mut Cache::new(), r, format)
}

/// A line rendered with `cache`, as a thread renders its lines.
fn line_in(cache: &mut Cache, r: &Record<'_>, format: Format) -> String {
    let mut out = Vec::new();
    render(cache, &mut out, r, format);
    String::from_utf8(out).unwrap()
}

#[test]
fn json_lines_parse_and_carry_every_field() {
    let line = line(&record(), Format::Json);
    assert!(line.ends_with('\n'));
    let v: serde_json::Value = serde_json::from_str(&line).unwrap();
    assert_eq!(v["time"], "2026-11-24T01:02:03.456Z");
    assert_eq!(v["remote_addr"], "203.0.113.7");
    assert_eq!(v["method"], "POST");
    assert_eq!(v["target"], "/api/\"x\"?q=1");
    assert_eq!(v["protocol"], "HTTP/1.1");
    assert_eq!(v["status"], 429);
    assert_eq!(v["bytes"], 251);
    assert_eq!(v["request_id"], "abc-1");
    assert_eq!(v["identity"], "203.0.113.7");
    assert_eq!(v["rule"], "per-ip");
    assert_eq!(v["duration_ms"], 1.234);
    assert_eq!(v["referer"], serde_json::Value::Null);
    assert_eq!(v["user_agent"], "curl/8");
}

#[test]
fn hostile_header_bytes_stay_one_valid_json_line() {
    let mut r = record();
    r.user_agent = Some(b"a\"b\\c\nd\x01\xff\x7fe");
    r.referer = Some(b"\r\t");
    r.bytes = None;
    r.duration = Duration::from_micros(12_000_007);
    let line = line(&r, Format::Json);
    assert_eq!(line.matches('\n').count(), 1, "{line}");
    let v: serde_json::Value = serde_json::from_str(&line).unwrap();
    assert_eq!(v["user_agent"], "a\"b\\c\nd\u{1}\u{fffd}\u{7f}e");
    assert_eq!(v["referer"], "\r\t");
    assert_eq!(v["bytes"], serde_json::Value::Null);
    assert_eq!(v["duration_ms"], 12000.007);
}

#[test]
fn plain_means_nothing_to_escape_at_every_byte_and_position() {
    for b in 0..=255u8 {
        let want = (0x20..0x7f).contains(&b) && b != b'"' && b != b'\\';
        for at in 0..17 {
            let mut s = vec![b'a'; 17];
            s[at] = b;
            assert_eq!(plain(&s), want, "byte {b:#x} at {at}");
            assert_eq!(plain(&s[..at + 1]), want, "byte {b:#x} ending {at}");
        }
    }
    assert!(plain(b""));
}

#[test]
fn addresses_read_as_display_writes_them() {
    for a in [
        "0.0.0.0",
        "255.255.255.255",
        "10.0.200.7",
        "2001:db8::1",
        "::ffff:1.2.3.4",
    ] {
        // Twice: rendered, then from the cache.
        let mut cache = Cache::new();
        for _ in 0..2 {
            let mut out = Vec::new();
            cache.ip(&mut out, a.parse().unwrap());
            assert_eq!(String::from_utf8(out).unwrap(), a);
        }
    }
}

#[test]
fn combined_lines_read_as_nginx_writes_them() {
    assert_eq!(
        line(&record(), Format::Combined),
        "203.0.113.7 - - [24/Nov/2026:01:02:03 +0000] \"POST /api/\\\"x\\\"?q=1 HTTP/1.1\" 429 251 \"-\" \"curl/8\" abc-1 0.001\n"
    );
    let mut r = record();
    r.user_agent = Some(b"x\ny\xff");
    assert!(line(&r, Format::Combined).contains("\"x\\x0Ay\\xFF\""));
}

#[test]
fn statuses_are_their_decimal_digits() {
    for code in [0, 7, 99, 200, 429, 999, 1000, u16::MAX] {
        let mut r = record();
        r.status = code;
        let v: serde_json::Value = serde_json::from_str(&line(&r, Format::Json)).unwrap();
        assert_eq!(v["status"], code, "{code}");
    }
}

#[test]
fn the_cached_second_follows_the_clock() {
    let mut cache = Cache::new();
    let mut r = record();
    let a = line_in(&mut cache, &r, Format::Json);
    // Within the second, only the milliseconds move.
    r.time += Duration::from_millis(321);
    assert!(line_in(&mut cache, &r, Format::Json).contains("\"2026-11-24T01:02:03.777Z\""));
    r.time -= Duration::from_millis(321);
    r.time += Duration::from_millis(1_000);
    let b = line_in(&mut cache, &r, Format::Json);
    assert!(
        a.contains("01:02:03.456Z") && b.contains("01:02:04.456Z"),
        "{a}{b}"
    );
    r.time += Duration::from_secs(86_400);
    assert!(line_in(&mut cache, &r, Format::Combined).contains("[25/Nov/2026:01:02:04 +0000]"));
}

#[test]
fn a_full_buffer_drops_and_counts_instead_of_waiting() {
    // No writer: nothing is ever taken from the buffer.
    let log = AccessLog::unstarted(Format::Json);
    let one = line(&record(), Format::Json).len();
    let fit = CAPACITY / one;
    for _ in 0..fit + 5 {
        log.log(&record());
    }
    assert_eq!(log.dropped(), 5);
    let threads = log.shared.threads.lock().unwrap();
    assert_eq!(threads.len(), 1);
    assert_eq!(threads[0].main.lock().unwrap().len(), fit * one);
}

#[test]
fn lines_made_while_the_writer_holds_the_buffer_go_to_the_spill_buffer() {
    let log = AccessLog::unstarted(Format::Json);
    log.log(&record());
    let one = line(&record(), Format::Json).len();
    let lines = Arc::clone(&log.shared.threads.lock().unwrap()[0]);
    {
        // As the writer holds it while it writes it out.
        let main = lines.main.lock().unwrap();
        log.log(&record());
        log.log(&record());
        assert_eq!(main.len(), one);
    }
    assert_eq!(lines.spill.lock().unwrap().len(), 2 * one);
    log.log(&record());
    assert_eq!(lines.main.lock().unwrap().len(), 2 * one);
    assert_eq!(log.dropped(), 0);
}

/// A sink that keeps what is written and, while its first write is
/// under way, logs one more line from the writing thread (as a
/// request thread would while the writer holds its buffer).
struct Meanwhile {
    log: AccessLog,
    written: Arc<Mutex<Vec<u8>>>,
    logged: bool,
}

impl std::io::Write for Meanwhile {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.written.lock().unwrap().extend_from_slice(buf);
        if !self.logged {
            self.logged = true;
            let mut r = record();
            r.target = b"/3";
            self.log.log(&r);
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn lines_made_while_the_writer_writes_follow_its_lines() {
    let log = AccessLog::unstarted(Format::Json);
    for target in [b"/1", b"/2"] {
        let mut r = record();
        r.target = target;
        log.log(&r);
    }
    let written = Arc::new(Mutex::new(Vec::new()));
    *log.shared.due.lock().unwrap() = true;
    // One round, on this thread: the thread whose buffer is written.
    let out = Meanwhile {
        log: log.clone(),
        written: Arc::clone(&written),
        logged: false,
    };
    write_all(&log.shared, || true, Box::new(out));
    let written = String::from_utf8(written.lock().unwrap().clone()).unwrap();
    let targets: Vec<String> = written
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["target"].to_string())
        .collect();
    assert_eq!(targets, ["\"/1\"", "\"/2\"", "\"/3\""]);
    assert_eq!(log.dropped(), 0);
}

#[test]
fn the_writer_writes_every_line_and_the_last_ones_when_dropped() {
    let dir = std::env::temp_dir().join(format!("rw-access-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("access.log");
    let log = AccessLog::start(&Spec {
        sink: Sink::File(path.clone()),
        format: Format::Combined,
    })
    .unwrap();
    // From four threads, each with its own buffer; the last handle
    // dropped while the threads' buffers still hold lines.
    std::thread::scope(|s| {
        for _ in 0..4 {
            let log = log.clone();
            s.spawn(move || {
                for _ in 0..250 {
                    log.log(&record());
                }
            });
        }
    });
    drop(log);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let text = std::fs::read_to_string(&path).unwrap();
        if text.lines().count() == 1000 {
            assert!(text.lines().all(|l| l.starts_with("203.0.113.7 - - [")));
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{} lines",
            text.lines().count()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
