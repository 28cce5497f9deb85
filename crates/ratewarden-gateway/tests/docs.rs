//! The book (`docs/`) cannot drift (issue 50): every page is in its
//! summary and every link between pages and to the repository resolves;
//! every YAML config in it passes `ratewarden validate` (a block that is
//! not one says what it is instead: ```` ```yaml,fragment ````, `,envoy`,
//! `,kubernetes`, or `,needs-files` for one that names files on the
//! reader's machine); and the README stays a front page. The recipes the
//! book holds run against the real servers in their own tests
//! (`support::recipe`).

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn pages() -> Vec<PathBuf> {
    let mut out = vec![];
    let mut dirs = vec![root().join("docs/src")];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.extension().is_some_and(|x| x == "md") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// The fenced blocks of `text` whose info string is `info`, with the line
/// each starts on.
fn blocks(text: &str, info: &str) -> Vec<(usize, String)> {
    let mut out = vec![];
    let mut inside: Option<(usize, String)> = None;
    for (n, line) in text.lines().enumerate() {
        match &mut inside {
            None if line.trim_end() == format!("```{info}") => {
                inside = Some((n + 1, String::new()))
            }
            None => {}
            Some(_) if line.starts_with("```") => out.push(inside.take().unwrap()),
            Some((_, body)) => {
                body.push_str(line);
                body.push('\n');
            }
        }
    }
    out
}

/// Markdown links `[text](target)` outside code, not to the web.
fn links(text: &str) -> Vec<String> {
    let mut out = vec![];
    let mut fence = false;
    for line in text.lines() {
        if line.starts_with("```") {
            fence = !fence;
            continue;
        }
        if fence {
            continue;
        }
        let mut rest = line;
        while let Some(at) = rest.find("](") {
            let tail = &rest[at + 2..];
            let Some(end) = tail.find(')') else { break };
            let target = &tail[..end];
            if !target.starts_with("http") && !target.starts_with('#') {
                out.push(target.split('#').next().unwrap().to_owned());
            }
            rest = &tail[end..];
        }
    }
    out
}

#[test]
fn every_page_is_in_the_summary_and_every_link_resolves() {
    let src = root().join("docs/src");
    let summary = std::fs::read_to_string(src.join("SUMMARY.md")).unwrap();
    let listed = links(&summary);
    for page in pages() {
        let rel = page
            .strip_prefix(&src)
            .unwrap()
            .to_string_lossy()
            .into_owned();
        if rel != "SUMMARY.md" {
            assert!(listed.contains(&rel), "{rel} is not in SUMMARY.md");
        }
        let text = std::fs::read_to_string(&page).unwrap();
        for target in links(&text) {
            let to = page.parent().unwrap().join(&target);
            assert!(
                to.exists(),
                "{}: a link to {target}, which is not there",
                page.display()
            );
        }
    }
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    for target in links(&readme) {
        assert!(
            root().join(&target).exists(),
            "README.md: a link to {target}, which is not there"
        );
    }
}

#[test]
fn the_readme_is_a_front_page() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let n = readme.lines().count();
    assert!(
        n <= 200,
        "README.md has {n} lines: the manual is the book (docs/)"
    );
    // Its two commands first.
    let first = blocks(&readme, "sh").into_iter().next().unwrap().1;
    assert!(
        first.contains("cargo run --release --bin ratewarden -- serve"),
        "{first}"
    );
    assert!(first.contains("./test"), "{first}");
}

#[test]
fn every_config_in_the_book_is_valid() {
    let dir = std::env::temp_dir().join(format!("rw-docs-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut checked = 0;
    let mut failures = vec![];
    for page in pages() {
        let text = std::fs::read_to_string(&page).unwrap();
        for (line, body) in blocks(&text, "yaml") {
            // A block that names no upstream (a section shown alone) is
            // read as the config it would be with the echo upstream.
            let serves = body.lines().any(|l| {
                ["upstream:", "routes:", "authz:", "rls:", "listen: off"]
                    .iter()
                    .any(|k| l.starts_with(k))
            });
            let body = if serves {
                body
            } else {
                format!("upstream: echo\n{body}")
            };
            let file = dir.join(format!("block-{checked}.yaml"));
            std::fs::write(&file, &body).unwrap();
            let out = std::process::Command::new(env!("CARGO_BIN_EXE_ratewarden"))
                .arg("validate")
                .arg(&file)
                // The secrets the examples take from the environment.
                .env("ADMIN_TOKEN", "docs-admin-token")
                .env("JWT_SECRET", "docs-jwt-secret-of-enough-length")
                .env("RATEWARDEN_KEY_SECRET", "0123456789abcdef0123456789abcdef")
                .env("RUST_LOG", "off")
                .output()
                .unwrap();
            if !out.status.success() {
                failures.push(format!(
                    "{}:{line}: {}",
                    page.display(),
                    String::from_utf8_lossy(&out.stderr).trim()
                ));
            }
            checked += 1;
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    assert!(checked >= 15, "only {checked} configs found in the book");
    assert!(
        failures.is_empty(),
        "configs in the book that do not validate:\n{}",
        failures.join("\n")
    );
}

/// The keys the loader knows in `section` (`""`: the top level), as its
/// error for an unknown key lists them.
fn known_keys(section: &str) -> Vec<String> {
    let body = match section {
        "" => "upstream: echo\nzzz_unknown: 1\n".to_owned(),
        "rules" => "upstream: echo\nrules:\n  - {name: a, limit: 1, window: 1s, zzz_unknown: 1}\n"
            .to_owned(),
        "routes" => "upstream: echo\nroutes:\n  - {zzz_unknown: 1}\n".to_owned(),
        s => format!("upstream: echo\n{s}: {{zzz_unknown: 1}}\n"),
    };
    let file = std::env::temp_dir().join(format!("rw-keys-{}-{section}.yaml", std::process::id()));
    std::fs::write(&file, body).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ratewarden"))
        .arg("validate")
        .arg(&file)
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&file);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    let list = err
        .split("valid keys here: ")
        .nth(1)
        .unwrap_or_else(|| panic!("{section}: no list of keys in {err}"));
    list.lines()
        .next()
        .unwrap()
        .split(", ")
        .map(|k| k.trim().to_owned())
        .collect()
}

/// The reference names exactly the keys the loader knows: every
/// top-level key has its row in the reference's table, and every row names
/// a key the loader knows; every key of a section is written somewhere in
/// the book (`` `key` ``, `key:` or `section.key`).
#[test]
fn the_reference_names_every_key_the_loader_knows() {
    let reference =
        std::fs::read_to_string(root().join("docs/src/reference/configuration.md")).unwrap();
    let book: String = pages()
        .iter()
        .map(|p| std::fs::read_to_string(p).unwrap())
        .collect();
    let top = known_keys("");
    assert!(top.len() > 30, "{top:?}");
    // The table's first column: `key`, `key[]`, `a.b` / `a.c`, `key` (alias `other`).
    let mut rows = vec![];
    for line in reference.lines().filter(|l| l.starts_with("| `")) {
        let first = line.split('|').nth(1).unwrap();
        for part in first.split('`').skip(1).step_by(2) {
            rows.push(part.split(['.', '[']).next().unwrap().to_owned());
        }
    }
    for k in &top {
        assert!(
            rows.contains(k),
            "the loader knows `{k}`; the reference's table has no row for it"
        );
    }
    for r in rows.iter().filter(|r| !r.starts_with("examples/")) {
        assert!(
            top.contains(r),
            "the reference documents `{r}`, which the loader does not know"
        );
    }
    for section in [
        "admin",
        "store",
        "identity",
        "jwt",
        "tracing",
        "consumers",
        "log",
        "access_log",
        "overrides",
        "authz",
        "rls",
        "rules",
        "routes",
    ] {
        for k in known_keys(section) {
            assert!(
                book.contains(&format!("`{k}`"))
                    || book.contains(&format!("{k}:"))
                    || book.contains(&format!("{section}.{k}")),
                "`{section}.{k}` is known to the loader and written nowhere in the book"
            );
        }
    }
}

/// The book's Kubernetes manifests pass `kubernetes-validate --strict`
/// against the version the page names, and the config their ConfigMap
/// carries passes `ratewarden validate`.
#[test]
fn the_kubernetes_manifests_are_valid() {
    let python = std::env::var("RATEWARDEN_SDK_PYTHON").unwrap_or_else(|_| {
        panic!(
            "this test needs `kubernetes-validate` (PyPI): run ./test (it installs it into \
             target/sdk-venv), or `pip install kubernetes-validate` into a venv and set \
             RATEWARDEN_SDK_PYTHON to its python"
        )
    });
    let tool = Path::new(&python).with_file_name("kubernetes-validate");
    let page = root().join("docs/src/guides/kubernetes.md");
    let text = std::fs::read_to_string(&page).unwrap();
    assert!(
        text.contains("Kubernetes 1.30"),
        "the page names its version"
    );
    let manifests = blocks(&text, "yaml,kubernetes");
    assert!(!manifests.is_empty());
    let dir = std::env::temp_dir().join(format!("rw-k8s-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for (n, (line, body)) in manifests.iter().enumerate() {
        let file = dir.join(format!("m{n}.yaml"));
        std::fs::write(&file, body).unwrap();
        let out = std::process::Command::new(&tool)
            .args(["--strict", "--quiet", "-k", "1.30.0"])
            .arg(&file)
            .output()
            .unwrap_or_else(|e| {
                panic!("{}: {e} (pip install kubernetes-validate)", tool.display())
            });
        assert!(
            out.status.success(),
            "kubernetes.md:{line}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        // The ConfigMap's config, as the gateway will read it.
        if let Some(at) = body.find("ratewarden.yaml: |\n") {
            let config: String = body[at..]
                .lines()
                .skip(1)
                .take_while(|l| l.starts_with("    "))
                .map(|l| format!("{}\n", &l[4..]))
                .collect();
            let file = dir.join(format!("c{n}.yaml"));
            std::fs::write(&file, &config).unwrap();
            let out = std::process::Command::new(env!("CARGO_BIN_EXE_ratewarden"))
                .arg("validate")
                .arg(&file)
                .env("ADMIN_TOKEN", "docs-admin-token")
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "kubernetes.md:{line}: the ConfigMap's config: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Every transcript in the book (```` ```console,transcript ````: `$ `
/// lines are commands, the lines after them what they print; a line
/// ending in `...` stands for any that begins so) runs, and prints what
/// the page says. Its commands are `ratewarden`'s, run in a
/// scratch directory holding the page's ```` ```yaml,file=NAME ```` blocks;
/// every such block is used by a transcript of its page.
#[test]
fn every_transcript_prints_what_the_book_says() {
    let mut ran = 0;
    for page in pages() {
        let text = std::fs::read_to_string(&page).unwrap();
        let transcripts = blocks(&text, "console,transcript");
        if transcripts.is_empty() {
            continue;
        }
        let dir = std::env::temp_dir().join(format!("rw-transcript-{}-{ran}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut files = vec![];
        for line in text.lines() {
            if let Some(name) = line.strip_prefix("```yaml,file=") {
                files.push(name.trim().to_owned());
            }
        }
        for name in &files {
            let (_, body) = blocks(&text, &format!("yaml,file={name}")).remove(0);
            std::fs::write(dir.join(name), body).unwrap();
            assert!(
                transcripts.iter().any(|(_, t)| t.contains(name.as_str())),
                "{}: `{name}` is used by no transcript",
                page.display()
            );
        }
        for (line, transcript) in &transcripts {
            let mut steps: Vec<(String, String)> = vec![];
            for l in transcript.lines() {
                match l.strip_prefix("$ ") {
                    Some(cmd) => steps.push((cmd.to_owned(), String::new())),
                    None => {
                        let (_, out) = steps.last_mut().expect("a transcript starts with `$ `");
                        out.push_str(l);
                        out.push('\n');
                    }
                }
            }
            for (cmd, want) in steps {
                let mut words = cmd.split_whitespace();
                assert_eq!(
                    words.next(),
                    Some("ratewarden"),
                    "{}:{line}: `{cmd}`",
                    page.display()
                );
                let out = std::process::Command::new(env!("CARGO_BIN_EXE_ratewarden"))
                    .args(words)
                    .current_dir(&dir)
                    .env("RUST_LOG", "off")
                    .output()
                    .unwrap();
                let got = format!(
                    "{}{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                );
                // A line the book ends with `...` stands for any line that
                // begins so (a time taken, say).
                let (got, want) = (got.trim_end(), want.trim_end());
                let same = got.lines().count() == want.lines().count()
                    && got
                        .lines()
                        .zip(want.lines())
                        .all(|(g, w)| match w.strip_suffix("...") {
                            Some(prefix) => g.starts_with(prefix),
                            None => g == w,
                        });
                assert!(
                    same,
                    "{}:{line}: `{cmd}` printed something else:\n{got}\n--- the book says:\n{want}",
                    page.display()
                );
                ran += 1;
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
    assert!(ran >= 2, "only {ran} transcript commands in the book");
}

/// `mdbook build docs` makes the book, warning of nothing, with a page
/// for every chapter.
#[test]
fn the_book_builds() {
    let mdbook = std::env::var("RATEWARDEN_MDBOOK").unwrap_or_else(|_| {
        panic!(
            "this test needs mdbook 0.5.4: run ./test (it installs it into target/mdbook), or \
             `cargo install mdbook --version 0.5.4 --no-default-features --locked` and set \
             RATEWARDEN_MDBOOK to it"
        )
    });
    let out_dir = std::env::temp_dir().join(format!("rw-book-{}", std::process::id()));
    let out = std::process::Command::new(&mdbook)
        .arg("build")
        .arg(root().join("docs"))
        .arg("-d")
        .arg(&out_dir)
        .output()
        .unwrap_or_else(|e| panic!("{mdbook}: {e}"));
    let log = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "mdbook build failed:\n{log}");
    assert!(!log.contains("WARN") && !log.contains("ERROR"), "{log}");
    let src = root().join("docs/src");
    for page in pages() {
        let rel = page.strip_prefix(&src).unwrap().with_extension("html");
        if rel.to_string_lossy() != "SUMMARY.html" {
            assert!(
                out_dir.join(&rel).exists(),
                "no {} in the built book",
                rel.display()
            );
        }
    }
    let _ = std::fs::remove_dir_all(&out_dir);
}

/// Every metric the gateway's code can export has its row in the metrics
/// reference, and every row names one it exports.
#[test]
fn the_metrics_reference_names_every_metric() {
    let reference = std::fs::read_to_string(root().join("docs/src/reference/metrics.md")).unwrap();
    let mut exported = std::collections::BTreeSet::new();
    let mut dirs = vec![root().join("crates/ratewarden-gateway/src")];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                let text = std::fs::read_to_string(&p).unwrap();
                for (i, _) in text.match_indices("# TYPE ratewarden_") {
                    let name: String = text[i + 7..]
                        .chars()
                        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                        .collect();
                    exported.insert(name);
                }
            }
        }
    }
    // Histograms' TYPE lines are written with the name passed in.
    for h in [
        "ratewarden_decision_duration_seconds",
        "ratewarden_upstream_duration_seconds",
    ] {
        exported.insert(h.to_owned());
    }
    exported.retain(|n| n != "ratewarden_");
    assert!(exported.len() > 20, "{exported:?}");
    let rows: std::collections::BTreeSet<String> = reference
        .lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split('`').next())
        .map(str::to_owned)
        .collect();
    for m in &exported {
        assert!(
            rows.contains(m),
            "`{m}` is exported and not in reference/metrics.md"
        );
    }
    for r in &rows {
        assert!(
            exported.contains(r),
            "reference/metrics.md names `{r}`, which nothing exports"
        );
    }
}
