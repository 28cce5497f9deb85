//! The fuzz targets' saved corpora (`fuzz/corpus/TARGET/`), run as ordinary
//! tests: every input a fuzzer kept, and every input that once failed
//! (`fuzz/regressions/TARGET/`, kept apart so that corpus minimisation
//! never drops one), must pass its target's checks on every build.

use std::path::Path;

fn corpus(target: &str, check: fn(&[u8])) {
    let fuzz = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz");
    let mut n = 0;
    for dir in [
        fuzz.join("corpus").join(target),
        fuzz.join("regressions").join(target),
    ] {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries {
            let path = entry.unwrap().path();
            let data = std::fs::read(&path).unwrap();
            let outcome = std::panic::catch_unwind(|| check(&data));
            assert!(outcome.is_ok(), "{target}: {} fails", path.display());
            n += 1;
        }
    }
    assert!(n > 0, "{target}: empty corpus");
}

#[test]
fn h1_request() {
    corpus("h1_request", ratewarden_gateway::fuzzing::h1_request);
}

#[test]
fn h1_response() {
    corpus("h1_response", ratewarden_gateway::fuzzing::h1_response);
}

#[test]
fn path_normalizer() {
    corpus(
        "path_normalizer",
        ratewarden_gateway::fuzzing::path_normalizer,
    );
}

#[test]
fn forwarded() {
    corpus("forwarded", ratewarden_gateway::fuzzing::forwarded);
}

#[test]
fn forwarded_walk() {
    corpus(
        "forwarded_walk",
        ratewarden_gateway::fuzzing::forwarded_walk,
    );
}

#[test]
fn config() {
    corpus("config", ratewarden_gateway::fuzzing::config);
}

#[test]
fn differential() {
    corpus("differential", ratewarden_gateway::fuzzing::differential);
}

#[test]
fn rls_request() {
    corpus("rls_request", ratewarden_gateway::fuzzing::rls_request);
}

#[test]
fn request_view() {
    corpus("request_view", ratewarden_gateway::fuzzing::request_view);
}

#[test]
fn jwt() {
    corpus("jwt", ratewarden_gateway::fuzzing::jwt);
}

#[test]
fn authz_dialect() {
    corpus("authz_dialect", ratewarden_gateway::fuzzing::authz_dialect);
}

#[test]
fn llm_usage() {
    corpus("llm_usage", ratewarden_gateway::fuzzing::llm_usage);
}

#[test]
fn traceparent() {
    corpus("traceparent", ratewarden_gateway::fuzzing::traceparent);
}
