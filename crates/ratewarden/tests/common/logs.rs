//! The log lines a test binary's stores wrote, for tests that count them: a
//! process-wide `tracing` subscriber that keeps each event's message and
//! fields as text. Tests running beside each other write here too, so a
//! test picks its own lines out by a field it alone has (a proxy's URL).
//! Included by path, not from `mod.rs`: other binaries include that, and
//! some have no `tracing`.

#![allow(dead_code, unreachable_pub)]

use std::fmt::Write as _;
use std::sync::{Mutex, OnceLock};

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Metadata, Subscriber};

static LINES: Mutex<Vec<String>> = Mutex::new(Vec::new());

struct Keep;

struct Text(String);

impl Visit for Text {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        let _ = write!(self.0, " {}={value:?}", field.name());
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        let _ = write!(self.0, " {}={value}", field.name());
    }
}

impl Subscriber for Keep {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }
    fn record(&self, _: &Id, _: &Record<'_>) {}
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, event: &Event<'_>) {
        let mut text = Text(format!("{}", event.metadata().level()));
        event.record(&mut text);
        LINES.lock().unwrap().push(text.0);
    }
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}

/// Starts keeping the binary's log lines (once; later calls do nothing).
pub fn keep() {
    static ONCE: OnceLock<()> = OnceLock::new();
    ONCE.get_or_init(|| {
        tracing::subscriber::set_global_default(Keep).expect("no other subscriber");
    });
}

/// The lines kept so far that contain every one of `parts`.
pub fn containing(parts: &[&str]) -> Vec<String> {
    LINES
        .lock()
        .unwrap()
        .iter()
        .filter(|l| parts.iter().all(|p| l.contains(p)))
        .cloned()
        .collect()
}
