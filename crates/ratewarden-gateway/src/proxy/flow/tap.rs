//! The end phase's view of an answer's body as it goes by: the bytes the
//! client was sent, and, where a rule charges what the answer cost, a
//! [`Meter`] reading that cost (an LLM's usage, a cost header or trailer,
//! a JSON field) alongside the relay. Nothing is held back to read it: a
//! meter sees each piece after it was handed on.

/// What reads an answer's cost as it goes by. Each wire feeds it the same
/// way: the head's fields, then the body's bytes (decoded: chunked framing
/// taken off), then the trailers; [`Meter::read`] once the answer ended.
pub(crate) trait Meter: Send + Sync {
    /// A field of the answer's head (its name in any case: HTTP/1.1's as
    /// sent, HTTP/2's lowercase).
    fn field(&mut self, _name: &str, _value: &[u8]) {}
    /// The next bytes of the body.
    fn data(&mut self, bytes: &[u8]);
    /// A trailer field (its name in any case).
    fn trailer(&mut self, _name: &str, _value: &[u8]) {}
    /// What the answer cost, read from all it was fed.
    fn read(&mut self) -> Read;
    /// The tokens an LLM's answer reported, once read (for the metrics).
    fn tokens(&self) -> Option<Tokens> {
        None
    }
    /// The model an LLM's answer (else its request) named.
    fn model(&self) -> Option<&str> {
        None
    }
}

/// What one meter read of an answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Metered {
    /// The rule it reads for.
    pub(crate) rule: String,
    pub(crate) read: Read,
    pub(crate) tokens: Option<Tokens>,
    pub(crate) model: Option<String>,
}

/// Tokens an LLM's answer used, as its meter read them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Tokens {
    /// Whose shape the usage came in (`openai`, `anthropic`...).
    pub(crate) dialect: &'static str,
    /// Input tokens not read from a cache.
    pub(crate) input: u64,
    /// Input tokens read from a cache.
    pub(crate) cached: u64,
    /// Output tokens.
    pub(crate) output: u64,
}

/// What a [`Meter`] read of an answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Read {
    /// It cost this many units (the rule's: tokens, millionths of a
    /// currency, whatever the cost source counts).
    Cost(u64),
    /// No cost could be read: why (`no_usage`, `not_the_dialect`, ...).
    Missing(&'static str),
}

/// An answer's body, as the end phase sees it.
#[derive(Default)]
pub(crate) struct Tap {
    /// Body bytes handed on to the client.
    pub(crate) bytes: u64,
    /// Each rule charged by the answer, with what reads its cost (most
    /// requests: none).
    meters: Vec<(String, Box<dyn Meter>)>,
}

impl std::fmt::Debug for Tap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tap")
            .field("bytes", &self.bytes)
            .field("meters", &self.meters.len())
            .finish()
    }
}

impl Tap {
    /// Reads the cost of the answer to `rule` with `meter` too.
    pub(crate) fn meter(&mut self, rule: &str, meter: Box<dyn Meter>) {
        self.meters.push((rule.to_owned(), meter));
    }

    /// Whether a meter reads the body (else only bytes are counted, and a
    /// wire need not decode what it relays).
    #[inline]
    pub(crate) fn reads(&self) -> bool {
        !self.meters.is_empty()
    }

    /// A field of the answer's head.
    pub(crate) fn field(&mut self, name: &str, value: &[u8]) {
        for (_, m) in &mut self.meters {
            m.field(name, value);
        }
    }

    /// `bytes` of the body were handed on.
    #[inline]
    pub(crate) fn data(&mut self, bytes: &[u8]) {
        self.bytes += bytes.len() as u64;
        self.meter_data(bytes);
    }

    /// `n` bytes of the body were handed on (counted apart from what the
    /// meters are fed: a chunked body's framing).
    #[inline]
    pub(crate) fn counted(&mut self, n: usize) {
        self.bytes += n as u64;
    }

    /// Body bytes for the meters alone (counted by [`Tap::counted`]).
    #[inline]
    pub(crate) fn meter_data(&mut self, bytes: &[u8]) {
        for (_, m) in &mut self.meters {
            m.data(bytes);
        }
    }

    /// A trailer field.
    pub(crate) fn trailer(&mut self, name: &str, value: &[u8]) {
        for (_, m) in &mut self.meters {
            m.trailer(name, value);
        }
    }

    /// What each meter read, by rule, and the tokens it saw.
    pub(crate) fn read(&mut self) -> Vec<Metered> {
        self.meters
            .iter_mut()
            .map(|(rule, m)| {
                let read = m.read();
                Metered {
                    rule: std::mem::take(rule),
                    read,
                    tokens: m.tokens(),
                    model: m.model().map(str::to_owned),
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A meter that sums the digits it is fed.
    struct Digits(u64);

    impl Meter for Digits {
        fn data(&mut self, bytes: &[u8]) {
            self.0 += bytes
                .iter()
                .filter(|b| b.is_ascii_digit())
                .map(|b| u64::from(b - b'0'))
                .sum::<u64>();
        }
        fn read(&mut self) -> Read {
            Read::Cost(self.0)
        }
    }

    #[test]
    fn a_tap_counts_bytes_and_feeds_its_meters() {
        let mut plain = Tap::default();
        plain.data(b"12");
        plain.counted(3);
        assert_eq!((plain.bytes, plain.read()), (5, vec![]));
        let mut metered = Tap::default();
        metered.meter("r", Box::new(Digits(0)));
        assert!(metered.reads());
        metered.data(b"a1b2");
        metered.data(b"3");
        assert_eq!(
            (metered.bytes, metered.read()),
            (
                5,
                vec![Metered {
                    rule: "r".to_owned(),
                    read: Read::Cost(6),
                    tokens: None,
                    model: None
                }]
            )
        );
    }
}
