//! `${VAR}` and `${VAR:-default}` in a config, from the environment, so
//! that secrets (a Redis password, the admin token) need not be in the
//! file. Substituted in the text before it is parsed; `$${` writes a
//! literal `${`. Comments are left alone. An unset variable without a
//! default is an error naming it, at its line and column.

use super::diag::ConfigError;

/// `text` with its variables substituted from `lookup`; every unset one
/// is an error.
pub(crate) fn interpolate(
    text: &str,
    file: &str,
    lookup: impl Fn(&str) -> Option<String>,
) -> Result<String, Vec<ConfigError>> {
    let mut out = String::with_capacity(text.len());
    let mut errors = vec![];
    for (n, line) in text.split_inclusive('\n').enumerate() {
        let code_end = comment_start(line).unwrap_or(line.len());
        let (code, comment) = line.split_at(code_end);
        let mut rest = code;
        let mut column = 1;
        while let Some(at) = rest.find('$') {
            out.push_str(&rest[..at]);
            column += rest[..at].chars().count();
            let tail = &rest[at..];
            if let Some(after) = tail.strip_prefix("$${") {
                out.push_str("${");
                column += 3;
                rest = after;
                continue;
            }
            let Some(body) = tail.strip_prefix("${") else {
                out.push('$');
                column += 1;
                rest = &tail[1..];
                continue;
            };
            let Some(close) = body.find('}') else {
                errors.push(error(file, n, column, "`${` without a closing `}`"));
                out.push_str(tail);
                rest = "";
                break;
            };
            let inner = &body[..close];
            let (name, default) = match inner.split_once(":-") {
                Some((name, d)) => (name, Some(d)),
                None => (inner, None),
            };
            let name_ok = !name.is_empty()
                && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
                && !name.as_bytes()[0].is_ascii_digit();
            if !name_ok {
                errors.push(error(
                    file,
                    n,
                    column,
                    format!("`${{{inner}}}`: `{name}` is not a variable name"),
                ));
            } else {
                match (lookup(name), default) {
                    (Some(v), _) => out.push_str(&v),
                    (None, Some(d)) => out.push_str(d),
                    (None, None) => errors.push(error(
                        file,
                        n,
                        column,
                        format!(
                            "environment variable `{name}` is not set (use `${{{name}:-default}}` for a default)"
                        ),
                    )),
                }
            }
            column += inner.chars().count() + 3;
            rest = &body[close + 1..];
        }
        out.push_str(rest);
        out.push_str(comment);
    }
    if errors.is_empty() {
        Ok(out)
    } else {
        Err(errors)
    }
}

fn error(file: &str, line: usize, column: usize, message: impl Into<String>) -> ConfigError {
    ConfigError {
        file: file.to_owned(),
        line: line as u64 + 1,
        column: column as u64,
        key: "${...}".into(),
        message: message.into(),
    }
}

/// Where a YAML comment starts on `line`: a `#` at its start or after
/// whitespace, outside quotes.
fn comment_start(line: &str) -> Option<usize> {
    let (mut single, mut double) = (false, false);
    let mut prev = b' ';
    for (i, b) in line.bytes().enumerate() {
        match b {
            b'\'' if !double => single = !single,
            b'"' if !single && prev != b'\\' => double = !double,
            b'#' if !single && !double && (prev == b' ' || prev == b'\t' || i == 0) => {
                return Some(i);
            }
            _ => {}
        }
        prev = b;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(name: &str) -> Option<String> {
        match name {
            "REDIS_PASSWORD" => Some("s3cret".into()),
            "EMPTY" => Some(String::new()),
            _ => None,
        }
    }

    #[test]
    fn variables_defaults_literals_and_comments() {
        let text = "url: redis://:${REDIS_PASSWORD}@h:6379 # not ${UNSET} here\n\
                    token: ${TOKEN:-dev-token}\n\
                    literal: '$${NOT_A_VAR}' and $5 and a$b\n\
                    empty: \"${EMPTY}\"\n";
        let got = interpolate(text, "f.yaml", env).unwrap();
        assert_eq!(
            got,
            "url: redis://:s3cret@h:6379 # not ${UNSET} here\n\
             token: dev-token\n\
             literal: '${NOT_A_VAR}' and $5 and a$b\n\
             empty: \"\"\n"
        );
    }

    #[test]
    fn an_unset_variable_is_an_error_naming_it_where_it_is() {
        let errs = interpolate("a: 1\nurl: x${FIRST}y ${SECOND}\n", "f.yaml", env).unwrap_err();
        assert_eq!(errs.len(), 2);
        assert_eq!((errs[0].line, errs[0].column), (2, 7));
        assert!(
            errs[0].message.contains("`FIRST` is not set"),
            "{}",
            errs[0].message
        );
        assert_eq!((errs[1].line, errs[1].column), (2, 17));
        assert!(errs[1].message.contains("`SECOND`"));
        let errs = interpolate("x: ${1BAD}\ny: ${OPEN\n", "f.yaml", env).unwrap_err();
        assert!(errs[0].message.contains("not a variable name"));
        assert!(errs[1].message.contains("without a closing"));
    }
}
