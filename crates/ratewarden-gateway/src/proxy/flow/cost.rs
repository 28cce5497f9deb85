//! What an answer cost the rules charged by it (`cost: {from: ...}`),
//! read alongside the relay: the meters the end phase's
//! [`Tap`](super::Tap) feeds, built from the rules' specs
//! (`config::cost`) for each request that matched one.

use std::sync::Arc;

use ratewarden_tower::admission::Owed;

use super::tap::{Meter, Read, Tap};
use crate::config::cost::{CostSource, CostSpec};

/// Gives `tap` a meter for each rule in `owed` charged by its answer.
pub(crate) fn meter(tap: &mut Tap, costs: &[Arc<CostSpec>], owed: &[Owed], model: Option<String>) {
    for o in owed.iter().filter(|o| o.reserved.is_some()) {
        let Some(spec) = costs.iter().find(|c| c.rule == o.rule.name()) else {
            continue;
        };
        let m: Box<dyn Meter> = match &spec.source {
            CostSource::Header(name) => Box::new(HeaderMeter {
                name: name.clone(),
                found: None,
            }),
            CostSource::Json(pointer) => Box::new(JsonMeter {
                pointer: pointer.clone(),
                body: Vec::new(),
                over: false,
            }),
            CostSource::Llm(_) => match super::llm::LlmMeter::new(spec.clone(), model.clone()) {
                Some(m) => Box::new(m),
                None => continue,
            },
        };
        tap.meter(o.rule.name(), m);
    }
}

/// A whole number in a header or trailer (the last one seen wins: a
/// trailer corrects the head).
struct HeaderMeter {
    name: String,
    found: Option<Result<u64, ()>>,
}

impl HeaderMeter {
    fn saw(&mut self, name: &str, value: &[u8]) {
        if name.eq_ignore_ascii_case(&self.name) {
            self.found = Some(
                std::str::from_utf8(value)
                    .ok()
                    .and_then(|v| v.trim().parse().ok())
                    .ok_or(()),
            );
        }
    }
}

impl Meter for HeaderMeter {
    fn field(&mut self, name: &str, value: &[u8]) {
        self.saw(name, value);
    }
    fn data(&mut self, _: &[u8]) {}
    fn trailer(&mut self, name: &str, value: &[u8]) {
        self.saw(name, value);
    }
    fn read(&mut self) -> Read {
        match self.found {
            Some(Ok(n)) => Read::Cost(n),
            Some(Err(())) => Read::Missing("not_a_number"),
            None => Read::Missing("no_header"),
        }
    }
}

/// The most of a JSON answer read for its cost: past it, no cost.
const MAX_JSON: usize = 1 << 20;

/// A whole number at a JSON pointer of the answer (kept aside, up to
/// [`MAX_JSON`], as it is relayed).
struct JsonMeter {
    pointer: String,
    body: Vec<u8>,
    over: bool,
}

impl Meter for JsonMeter {
    fn data(&mut self, bytes: &[u8]) {
        if self.over || self.body.len() + bytes.len() > MAX_JSON {
            self.over = true;
            self.body = Vec::new();
            return;
        }
        self.body.extend_from_slice(bytes);
    }
    fn read(&mut self) -> Read {
        if self.over {
            return Read::Missing("too_large");
        }
        let Ok(v) = serde_json::from_slice::<serde_json::Value>(&self.body) else {
            return Read::Missing("not_json");
        };
        match v.pointer(&self.pointer) {
            Some(n) => number(n).map_or(Read::Missing("not_a_number"), Read::Cost),
            None => Read::Missing("no_field"),
        }
    }
}

/// A JSON number as whole units (a fraction rounded up: the safe side).
fn number(v: &serde_json::Value) -> Option<u64> {
    v.as_u64().or_else(|| {
        v.as_f64()
            .filter(|f| *f >= 0.0 && f.is_finite())
            .map(|f| f.ceil() as u64)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_header_meter_reads_the_last_value_head_or_trailer() {
        let mut m = HeaderMeter {
            name: "x-cost".into(),
            found: None,
        };
        assert_eq!(m.read(), Read::Missing("no_header"));
        m.field("x-cost", b" 12 ");
        assert_eq!(m.read(), Read::Cost(12));
        m.trailer("x-cost", b"30");
        assert_eq!(m.read(), Read::Cost(30));
        m.trailer("x-cost", b"lots");
        assert_eq!(m.read(), Read::Missing("not_a_number"));
    }

    #[test]
    fn a_json_meter_reads_its_pointer_across_pieces() {
        let mut m = JsonMeter {
            pointer: "/usage/total_tokens".into(),
            body: vec![],
            over: false,
        };
        m.data(br#"{"usage": {"total_"#);
        m.data(br#"tokens": 41.2}}"#);
        assert_eq!(m.read(), Read::Cost(42));
        let mut m = JsonMeter {
            pointer: "/usage/total_tokens".into(),
            body: vec![],
            over: false,
        };
        m.data(b"not json");
        assert_eq!(m.read(), Read::Missing("not_json"));
    }
}
