//! The parts of Envoy's `envoy.service.auth.v3` messages that the gRPC
//! `Authorization/Check` front reads and writes, declared with the field
//! numbers of Envoy's protos (`api/envoy/service/auth/v3/*.proto`,
//! `config/core/v3/{address,base}.proto`, `type/v3/http_status.proto`,
//! `google/rpc/status.proto`). prost decodes and encodes them and skips
//! every field not declared here, as protobuf does for unknown fields.
//!
//! This replaced the `envoy-types` crate (all of Envoy's API, 89,000
//! generated lines: 50 s of a release build) for four messages. The tests
//! still encode with envoy-types' complete messages and decode with these,
//! and the other way round (`tests/authz.rs`, `fuzzing::authz_check_pb`),
//! so a wrong field number shows.

use std::collections::HashMap;

/// `envoy.service.auth.v3.CheckRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct CheckRequest {
    /// The request's attributes.
    #[prost(message, optional, tag = "1")]
    pub attributes: Option<AttributeContext>,
}

/// `envoy.service.auth.v3.AttributeContext`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct AttributeContext {
    /// The downstream peer (the client, as Envoy saw it).
    #[prost(message, optional, tag = "1")]
    pub source: Option<Peer>,
    /// The request.
    #[prost(message, optional, tag = "4")]
    pub request: Option<AttributeRequest>,
}

/// `AttributeContext.Peer`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Peer {
    /// Its address.
    #[prost(message, optional, tag = "1")]
    pub address: Option<Address>,
}

/// `envoy.config.core.v3.Address`: of its `oneof`, the socket address.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Address {
    /// An IP and port.
    #[prost(message, optional, tag = "1")]
    pub socket_address: Option<SocketAddress>,
}

/// `envoy.config.core.v3.SocketAddress`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct SocketAddress {
    /// The IP, as text.
    #[prost(string, tag = "2")]
    pub address: String,
    /// The port.
    #[prost(uint32, tag = "3")]
    pub port_value: u32,
}

/// `AttributeContext.Request`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct AttributeRequest {
    /// Its HTTP attributes.
    #[prost(message, optional, tag = "2")]
    pub http: Option<HttpRequest>,
}

/// `AttributeContext.HttpRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct HttpRequest {
    /// The method.
    #[prost(string, tag = "2")]
    pub method: String,
    /// The header fields, names lower-case (pseudo-headers included).
    #[prost(map = "string, string", tag = "3")]
    pub headers: HashMap<String, String>,
    /// The path, with its query.
    #[prost(string, tag = "4")]
    pub path: String,
    /// The host (`:authority`).
    #[prost(string, tag = "5")]
    pub host: String,
    /// The scheme.
    #[prost(string, tag = "6")]
    pub scheme: String,
}

/// `envoy.service.auth.v3.CheckResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct CheckResponse {
    /// OK admits; anything else refuses.
    #[prost(message, optional, tag = "1")]
    pub status: Option<RpcStatus>,
    /// What Envoy does with the request.
    #[prost(oneof = "HttpResponse", tags = "2, 3")]
    pub http_response: Option<HttpResponse>,
}

/// `CheckResponse.http_response`.
#[derive(Clone, PartialEq, prost::Oneof)]
pub(crate) enum HttpResponse {
    /// The answer Envoy gives instead of forwarding.
    #[prost(message, tag = "2")]
    DeniedResponse(DeniedHttpResponse),
    /// Forwarded, with these changes.
    #[prost(message, tag = "3")]
    OkResponse(OkHttpResponse),
}

/// `envoy.service.auth.v3.OkHttpResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct OkHttpResponse {
    /// Fields added to the upstream's answer on its way to the client.
    #[prost(message, repeated, tag = "6")]
    pub response_headers_to_add: Vec<HeaderValueOption>,
}

/// `envoy.service.auth.v3.DeniedHttpResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct DeniedHttpResponse {
    /// Its status.
    #[prost(message, optional, tag = "1")]
    pub status: Option<HttpStatus>,
    /// Its header fields.
    #[prost(message, repeated, tag = "2")]
    pub headers: Vec<HeaderValueOption>,
    /// Its body.
    #[prost(string, tag = "3")]
    pub body: String,
}

/// `envoy.type.v3.HttpStatus` (its `code` an enum of the status codes,
/// on the wire an int32).
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct HttpStatus {
    /// The status code.
    #[prost(int32, tag = "1")]
    pub code: i32,
}

/// `google.rpc.Status`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct RpcStatus {
    /// A gRPC status code.
    #[prost(int32, tag = "1")]
    pub code: i32,
    /// A message for the developer.
    #[prost(string, tag = "2")]
    pub message: String,
}

/// `envoy.config.core.v3.HeaderValueOption`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct HeaderValueOption {
    /// The field.
    #[prost(message, optional, tag = "1")]
    pub header: Option<HeaderValue>,
}

/// `envoy.config.core.v3.HeaderValue`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct HeaderValue {
    /// Its name.
    #[prost(string, tag = "1")]
    pub key: String,
    /// Its value.
    #[prost(string, tag = "2")]
    pub value: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::envoy::config::core::v3 as core;
    use envoy_types::pb::envoy::service::auth::v3 as auth;
    use prost::Message;

    /// A CheckRequest with every field Envoy fills, encoded by envoy-types,
    /// reads the same here; the fields not declared are skipped.
    #[test]
    fn envoy_types_check_requests_read_the_same() {
        use auth::attribute_context::{HttpRequest as EHttp, Peer as EPeer, Request as EReq};
        let peer = |ip: &str, port| EPeer {
            address: Some(core::Address {
                address: Some(core::address::Address::SocketAddress(core::SocketAddress {
                    address: ip.into(),
                    port_specifier: Some(core::socket_address::PortSpecifier::PortValue(port)),
                    ..Default::default()
                })),
            }),
            service: "svc".into(),
            principal: "spiffe://x".into(),
            ..Default::default()
        };
        let theirs = auth::CheckRequest {
            attributes: Some(auth::AttributeContext {
                source: Some(peer("203.0.113.7", 51234)),
                destination: Some(peer("10.0.0.1", 443)),
                request: Some(EReq {
                    time: Some(envoy_types::pb::google::protobuf::Timestamp {
                        seconds: 1,
                        nanos: 2,
                    }),
                    http: Some(EHttp {
                        id: "rid".into(),
                        method: "POST".into(),
                        headers: [("x-api-key".to_owned(), "k1".to_owned())].into(),
                        path: "/v1/a?b=c".into(),
                        host: "api.example".into(),
                        scheme: "https".into(),
                        size: 12,
                        protocol: "HTTP/2".into(),
                        body: "hello".into(),
                        raw_body: b"raw".to_vec(),
                        ..Default::default()
                    }),
                }),
                context_extensions: [("a".to_owned(), "b".to_owned())].into(),
                tls_session: Some(auth::attribute_context::TlsSession { sni: "api".into() }),
                ..Default::default()
            }),
        };
        let ours = CheckRequest::decode(&theirs.encode_to_vec()[..]).unwrap();
        let attrs = ours.attributes.unwrap();
        let src = attrs
            .source
            .unwrap()
            .address
            .unwrap()
            .socket_address
            .unwrap();
        assert_eq!(
            (src.address.as_str(), src.port_value),
            ("203.0.113.7", 51234)
        );
        let http = attrs.request.unwrap().http.unwrap();
        assert_eq!(http.method, "POST");
        assert_eq!(http.path, "/v1/a?b=c");
        assert_eq!(http.host, "api.example");
        assert_eq!(http.scheme, "https");
        assert_eq!(http.headers["x-api-key"], "k1");
    }

    /// The answers written here read as envoy-types reads them.
    #[test]
    fn check_responses_read_as_envoy_types_reads_them() {
        let option = |k: &str, v: &str| HeaderValueOption {
            header: Some(HeaderValue {
                key: k.into(),
                value: v.into(),
            }),
        };
        let ok = CheckResponse {
            status: Some(RpcStatus {
                code: 0,
                message: String::new(),
            }),
            http_response: Some(HttpResponse::OkResponse(OkHttpResponse {
                response_headers_to_add: vec![option("x-ratelimit-remaining", "4")],
            })),
        };
        let theirs = auth::CheckResponse::decode(&ok.encode_to_vec()[..]).unwrap();
        let Some(auth::check_response::HttpResponse::OkResponse(r)) = theirs.http_response else {
            panic!("{theirs:?}")
        };
        let h = r.response_headers_to_add[0].header.as_ref().unwrap();
        assert_eq!(
            (h.key.as_str(), h.value.as_str()),
            ("x-ratelimit-remaining", "4")
        );
        let denied = CheckResponse {
            status: Some(RpcStatus {
                code: 7,
                message: "refused".into(),
            }),
            http_response: Some(HttpResponse::DeniedResponse(DeniedHttpResponse {
                status: Some(HttpStatus { code: 429 }),
                headers: vec![option("retry-after", "3")],
                body: "{}".into(),
            })),
        };
        let theirs = auth::CheckResponse::decode(&denied.encode_to_vec()[..]).unwrap();
        assert_eq!(theirs.status.as_ref().unwrap().code, 7);
        assert_eq!(theirs.status.as_ref().unwrap().message, "refused");
        let Some(auth::check_response::HttpResponse::DeniedResponse(r)) = theirs.http_response
        else {
            panic!("{theirs:?}")
        };
        assert_eq!(r.status.unwrap().code, 429);
        assert_eq!(r.headers[0].header.as_ref().unwrap().key, "retry-after");
        assert_eq!(r.body, "{}");
    }
}
