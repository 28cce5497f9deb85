//! The gateway's configuration: parse the YAML (keeping every value's line
//! and column), then validate it into a [`Config`] ready to run, reporting
//! every error found. One validator serves `serve`, `validate` and reload.
//!
//! * [`schema`]: the file as written (serde, unknown keys refused);
//! * [`model`]: the validated configuration;
//! * [`validate`]: from one to the other;
//! * [`diag`]: errors with file, line, column and key;
//! * [`compat`]: the Go gateway's format of seed 002 (root key
//!   `rateLimiter:`), translated;
//! * [`tls`]: the TLS sections, their files read and checked;
//! * [`rls`]: Envoy's rate limit descriptors (`rls:`), their files read and
//!   their tree built;
//! * [`env`]: `${VAR}` from the environment, before parsing.

mod compat;
pub mod cost;
mod diag;
mod env;
mod model;
pub(crate) mod rls;
mod schema;
mod tls;
mod validate;

pub use diag::{ConfigError, ConfigErrors, parse_duration, suggest};
pub use model::*;
pub use validate::{BODY_TIMEOUT, HEADER_TIMEOUT, MAX_BODY_SIZE, parse_size};
pub(crate) use validate::{consumer_name, distribution};

use diag::{Diag, parse_error};

/// `log.level` (and `RUST_LOG`) as a filter: a level (`error`, `warn`,
/// `info`, `debug`, `trace`, `off`), or comma-separated `target=level`
/// directives with an optional bare default level, as in
/// `warn,ratewarden_gateway=debug`. tracing-subscriber's `Targets`, not
/// its `EnvFilter`: the span and field directives that only `EnvFilter`
/// reads would build regular-expression DFAs into every release build
/// (issue 38, the build).
pub fn log_filter(spec: &str) -> Result<tracing_subscriber::filter::Targets, String> {
    let targets: tracing_subscriber::filter::Targets =
        spec.trim().parse().map_err(|e| format!("{e}"))?;
    // The Redis client's own warnings (a line per request while a cluster
    // node is away: 18,000 in the 10 s of a failover in the soak) say what
    // the store's own lines say once per change: they are left out unless
    // the filter names the `redis` target.
    if spec.split(',').any(|d| d.trim().starts_with("redis")) {
        Ok(targets)
    } else {
        Ok(targets.with_target("redis", tracing_subscriber::filter::LevelFilter::ERROR))
    }
}

/// Parses and validates a configuration text; `file` names it in errors.
/// `${VAR}` and `${VAR:-default}` are read from the environment first.
pub fn load(text: &str, file: &str, overrides: &Overrides) -> Result<Config, ConfigErrors> {
    let text = &env::interpolate(text, file, |name| std::env::var(name).ok())
        .map_err(ConfigErrors::from)?;
    let d = Diag::new(file);
    // A file with nothing in it (`: > ratewarden.yaml`, a write caught
    // before its first line) is no configuration: nginx refuses an empty
    // nginx.conf too.
    if text
        .lines()
        .all(|l| l.trim().is_empty() || l.trim_start().starts_with('#'))
    {
        d.error(
            "(document)",
            None,
            "the file is empty: a gateway needs at least its `upstream` (nothing is served, and a reload keeps the running config)",
        );
        return d.finish(None::<Config>);
    }
    let is_compat = text
        .lines()
        .any(|l| l.trim_end().starts_with("rateLimiter:"));
    let config = if is_compat {
        let f = ratewarden_schema::compat::file(text).map_err(|e| parse_error(file, text, &e))?;
        compat::translate(f, &d, overrides)
    } else {
        let (parsed, errors, mended) = parse_all(file, text, ratewarden_schema::file);
        let reported: Vec<u64> = errors.iter().map(|e| e.line).collect();
        for e in errors {
            d.push(e);
        }
        let config = parsed.and_then(|f| validate::validate(f, &d, overrides));
        // What validation finds on a line the parser already reported, it
        // found in the mended text: the parser's error is the one to read.
        return d
            .finish(config)
            .map_err(|e| e.without_followers(&reported, &mended));
    };
    d.finish(config)
}

/// At most this many errors from parsing one file.
const MAX_PARSE_ERRORS: usize = 100;

/// Parses `text`, reporting every error the parser finds, not only the
/// first: serde stops at the first unknown key or value of the wrong type,
/// so the text is mended where it failed and parsed again, until it
/// parses or cannot be mended. Every other line keeps its number and
/// column. A misspelt key is read as the key it was taken for; a value of
/// the wrong type is replaced by one of the right type; an unknown key
/// nothing is close to is taken out, with its block. What was parsed last,
/// the errors, and the lines mended (a later error there, or a "required"
/// one for a key taken out, follows from one already reported).
fn parse_all<T>(
    file: &str,
    text: &str,
    parse: fn(&str) -> Result<T, serde_saphyr::Error>,
) -> (Option<T>, Vec<ConfigError>, Vec<(u64, String)>) {
    let mut now = text.to_owned();
    let (mut errors, mut mended) = (vec![], vec![]);
    // Each round mends the text or ends; bounded all the same.
    for _ in 0..MAX_PARSE_ERRORS * 4 {
        let e = match parse(&now) {
            Ok(v) => return (Some(v), errors, mended),
            Err(e) => e,
        };
        let mut err = parse_error(file, &now, &e);
        // A required key "missing" because its line is indented out of its
        // block: say so, at that line (a YAML reader calls it a syntax
        // error there), and stop.
        // (Or a syntax error where a line left its block.)
        if (err.message.ends_with("is required here")
            || err.message.contains("did not find expected"))
            && let Some((line, column, want)) = misindented(&now)
        {
            err.line = line;
            err.column = column;
            err.key = diag::key_at(&now, line).unwrap_or(err.key);
            err.message = format!(
                "indented {} spaces, but the keys of its block are at {want}: YAML reads it as outside \
                 the block",
                column - 1
            );
            errors.push(err);
            return (None, errors, mended);
        }
        let Some(loc) = e.location() else {
            errors.push(err);
            return (None, errors, mended);
        };
        let suggested = err
            .message
            .split("did you mean `")
            .nth(1)
            .and_then(|s| s.split('`').next())
            .map(str::to_owned);
        let fix = if err.message.starts_with("unknown key `") {
            match &suggested {
                Some(s) => rename_key(&now, loc.line(), &err.key, s),
                None => take_out(&now, loc.line()),
            }
        } else if err.message.starts_with("expected ") {
            placeholder(&err.message).and_then(|p| replace_value(&now, err.line, err.column, p))
        } else {
            None
        };
        let required = err.message.ends_with("is required here");
        // Another error on a line mended already follows from the mend,
        // unless it is a required key missing: a flow mapping (`{...}`) is
        // one line, and its misspelt key once hid the missing one.
        let seen = !required && mended.iter().any(|(l, _)| *l == loc.line());
        // A required key missing where an earlier mend took it out, or that
        // an unknown key stood for: reported already.
        let follows = required && mended.iter().any(|(_, k)| *k == err.key);
        if !(follows || (seen && fix.is_none())) {
            errors.push(err.clone());
        }
        mended.push((loc.line(), suggested.unwrap_or(err.key)));
        match fix {
            Some(t) if errors.len() < MAX_PARSE_ERRORS && t != now => now = t,
            _ => return (None, errors, mended),
        }
    }
    (None, errors, mended)
}

/// The first block-style key line indented to no level of the blocks
/// around it (one space short, say): its line, its key's column (1-based)
/// and the indent of the block it left. Lines in block scalars (`|`, `>`)
/// and flow collections are not keys; a deeper indent only follows a line
/// that opens a block (`key:`) or a list item.
fn misindented(text: &str) -> Option<(u64, u64, usize)> {
    let mut levels: Vec<usize> = vec![0];
    let (mut opened, mut scalar) = (false, None::<usize>);
    for (i, raw) in text.lines().enumerate() {
        let t = raw.trim_end();
        let body = t.trim_start();
        if body.is_empty() || body.starts_with('#') {
            continue;
        }
        let indent = t.len() - body.len();
        if let Some(s) = scalar {
            if indent > s {
                continue;
            }
            scalar = None;
        }
        let (col, content, item) = match body.strip_prefix("- ") {
            Some(rest) => (
                indent + 2 + (rest.len() - rest.trim_start().len()),
                rest.trim_start(),
                true,
            ),
            None if body == "-" => {
                opened = true;
                continue;
            }
            None => (indent, body, false),
        };
        if !content.contains(':') || content.starts_with(['{', '[', '"', '\'']) {
            opened = false;
            continue;
        }
        let top = *levels.last().unwrap_or(&0);
        if col > top {
            if !(opened || item) {
                return Some((i as u64 + 1, col as u64 + 1, top));
            }
            levels.push(col);
        } else if col < top {
            let left = top;
            while levels.last().is_some_and(|l| *l > col) {
                levels.pop();
            }
            if levels.last() != Some(&col) {
                if item {
                    levels.push(col);
                } else {
                    return Some((i as u64 + 1, col as u64 + 1, left));
                }
            }
        }
        let value = content.split_once(": ").map_or("", |(_, v)| v).trim();
        scalar = matches!(value, "|" | ">" | "|-" | ">-" | "|+" | ">+").then_some(col);
        opened = content.trim_end().ends_with(':');
    }
    None
}

/// A value of the type an "expected ..." message asks for, to parse on
/// with (the error was reported).
fn placeholder(message: &str) -> Option<&'static str> {
    let m = message.strip_prefix("expected ")?;
    Some(if m.starts_with("a whole number") {
        "1"
    } else if m.starts_with("`true` or `false`") {
        "false"
    } else if m.starts_with("a duration") {
        "1s"
    } else if m.starts_with("a URL") {
        "http://127.0.0.1:1"
    } else if m.starts_with("a list") {
        "[]"
    } else if m.starts_with("a string") {
        "x"
    } else {
        return None;
    })
}

/// `text` with the value at `line`:`column` (to the end of the line, a
/// comment kept) replaced by `value`.
fn replace_value(text: &str, line: u64, column: u64, value: &str) -> Option<String> {
    let at = usize::try_from(line).ok()?.checked_sub(1)?;
    let from = usize::try_from(column).ok()?.checked_sub(1)?;
    let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
    let l = lines.get_mut(at)?;
    let end = diag::scalar_end(l, from);
    if end < l.len() {
        // A value inside a flow collection: only it, the rest of the line
        // kept (its other keys are read, and their errors reported).
        l.replace_range(from..end, value);
        let mut t = lines.join("\n");
        t.push('\n');
        return Some(t);
    }
    let rest = l.get(from..)?;
    // A flow value (`{...}`, `[...]`) or a scalar: to the end of the line.
    let comment = rest
        .find(" #")
        .map(|i| rest[i..].to_owned())
        .unwrap_or_default();
    l.truncate(from);
    l.push_str(value);
    l.push_str(&comment);
    // A block value below the key (a mapping or list) goes too.
    let indent = l.len() - l.trim_start().len();
    for n in lines.iter_mut().skip(at + 1) {
        if n.trim().is_empty() || n.trim_start().starts_with('#') {
            continue;
        }
        if n.len() - n.trim_start().len() <= indent {
            break;
        }
        n.clear();
    }
    let mut t = lines.join("\n");
    t.push('\n');
    Some(t)
}

/// `text` with the key `from` on `line` written as `to`.
fn rename_key(text: &str, line: u64, from: &str, to: &str) -> Option<String> {
    let at = usize::try_from(line).ok()?.checked_sub(1)?;
    let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
    let l = lines.get_mut(at)?;
    let i = l.find(&format!("{from}:"))?;
    l.replace_range(i..i + from.len(), to);
    let mut t = lines.join("\n");
    t.push('\n');
    Some(t)
}

/// `text` without the entry on `line` (1-based) and its block: the lines
/// below it indented deeper. For a list item's first key (`- key: v`), the
/// dash stays when the item goes on below. `None` when nothing can be
/// taken out safely.
fn take_out(text: &str, line: u64) -> Option<String> {
    let at = usize::try_from(line).ok()?.checked_sub(1)?;
    let lines: Vec<&str> = text.lines().collect();
    let l = *lines.get(at)?;
    let indent = l.len() - l.trim_start().len();
    let body = &l[indent..];
    let (keep, key_indent) = match body.strip_prefix("- ") {
        Some(rest) => {
            let inner = indent + 2 + (rest.len() - rest.trim_start().len());
            // The item goes on below (another key at the key's indent):
            // keep its dash; else it would be an empty item.
            let goes_on = lines[at + 1..]
                .iter()
                .find(|n| !n.trim().is_empty())
                .is_some_and(|n| n.len() - n.trim_start().len() == inner);
            if !goes_on {
                return None;
            }
            (format!("{}-", &l[..indent]), inner)
        }
        None => (String::new(), indent),
    };
    let mut out: Vec<String> = lines.iter().map(|s| (*s).to_owned()).collect();
    out[at] = keep;
    for n in out.iter_mut().skip(at + 1) {
        let deeper = n.len() - n.trim_start().len() > key_indent;
        if n.trim().is_empty() || n.trim_start().starts_with('#') {
            continue;
        }
        if !deeper {
            break;
        }
        n.clear();
    }
    let mut t = out.join("\n");
    t.push('\n');
    Some(t)
}

#[cfg(test)]
mod tests {
    use tracing::Level;

    use super::*;

    #[test]
    fn log_filter_reads_levels_and_target_directives() {
        let f = log_filter("info").unwrap();
        assert!(f.would_enable("anything", &Level::INFO));
        // The Redis client's warnings only when named.
        assert!(!f.would_enable("redis::cluster_handling::async_connection", &Level::WARN));
        assert!(f.would_enable("redis::cluster_handling::async_connection", &Level::ERROR));
        assert!(f.would_enable("ratewarden::store::redis::call", &Level::WARN));
        let f = log_filter("info,redis=warn").unwrap();
        assert!(f.would_enable("redis::cluster_handling::async_connection", &Level::WARN));
        assert!(!f.would_enable("anything", &Level::DEBUG));
        let f = log_filter(" warn,ratewarden_gateway::proxy=debug ").unwrap();
        assert!(f.would_enable("ratewarden_gateway::proxy::flow", &Level::DEBUG));
        assert!(!f.would_enable("ratewarden_gateway::server", &Level::INFO));
        assert!(f.would_enable("ratewarden_gateway::server", &Level::WARN));
        assert!(!log_filter("off").unwrap().would_enable("x", &Level::ERROR));
        // A bare word that is no level names a target, as in RUST_LOG.
        let f = log_filter("hyper").unwrap();
        assert!(f.would_enable("hyper::proto", &Level::TRACE));
        assert!(!f.would_enable("ratewarden_gateway", &Level::ERROR));
        for bad in ["a=loud", "a=b=c", "info,=x"] {
            assert!(log_filter(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_log_level_that_is_no_filter_is_a_config_error() {
        let e = load(
            "log: {level: \"ratewarden=loud\"}\n",
            "t.yaml",
            &Overrides::default(),
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("log.level") && e.contains("not a level or filter"),
            "{e}"
        );
    }
}
