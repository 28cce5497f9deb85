//! Configuration errors: located in their file, collected rather than
//! stopping at the first, and phrased with a suggestion where one helps.

use std::cell::RefCell;
use std::fmt;
use std::time::Duration;

use serde_saphyr::Location;

/// A configuration error, located in its file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}:{line}:{column}: `{key}`: {message}")]
pub struct ConfigError {
    /// The file (or `<built-in>`, `--listen`...).
    pub file: String,
    /// 1-based line; 0 when unknown.
    pub line: u64,
    /// 1-based column; 0 when unknown.
    pub column: u64,
    /// The offending key.
    pub key: String,
    /// What is wrong.
    pub message: String,
}

/// Every error found in a configuration, in file order (at least one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigErrors(Vec<ConfigError>);

impl ConfigErrors {
    /// Without the errors that follow from ones the parser reported: on a
    /// line it reported (`reported`, the lines of those errors), or "`key`
    /// is required here" for a key it took out or read another key as
    /// (`mended`). The parser's own errors are kept.
    pub(crate) fn without_followers(mut self, reported: &[u64], mended: &[(u64, String)]) -> Self {
        let mut parser_errors = reported.len();
        self.0.retain(|e| {
            // The parser's errors come first, in the order pushed.
            if parser_errors > 0 && reported.contains(&e.line) {
                parser_errors -= 1;
                return true;
            }
            let on_reported_line = reported.contains(&e.line);
            let required =
                e.message.ends_with("is required here") && mended.iter().any(|(_, k)| *k == e.key);
            !(on_reported_line || required)
        });
        self
    }

    /// The first error.
    pub fn first(&self) -> &ConfigError {
        &self.0[0]
    }

    /// Every error.
    pub fn all(&self) -> &[ConfigError] {
        &self.0
    }
}

impl From<Vec<ConfigError>> for ConfigErrors {
    /// `errors` must not be empty.
    fn from(errors: Vec<ConfigError>) -> Self {
        debug_assert!(!errors.is_empty());
        Self(errors)
    }
}

impl From<ConfigError> for ConfigErrors {
    fn from(e: ConfigError) -> Self {
        Self(vec![e])
    }
}

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigErrors {}

/// Collects the errors of one file while it is validated: each check
/// records what it finds and validation goes on, so `validate` reports
/// every error at once.
pub(crate) struct Diag<'a> {
    pub(crate) file: &'a str,
    errors: RefCell<Vec<ConfigError>>,
}

impl<'a> Diag<'a> {
    pub(crate) fn new(file: &'a str) -> Self {
        Self {
            file,
            errors: RefCell::new(vec![]),
        }
    }

    /// Records an error at `at`.
    pub(crate) fn error(&self, key: &str, at: Option<&Location>, message: impl Into<String>) {
        self.errors.borrow_mut().push(ConfigError {
            file: self.file.to_owned(),
            line: at.map_or(0, |l| l.line()),
            column: at.map_or(0, |l| l.column()),
            key: key.to_owned(),
            message: message.into(),
        });
    }

    /// Whether no error has been recorded so far.
    pub(crate) fn is_clean(&self) -> bool {
        self.errors.borrow().is_empty()
    }

    /// Records an error found in another file (one `rls.config` names).
    pub(crate) fn push(&self, e: ConfigError) {
        self.errors.borrow_mut().push(e);
    }

    /// Records an error from somewhere other than the file (a flag).
    pub(crate) fn error_in(&self, source: &str, key: &str, message: impl Into<String>) {
        self.errors.borrow_mut().push(ConfigError {
            file: source.to_owned(),
            line: 0,
            column: 0,
            key: key.to_owned(),
            message: message.into(),
        });
    }

    /// `r`'s value, or `None` with its error recorded at `at`.
    pub(crate) fn check<T>(
        &self,
        key: &str,
        at: Option<&Location>,
        r: Result<T, String>,
    ) -> Option<T> {
        r.map_err(|m| self.error(key, at, m)).ok()
    }

    /// The value built, or every error, in file order.
    pub(crate) fn finish<T>(self, value: Option<T>) -> Result<T, ConfigErrors> {
        let mut errors = self.errors.into_inner();
        match value {
            Some(v) if errors.is_empty() => Ok(v),
            _ => {
                if errors.is_empty() {
                    errors.push(ConfigError {
                        file: self.file.to_owned(),
                        line: 0,
                        column: 0,
                        key: "(document)".into(),
                        message: "invalid configuration".into(),
                    });
                }
                // Flags first (no line), then by position.
                errors.sort_by_key(|e| (e.line, e.column));
                Err(ConfigErrors(errors))
            }
        }
    }
}

/// Parses a duration with a unit: `500ms`, `3s`, `1.5s`, `5m`, `1h`, `1d`
/// (a decimal fraction is exact, to the nanosecond).
///
/// ```
/// use std::time::Duration;
/// use ratewarden_gateway::config::parse_duration;
/// assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
/// assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
/// assert_eq!(parse_duration("0.25m"), Ok(Duration::from_secs(15)));
/// assert!(parse_duration("5").unwrap_err().contains("no unit"));
/// assert!(parse_duration("1.s").is_err());
/// ```
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .ok_or_else(|| format!("`{s}` has no unit: write e.g. `{s}s` (units: ms, s, m, h, d)"))?;
    let (n, unit) = s.split_at(split);
    let bad = || format!("`{s}` is not a duration like `500ms`, `1.5s`, `5m`, `1h`, `1d`");
    let (whole, fraction) = match n.split_once('.') {
        Some((w, f)) if !f.is_empty() && f.len() <= 9 => (w, f),
        Some(_) => return Err(bad()),
        None => (n, ""),
    };
    if whole.is_empty() {
        return Err(bad());
    }
    let whole: u128 = whole.parse().map_err(|_| bad())?;
    let frac: u128 = if fraction.is_empty() {
        0
    } else {
        fraction.parse().map_err(|_| bad())?
    };
    let unit_ns: u128 = match unit {
        "ms" => 1_000_000,
        "s" => 1_000_000_000,
        "m" => 60_000_000_000,
        "h" => 3_600_000_000_000,
        "d" => 86_400_000_000_000,
        _ => {
            return Err(format!(
                "`{s}`: unknown unit `{unit}` (units: ms, s, m, h, d)"
            ));
        }
    };
    let scale = 10u128.pow(fraction.len() as u32);
    let ns = whole
        .checked_mul(unit_ns)
        .and_then(|w| w.checked_add(frac * unit_ns / scale))
        .filter(|ns| *ns <= u128::from(u64::MAX) * 1_000_000_000)
        .ok_or_else(|| format!("`{s}` is too long"))?;
    Ok(Duration::new(
        (ns / 1_000_000_000) as u64,
        (ns % 1_000_000_000) as u32,
    ))
}

/// The closest of `candidates` to `word`, if reasonably close.
pub fn suggest<'a>(word: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    fn distance(a: &str, b: &str) -> usize {
        let b: Vec<char> = b.chars().collect();
        let mut row: Vec<usize> = (0..=b.len()).collect();
        for (i, ca) in a.chars().enumerate() {
            let mut prev = row[0];
            row[0] = i + 1;
            for (j, &cb) in b.iter().enumerate() {
                let cur = row[j + 1];
                row[j + 1] = (prev + usize::from(ca != cb)).min(row[j] + 1).min(cur + 1);
                prev = cur;
            }
        }
        row[b.len()]
    }
    candidates
        .into_iter()
        .map(|c| (distance(word, c), c))
        .filter(|(d, c)| *d <= (c.len() / 3).max(2))
        .min()
        .map(|(_, c)| c)
}

/// The key written on line `line` (1-based) of `text`, if the line is a
/// `key: value` or `- key: value` entry.
/// The key on `line` (1-based) of `text`, owned.
pub(crate) fn key_at(text: &str, line: u64) -> Option<String> {
    key_on_line(text, line).map(str::to_owned)
}

fn key_on_line(text: &str, line: u64) -> Option<&str> {
    let l = text
        .lines()
        .nth(usize::try_from(line).ok()?.checked_sub(1)?)?;
    let l = l.trim_start().trim_start_matches("- ").trim_start();
    let (key, _) = l.split_once(':')?;
    let ok = !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
    ok.then_some(key)
}

/// The value written at `line`:`column` (1-based), to the end of its line,
/// without a trailing comment: what a type error is about.
fn value_at(text: &str, line: u64, column: u64) -> String {
    let Some(l) = usize::try_from(line)
        .ok()
        .and_then(|n| n.checked_sub(1))
        .and_then(|n| text.lines().nth(n))
    else {
        return String::new();
    };
    let from = usize::try_from(column).map_or(0, |c| c.saturating_sub(1));
    let v = l.get(from..scalar_end(l, from)).unwrap_or(l);
    let v = v.split(" #").next().unwrap_or(v).trim();
    v.chars().take(80).collect()
}

/// Where the value that starts at byte `from` of `line` ends: inside a
/// flow collection (`{a: 1, b: 2}`, `[x, y]`), at the `,`, `}` or `]`
/// that closes it (brackets and quotes inside it skipped); else at the
/// line's end.
pub(crate) fn scalar_end(line: &str, from: usize) -> usize {
    // One pass over the line: the brackets open at `from` (outside quotes)
    // say whether the value is in a flow collection; past it, the first
    // `,` at that depth, or a bracket closing it, ends the value.
    let (mut depth, mut quote, mut at_from) = (0i32, None::<u8>, None::<i32>);
    for (i, &b) in line.as_bytes().iter().enumerate() {
        if i == from {
            if depth <= 0 {
                return line.len();
            }
            at_from = Some(depth);
        }
        match (quote, b) {
            (Some(q), b) if b == q => quote = None,
            (Some(_), _) => {}
            (None, b'"' | b'\'') => quote = Some(b),
            (None, b'{' | b'[') => depth += 1,
            (None, b'}' | b']') => {
                if at_from == Some(depth) {
                    return i;
                }
                depth -= 1;
            }
            (None, b',') if at_from == Some(depth) => return i,
            _ => {}
        }
    }
    line.len()
}

/// The key written at `line`:`column` (1-based), when the text there is
/// `key:` (a key inside a flow mapping, which [`key_on_line`] does not
/// see).
fn key_at_column(text: &str, line: u64, column: u64) -> Option<&str> {
    let l = text
        .lines()
        .nth(usize::try_from(line).ok()?.checked_sub(1)?)?;
    let rest = l.get(usize::try_from(column).ok()?.checked_sub(1)?..)?;
    let (key, _) = rest.split_once(':')?;
    let ok = !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-'));
    ok.then_some(key)
}

/// What `penalty:` takes, and the nearest key where a mapping misspelt one.
fn penalty_hint(written: &str) -> String {
    const KEYS: [&str; 4] = ["duration", "multiplier", "max", "memory"];
    let what = "a duration (`10m`) or {duration, multiplier, max, memory}";
    if written.chars().all(|c| c.is_ascii_digit()) && !written.is_empty() {
        return format!("{what}; a duration needs a unit: `{written}s`?");
    }
    let inner = written.trim_start_matches('{').trim_end_matches('}');
    for part in inner.split(',') {
        let Some((k, _)) = part.split_once(':') else {
            continue;
        };
        let k = k.trim();
        if !k.is_empty() && !KEYS.contains(&k) {
            return match suggest(k, KEYS) {
                Some(s) => format!("{what}; unknown key `{k}`, did you mean `{s}`?"),
                None => format!("{what}; unknown key `{k}`"),
            };
        }
    }
    what.to_owned()
}

/// Turns a serde-saphyr error into ours: with a suggestion for unknown
/// keys, and the key at fault read from the line for type errors.
pub(crate) fn parse_error(file: &str, text: &str, e: &serde_saphyr::Error) -> ConfigError {
    let mut err = parse_error_at(file, text, e);
    // Inside a flow mapping the line's first key is not the one at fault:
    // the one written where the parser stopped is.
    if err.line > 0
        && err.message.starts_with("expected ")
        && let Some(k) = key_at_column(text, err.line, err.column)
    {
        err.key = k.to_owned();
    }
    // An error our own visitors raise is placed at the key: where its
    // value starts is what is written, and what a mend replaces.
    if err.line > 0
        && err.message.starts_with("expected ")
        && let Some(l) = text.lines().nth(err.line as usize - 1)
        && let Some(rest) = l.get(err.column.saturating_sub(1) as usize..)
        && let Some(value) = rest
            .strip_prefix(err.key.as_str())
            .and_then(|r| r.strip_prefix(':'))
    {
        let skip = err.key.len() + 1 + (value.len() - value.trim_start().len());
        err.column += skip as u64;
        if let Some(at) = err.message.find(&format!("got `{}:", err.key)) {
            let written = value_at(text, err.line, err.column);
            err.message = format!("{}got `{written}`", &err.message[..at]);
        }
    }
    err
}

fn parse_error_at(file: &str, text: &str, e: &serde_saphyr::Error) -> ConfigError {
    let loc = e.location();
    let rendered = e.to_string();
    // The first line is the message ("error: line L column C: ..."); the rest
    // is a rendered snippet, which our own `file:line:column` replaces.
    let first = rendered.lines().next().unwrap_or("invalid YAML");
    let first = first.strip_prefix("error: ").unwrap_or(first);
    let first = match first.split_once(": ") {
        Some((pos, rest)) if pos.starts_with("line ") => rest,
        _ => first,
    };
    let mut message = first.to_owned();
    let mut key = loc
        .and_then(|l| key_on_line(text, l.line()))
        .unwrap_or("(document)")
        .to_owned();
    if let Some(rest) = first.strip_prefix("unknown field `") {
        let (unknown, tail) = rest.split_once('`').unwrap_or((rest, ""));
        let expected: Vec<&str> = tail
            .trim_start_matches(", expected one of ")
            .trim_start_matches(", expected ")
            .split(", ")
            .map(|k| k.trim_matches('`'))
            .filter(|k| !k.is_empty())
            .collect();
        message = match suggest(unknown, expected.iter().copied()) {
            _ if unknown.is_empty() => format!(
                "an empty key is not valid; valid keys here: {}",
                expected.join(", ")
            ),
            Some(s) => format!("unknown key `{unknown}`; did you mean `{s}`?"),
            None => format!(
                "unknown key `{unknown}`; valid keys here: {}",
                expected.join(", ")
            ),
        };
        key = unknown.to_owned();
    } else if let Some(rest) = first.strip_prefix("missing field `") {
        key = rest.split('`').next().unwrap_or_default().to_owned();
        message = format!("`{key}` is required here");
    } else if let Some(l) = loc {
        // A value of the wrong type: say what was expected and what was
        // written, in words, not serde's.
        let written = value_at(text, l.line(), l.column());
        // Our own visitors say what they expect in words already
        // (`limit`, `cost`, `reserve`, `count`): kept, after `expected`.
        let own = first
            .strip_prefix("invalid type: ")
            .and_then(|t| t.split_once(", expected "))
            .map(|(_, e)| e)
            .filter(|e| {
                e.starts_with("a whole number")
                    || e.starts_with("true or false")
                    || e.starts_with("`input`")
            });
        let expected = if let Some(e) = own {
            Some(e.to_owned())
        } else if first.starts_with("invalid i64")
            || first.starts_with("invalid u64")
            || first.starts_with("invalid u32")
            || first.contains("expected i64")
            || first.contains("expected u32")
            || first.contains("expected u64")
        {
            Some("a whole number".to_owned())
        } else if first.contains("expected a boolean") || first.contains("invalid bool") {
            Some("`true` or `false`".to_owned())
        } else if first.contains("untagged enum PenaltyFile") {
            Some(penalty_hint(&written))
        } else if first.contains("untagged enum RouteUpstreamFile") {
            Some("a URL, or {servers, balance, health}".to_owned())
        } else if first.contains("expected a sequence") {
            Some("a list (`[a, b]`)".to_owned())
        } else if first.contains("expected a string") {
            Some("a string".to_owned())
        } else {
            None
        };
        if let Some(expected) = expected {
            // A hint after `;` goes after what was written.
            let (expected, hint) = match expected.split_once("; ") {
                Some((e, h)) => (e.to_owned(), format!(": {h}")),
                None => (expected, String::new()),
            };
            message = if written.is_empty() {
                format!("expected {expected}{hint}")
            } else {
                format!("expected {expected}, got `{written}`{hint}")
            };
        }
    }
    // A YAML key can be empty (`"": 1`, or a tag alone); every error still
    // names something the reader can find.
    if key.is_empty() {
        key = "(empty key)".to_owned();
    }
    if message.is_empty() {
        message = "invalid YAML".to_owned();
    }
    ConfigError {
        file: file.to_owned(),
        line: loc.map_or(0, |l| l.line()),
        column: loc.map_or(0, |l| l.column()),
        key,
        message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flow_value_ends_at_its_comma_or_bracket() {
        fn end<'l>(line: &'l str, at: &str) -> &'l str {
            let from = line.find(at).unwrap();
            &line[from..scalar_end(line, from)]
        }
        let l = "  - {name: g, limit: 10/min, window: 1m}";
        assert_eq!(end(l, "10/min"), "10/min");
        assert_eq!(end(l, "1m}"), "1m");
        let nested = "key: {a: [1, 2], b: 'x, }', c: 3}";
        assert_eq!(end(nested, "[1"), "[1, 2]");
        assert_eq!(end(nested, "'x"), "'x, }'");
        // Outside a flow collection: the line's end.
        assert_eq!(
            end("limit: 10/min # per minute", "10"),
            "10/min # per minute"
        );
    }

    #[test]
    fn the_key_of_a_line_is_found() {
        let text = "a: 1\nrules:\n  - name: r\n    limit: x\n  # comment\n";
        assert_eq!(key_on_line(text, 1), Some("a"));
        assert_eq!(key_on_line(text, 3), Some("name"));
        assert_eq!(key_on_line(text, 4), Some("limit"));
        assert_eq!(key_on_line(text, 5), None);
        assert_eq!(key_on_line(text, 9), None);
    }
}
