//! `tracing:`, and the OpenTelemetry SDK's standard variables, which win
//! when set (`OTEL_EXPORTER_OTLP_ENDPOINT`, `..._TRACES_ENDPOINT`,
//! `..._PROTOCOL`, `..._HEADERS`, `OTEL_SERVICE_NAME`,
//! `OTEL_RESOURCE_ATTRIBUTES`, `OTEL_TRACES_SAMPLER` and `..._ARG`,
//! `OTEL_SDK_DISABLED`). A bad value in either is a config error naming
//! where it came from: a gateway never starts tracing other than as told.

use ratewarden_schema::{Sp, TracingFile};

use super::super::diag::Diag;
use super::super::{TraceEndpoint, TraceProtocol, TraceSampler, TraceSpec};

const GRPC_PATH: &str = "/opentelemetry.proto.collector.trace.v1.TraceService/Export";

pub(super) fn trace_spec(
    d: &Diag<'_>,
    f: Option<&Sp<TracingFile>>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Option<TraceSpec> {
    let mut spec = TraceSpec::default();
    let mut ok = true;
    let mut fail = |key: &str, at: Option<&serde_saphyr::Location>, msg: String| {
        d.error(key, at, msg);
        ok = false;
    };
    let file = f.map(|f| &f.value);
    // The protocol first: it says what an endpoint's path is.
    let protocol = match env("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        .or_else(|| env("OTEL_EXPORTER_OTLP_PROTOCOL"))
    {
        Some(p) => match protocol(&p) {
            Some(p) => Some(p),
            None => {
                fail(
                    "OTEL_EXPORTER_OTLP_PROTOCOL",
                    None,
                    format!("`{p}`: `grpc` or `http/protobuf` (`http/json` is not supported)"),
                );
                None
            }
        },
        None => match file
            .and_then(|f| f.otlp.as_ref())
            .and_then(|o| o.value.protocol.as_ref())
        {
            Some(p) => match protocol(&p.value) {
                Some(p) => Some(p),
                None => {
                    fail(
                        "tracing.otlp.protocol",
                        Some(&p.referenced),
                        format!("`{}`: `grpc` or `http/protobuf`", p.value),
                    );
                    None
                }
            },
            None => Some(TraceProtocol::Grpc),
        },
    };
    spec.protocol = protocol.unwrap_or(TraceProtocol::Grpc);
    // The endpoint: the traces' own variable as given (its path is the
    // path), else the general one (`/v1/traces` appended over HTTP), else
    // the file's (read as the general one).
    let endpoint = if let Some(e) = env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") {
        Some((e, true, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", None))
    } else if let Some(e) = env("OTEL_EXPORTER_OTLP_ENDPOINT") {
        Some((e, false, "OTEL_EXPORTER_OTLP_ENDPOINT", None))
    } else {
        file.and_then(|f| f.otlp.as_ref()).map(|o| {
            (
                o.value.endpoint.value.clone(),
                false,
                "tracing.otlp.endpoint",
                Some(&o.value.endpoint.referenced),
            )
        })
    };
    if let Some((e, exact, key, at)) = endpoint {
        match endpoint_of(&e, exact, spec.protocol) {
            Ok(ep) => spec.endpoint = Some(ep),
            Err(why) => fail(key, at, format!("`{e}`: {why}")),
        }
    }
    if let Some(s) = file.and_then(|f| f.sample.as_ref()) {
        if (0.0..=1.0).contains(&s.value) {
            spec.sampler = TraceSampler::Ratio(s.value);
        } else {
            fail(
                "tracing.sample",
                Some(&s.referenced),
                format!("{}: a share from 0 to 1", s.value),
            );
        }
    }
    if let Some(name) = env("OTEL_TRACES_SAMPLER") {
        let arg = env("OTEL_TRACES_SAMPLER_ARG");
        let ratio = match arg.as_deref().map(str::parse::<f64>) {
            None => Some(1.0),
            Some(Ok(r)) if (0.0..=1.0).contains(&r) => Some(r),
            Some(_) => {
                fail(
                    "OTEL_TRACES_SAMPLER_ARG",
                    None,
                    format!("`{}`: a share from 0 to 1", arg.unwrap_or_default()),
                );
                None
            }
        };
        // Every sampler follows a sampled parent: the gateway is never the
        // one hop that breaks a trace its client chose to record.
        match (name.as_str(), ratio) {
            ("always_on" | "parentbased_always_on", _) => spec.sampler = TraceSampler::Ratio(1.0),
            ("always_off" | "parentbased_always_off", _) => spec.sampler = TraceSampler::Off,
            ("traceidratio" | "parentbased_traceidratio", Some(r)) => {
                spec.sampler = TraceSampler::Ratio(r)
            }
            ("traceidratio" | "parentbased_traceidratio", None) => {}
            (other, _) => fail(
                "OTEL_TRACES_SAMPLER",
                None,
                format!(
                    "`{other}`: always_on, always_off, traceidratio or their parentbased_ forms"
                ),
            ),
        }
    }
    if let Some(n) = file.and_then(|f| f.service_name.as_ref()) {
        spec.service_name = n.value.clone();
    }
    match pairs(env("OTEL_RESOURCE_ATTRIBUTES").as_deref().unwrap_or("")) {
        Ok(p) => {
            if let Some((_, name)) = p.iter().find(|(k, _)| k == "service.name") {
                spec.service_name = name.clone();
            }
            spec.resource = p;
        }
        Err(why) => fail("OTEL_RESOURCE_ATTRIBUTES", None, why),
    }
    if let Some(n) = env("OTEL_SERVICE_NAME").filter(|n| !n.is_empty()) {
        spec.service_name = n;
    }
    match pairs(
        env("OTEL_EXPORTER_OTLP_TRACES_HEADERS")
            .or_else(|| env("OTEL_EXPORTER_OTLP_HEADERS"))
            .as_deref()
            .unwrap_or(""),
    ) {
        Ok(h) => {
            let bad = h.iter().find(|(k, v)| {
                http::HeaderName::from_bytes(k.as_bytes()).is_err()
                    || http::HeaderValue::from_str(v).is_err()
            });
            match bad {
                Some((k, _)) => fail(
                    "OTEL_EXPORTER_OTLP_HEADERS",
                    None,
                    format!("`{k}` is not a header that can be sent"),
                ),
                None => spec.headers = h,
            }
        }
        Err(why) => fail("OTEL_EXPORTER_OTLP_HEADERS", None, why),
    }
    if env("OTEL_SDK_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true")) {
        spec.endpoint = None;
    }
    ok.then_some(spec)
}

fn protocol(p: &str) -> Option<TraceProtocol> {
    match p.trim() {
        "grpc" => Some(TraceProtocol::Grpc),
        "http/protobuf" => Some(TraceProtocol::HttpProtobuf),
        _ => None,
    }
}

/// `http://host:port[/path]`: where spans go. `exact`: the path is the
/// traces' own (`..._TRACES_ENDPOINT`); else, over HTTP, `/v1/traces` is
/// appended to it. gRPC's path is its method's, whatever was written.
fn endpoint_of(e: &str, exact: bool, protocol: TraceProtocol) -> Result<TraceEndpoint, String> {
    let Some(rest) = e.trim().strip_prefix("http://") else {
        return Err(if e.trim().starts_with("https://") {
            "an `http://` collector (TLS to the collector is not supported yet: run the collector, or an agent, beside the gateway)".into()
        } else {
            "an `http://host:port` URL".into()
        });
    };
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, ""),
    };
    let valid = authority
        .rsplit_once(':')
        .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok_and(|p| p > 0));
    if !valid {
        return Err("a host and a port (`http://127.0.0.1:4317`)".into());
    }
    let path = match protocol {
        TraceProtocol::Grpc => GRPC_PATH.to_owned(),
        TraceProtocol::HttpProtobuf if exact && !path.is_empty() => path.to_owned(),
        TraceProtocol::HttpProtobuf => format!("{}/v1/traces", path.trim_end_matches('/')),
    };
    Ok(TraceEndpoint {
        authority: authority.to_owned(),
        path,
    })
}

/// `k=v,k2=v2` (the W3C baggage form the OTel variables use), with
/// percent-escapes in values decoded.
fn pairs(s: &str) -> Result<Vec<(String, String)>, String> {
    let mut out = vec![];
    for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        let Some((k, v)) = item.split_once('=') else {
            return Err(format!("`{item}`: `key=value` pairs, comma-separated"));
        };
        let k = k.trim();
        if k.is_empty() {
            return Err(format!("`{item}`: a key before `=`"));
        }
        out.push((k.to_owned(), unescape(v.trim())));
    }
    Ok(out)
}

fn unescape(v: &str) -> String {
    let b = v.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let digit = |at: usize| b.get(at).and_then(|c| (*c as char).to_digit(16));
        if b[i] == b'%'
            && let (Some(h), Some(l)) = (digit(i + 1), digit(i + 2))
        {
            out.push((h * 16 + l) as u8);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_as_the_otel_variables_read_them() {
        let g = endpoint_of("http://127.0.0.1:4317", false, TraceProtocol::Grpc).unwrap();
        assert_eq!(g.authority, "127.0.0.1:4317");
        assert_eq!(g.path, GRPC_PATH);
        let h = endpoint_of("http://c:4318", false, TraceProtocol::HttpProtobuf).unwrap();
        assert_eq!(h.path, "/v1/traces");
        let h = endpoint_of("http://c:4318/otlp/", false, TraceProtocol::HttpProtobuf).unwrap();
        assert_eq!(h.path, "/otlp/v1/traces");
        let h = endpoint_of("http://c:4318/custom", true, TraceProtocol::HttpProtobuf).unwrap();
        assert_eq!(h.path, "/custom");
        assert!(endpoint_of("https://c:4318", false, TraceProtocol::Grpc).is_err());
        assert!(endpoint_of("http://c", false, TraceProtocol::Grpc).is_err());
        assert!(endpoint_of("c:4317", false, TraceProtocol::Grpc).is_err());
    }

    #[test]
    fn pairs_are_read_with_their_escapes() {
        assert_eq!(
            pairs("deployment.environment=prod, team=a%20b").unwrap(),
            vec![
                ("deployment.environment".to_owned(), "prod".to_owned()),
                ("team".to_owned(), "a b".to_owned())
            ]
        );
        assert!(pairs("novalue").is_err());
        assert_eq!(unescape("%"), "%");
        assert_eq!(unescape("a%2"), "a%2");
        assert_eq!(unescape("%é1"), "%é1");
    }
}
