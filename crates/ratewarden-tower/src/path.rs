//! The path a rule sees.
//!
//! Rules match, and `path` key parts read, the *normalised* path, never the
//! raw request target: otherwise `/%6cimited/b`, `/./limited/b`,
//! `/x/../limited/b` or `//limited/b` would each escape a rule on
//! `/limited/` while the upstream serves them as `/limited/b` (nginx
//! decodes and normalises before it matches a `location` for the same
//! reason). For a limiter, over-matching is the safe side: when an upstream
//! could read a request as falling under a rule, the rule sees it so.
//!
//! [`normalize`] therefore:
//!
//! 1. percent-decodes (hex in either case), reading `%2F` and `%5C` (and a
//!    literal `\`, which some servers treat as `/`) as separators;
//! 2. drops `;` parameters from each segment (`/api;jsessionid=1/x` is
//!    `/api/x`: Java servlet containers route without them);
//! 3. merges repeated slashes and removes `.` and `..` segments
//!    (RFC 3986 §5.2.4), keeping a trailing slash.
//!
//! A path that cannot be normalised is an error, answered 400: an invalid
//! `%` escape, `%00`, or a `..` above the root. Bytes that are not UTF-8
//! after decoding are replaced by U+FFFD (a rule's ASCII prefix still
//! matches). A decoded `%` stays written `%25`: the one escape that cannot
//! be decoded without changing what a second decoding would see, and what
//! keeps normalising idempotent (`/%2541` is `/%2541`, not `/%41`, which
//! would read as `/A` the next time).
//!
//! [`normalize_for_upstream`] is the form sent upstream with
//! `upstream_path: normalized`: RFC 3986 §6.2.2 normalisation, which changes
//! no meaning. Unreserved characters are decoded, other escapes kept with
//! upper-case hex (`%2F` stays `%2F`), dot segments removed and slashes
//! merged.

use std::borrow::Cow;

/// Why a path cannot be normalised.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PathError {
    /// A `%` not followed by two hex digits.
    BadEscape,
    /// `%00`: no upstream should see a NUL byte.
    Nul,
    /// A `..` segment that would climb above the root.
    AboveRoot,
    /// Not a path: does not start with `/`.
    NotAPath,
}

impl std::fmt::Display for PathError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            PathError::BadEscape => "the path has an invalid percent-escape",
            PathError::Nul => "the path contains %00",
            PathError::AboveRoot => "the path climbs above the root with `..`",
            PathError::NotAPath => "the request target is not a path",
        })
    }
}

impl std::error::Error for PathError {}

/// Whether `raw` may need work: anything but plain segments of bytes
/// other than `%`, `;` and `\`, without empty, `.` or `..` segments.
fn needs_work(raw: &[u8]) -> bool {
    if raw.first() != Some(&b'/') {
        return true;
    }
    let mut i = 0;
    while i < raw.len() {
        match raw[i] {
            b'%' | b';' | b'\\' => return true,
            b'/' => {
                // What follows this slash: another slash, or a dot segment.
                match &raw[i + 1..] {
                    [b'/', ..] => return true,
                    [b'.'] | [b'.', b'/', ..] => return true,
                    [b'.', b'.'] | [b'.', b'.', b'/', ..] => return true,
                    _ => {}
                }
            }
            _ => {}
        }
        i += 1;
    }
    false
}

fn hex(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// The byte the escape at `raw[i]` (a `%`) stands for.
fn escape_at(raw: &[u8], i: usize) -> Result<u8, PathError> {
    match (
        raw.get(i + 1).copied().and_then(hex),
        raw.get(i + 2).copied().and_then(hex),
    ) {
        (Some(h), Some(l)) => match h << 4 | l {
            0 => Err(PathError::Nul),
            b => Ok(b),
        },
        _ => Err(PathError::BadEscape),
    }
}

/// Removes `.` and `..` from `segments` (RFC 3986 §5.2.4) and joins them
/// under a leading `/`; a trailing slash stays when the last segment was
/// empty, `.` or `..`.
fn join(segments: &[&[u8]]) -> Result<Vec<u8>, PathError> {
    let mut kept: Vec<&[u8]> = Vec::with_capacity(segments.len());
    let mut trailing = false;
    for (i, seg) in segments.iter().enumerate() {
        let last = i + 1 == segments.len();
        match *seg {
            b"" => trailing = last,
            b"." => trailing = last,
            b".." => {
                if kept.pop().is_none() {
                    return Err(PathError::AboveRoot);
                }
                trailing = last;
            }
            s => {
                kept.push(s);
                trailing = false;
            }
        }
    }
    let mut out = Vec::with_capacity(segments.iter().map(|s| s.len() + 1).sum::<usize>() + 1);
    for s in &kept {
        out.push(b'/');
        out.extend_from_slice(s);
    }
    if trailing || kept.is_empty() {
        out.push(b'/');
    }
    Ok(out)
}

/// The path rules see (see the [module](self) docs). Borrows `raw` when it
/// is already normal, the common case, which costs one scan.
///
/// ```
/// use ratewarden_tower::path::{normalize, PathError};
/// assert_eq!(normalize("/limited/b").unwrap(), "/limited/b");
/// for same in ["/%6cimited/b", "/%6Cimited/b", "/./limited/b", "/x/../limited/b",
///              "//limited/b", "/limited%2Fb", "/limited;v=1/b", "/limited%5cb"] {
///     assert_eq!(normalize(same).unwrap(), "/limited/b", "{same}");
/// }
/// assert_eq!(normalize("/a/b/..").unwrap(), "/a/");
/// assert_eq!(normalize("/../etc"), Err(PathError::AboveRoot));
/// assert_eq!(normalize("/a%2"), Err(PathError::BadEscape));
/// assert_eq!(normalize("/a%00"), Err(PathError::Nul));
/// ```
pub fn normalize(raw: &str) -> Result<Cow<'_, str>, PathError> {
    let bytes = raw.as_bytes();
    if !needs_work(bytes) {
        return Ok(Cow::Borrowed(raw));
    }
    if bytes.first() != Some(&b'/') {
        return Err(PathError::NotAPath);
    }
    // Decode, with `\` (literal or escaped) read as `/`.
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let (b, escaped) = match bytes[i] {
            b'%' => {
                i += 3;
                (escape_at(bytes, i - 3)?, true)
            }
            b => {
                i += 1;
                (b, false)
            }
        };
        match b {
            b'\\' => decoded.push(b'/'),
            b'%' if escaped => decoded.extend_from_slice(b"%25"),
            b => decoded.push(b),
        }
    }
    // Segments, each without its `;` parameters.
    let segments: Vec<&[u8]> = decoded[1..]
        .split(|&b| b == b'/')
        .map(|s| match s.iter().position(|&b| b == b';') {
            Some(p) => &s[..p],
            None => s,
        })
        .collect();
    let out = join(&segments)?;
    Ok(Cow::Owned(match String::from_utf8(out) {
        Ok(s) => s,
        Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
    }))
}

/// Unreserved characters (RFC 3986 §2.3): decoding them changes no meaning.
fn unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

/// The path sent upstream with `upstream_path: normalized` (see the
/// [module](self) docs). Borrows `raw` when it is already normal.
///
/// ```
/// use ratewarden_tower::path::normalize_for_upstream;
/// assert_eq!(normalize_for_upstream("//a/./%7euser/%2f/x/..").unwrap(), "/a/~user/%2F/");
/// assert_eq!(normalize_for_upstream("/a;b=1/c").unwrap(), "/a;b=1/c");
/// ```
pub fn normalize_for_upstream(raw: &str) -> Result<Cow<'_, str>, PathError> {
    let bytes = raw.as_bytes();
    if bytes.first() != Some(&b'/') {
        return Err(PathError::NotAPath);
    }
    let plain = !bytes.windows(2).any(|w| w == b"//")
        && !bytes.contains(&b'%')
        && !bytes.split(|&b| b == b'/').any(|s| s == b"." || s == b"..");
    if plain {
        return Ok(Cow::Borrowed(raw));
    }
    // Escapes normalised per segment (a decoded `/` would change the
    // path's meaning, so segments are split on literal slashes only).
    let mut normal: Vec<Vec<u8>> = vec![];
    for seg in bytes[1..].split(|&b| b == b'/') {
        let mut out = Vec::with_capacity(seg.len());
        let mut i = 0;
        while i < seg.len() {
            if seg[i] == b'%' {
                let b = escape_at(seg, i)?;
                if unreserved(b) {
                    out.push(b);
                } else {
                    out.push(b'%');
                    out.extend_from_slice(format!("{b:02X}").as_bytes());
                }
                i += 3;
            } else {
                out.push(seg[i]);
                i += 1;
            }
        }
        normal.push(out);
    }
    let segments: Vec<&[u8]> = normal.iter().map(Vec::as_slice).collect();
    let out = join(&segments)?;
    // Only ASCII was written: escapes stay escapes, and the rest is `raw`'s.
    Ok(Cow::Owned(
        String::from_utf8(out).map_err(|_| PathError::BadEscape)?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equivalent_paths_normalise_alike() {
        let cases = [
            ("/", "/"),
            ("//", "/"),
            ("/a", "/a"),
            ("/a/", "/a/"),
            ("/a//b///c", "/a/b/c"),
            ("/a/./b/.", "/a/b/"),
            ("/a/b/../c", "/a/c"),
            ("/a/b/..", "/a/"),
            ("/a/..", "/"),
            ("/a/%2e%2E/", "/"),
            ("/x/%2e%2e/limited/b", "/limited/b"),
            ("/a.b/..c/c..", "/a.b/..c/c.."),
            ("/%41%42", "/AB"),
            ("/caf%C3%A9", "/café"),
            ("/%FF/x", "/\u{FFFD}/x"),
            ("/a;x/b;y=1;z", "/a/b"),
            ("/;/a", "/a"),
            ("/a%3bx/b", "/a/b"),
            ("/a%5C..%5Cb", "/b"),
            ("/a\\b", "/a/b"),
            ("/%25", "/%25"),
            ("/%2541", "/%2541"),
            ("/100%25/x", "/100%25/x"),
        ];
        for (raw, want) in cases {
            assert_eq!(normalize(raw).unwrap(), want, "{raw}");
            // Idempotent.
            assert_eq!(normalize(want).unwrap(), want, "{want} again");
        }
    }

    #[test]
    fn what_cannot_be_normalised_is_an_error() {
        assert_eq!(normalize("/.."), Err(PathError::AboveRoot));
        assert_eq!(normalize("/a/../.."), Err(PathError::AboveRoot));
        assert_eq!(normalize("/%2e%2e"), Err(PathError::AboveRoot));
        assert_eq!(normalize("/%zz"), Err(PathError::BadEscape));
        assert_eq!(normalize("/%"), Err(PathError::BadEscape));
        assert_eq!(normalize("/%0"), Err(PathError::BadEscape));
        assert_eq!(normalize("/a%00b"), Err(PathError::Nul));
        assert_eq!(normalize("a/b"), Err(PathError::NotAPath));
        assert_eq!(normalize(""), Err(PathError::NotAPath));
    }

    #[test]
    fn plain_paths_are_borrowed() {
        for p in ["/", "/api/v1/items", "/a.b/c..d/.e", "/x?"] {
            assert!(matches!(normalize(p), Ok(Cow::Borrowed(_))), "{p}");
        }
    }

    #[test]
    fn the_upstream_form_keeps_meaning() {
        let f = |p| normalize_for_upstream(p).unwrap().into_owned();
        assert_eq!(f("/a/b"), "/a/b");
        assert_eq!(f("/a%2fb"), "/a%2Fb");
        assert_eq!(f("/%61%2e/./b"), "/a./b");
        assert_eq!(f("/a/%2e%2e/b"), "/b");
        assert_eq!(f("/a//b/"), "/a/b/");
        assert_eq!(f("/caf%c3%a9"), "/caf%C3%A9");
        assert_eq!(normalize_for_upstream("/.."), Err(PathError::AboveRoot));
        assert_eq!(normalize_for_upstream("/%x1"), Err(PathError::BadEscape));
        assert_eq!(normalize_for_upstream("/%00"), Err(PathError::Nul));
    }
}
