//! gRPC's length-prefixed framing ([`framed`], [`unframe`]), a status as
//! headers ([`put_status`]), and
//! `grpc.health.v1`'s two messages (`grpc/health/v1/health.proto`),
//! declared for prost with the proto's field numbers: what the RLS
//! listener's health service answers and what the active check of a gRPC
//! upstream asks. (They replaced tonic-health, whose server and client
//! brought tonic into the gateway's build for two one-field messages.)
//! The tests encode with tonic-health's messages and decode with these,
//! and the other way round.

/// `grpc.health.v1.HealthCheckRequest`.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub(crate) struct HealthCheckRequest {
    /// The service asked about; empty for the server as a whole.
    #[prost(string, tag = "1")]
    pub service: String,
}

/// `grpc.health.v1.HealthCheckResponse`.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub(crate) struct HealthCheckResponse {
    /// A [`ServingStatus`].
    #[prost(enumeration = "ServingStatus", tag = "1")]
    pub status: i32,
}

/// `HealthCheckResponse.ServingStatus`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum ServingStatus {
    /// Not known.
    Unknown = 0,
    /// Serving.
    Serving = 1,
    /// Not serving.
    NotServing = 2,
    /// Only from `Watch`: no such service.
    ServiceUnknown = 3,
}

/// Puts a gRPC status in `headers` (trailers, or the head of a
/// trailers-only answer): `grpc-status: code`, and `grpc-message` when
/// `message` is not empty, percent-encoded as gRPC requires.
pub(crate) fn put_status(headers: &mut http::HeaderMap, code: i32, message: &str) {
    headers.insert("grpc-status", http::HeaderValue::from(code));
    if !message.is_empty()
        && let Ok(v) = http::HeaderValue::from_str(&percent(message))
    {
        headers.insert("grpc-message", v);
    }
}

/// `grpc-message`'s percent-encoding: bytes outside 0x20-0x7E, and `%`.
pub(crate) fn percent(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if (0x20..0x7f).contains(&b) && b != b'%' {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// `message` as one gRPC frame: uncompressed, length-prefixed.
pub(crate) fn framed(message: &impl prost::Message) -> Vec<u8> {
    let len = message.encoded_len();
    let mut out = Vec::with_capacity(5 + len);
    out.push(0);
    out.extend_from_slice(&u32::try_from(len).unwrap_or(u32::MAX).to_be_bytes());
    message
        .encode(&mut out)
        .expect("a Vec grows to take any message");
    out
}

/// The message of a body holding exactly one uncompressed gRPC frame.
pub(crate) fn unframe(body: &[u8]) -> Option<&[u8]> {
    let (head, message) = body.split_at_checked(5)?;
    let len = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
    (head[0] == 0 && len == message.len()).then_some(message)
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message as _;
    use tonic_health::pb as theirs;

    #[test]
    fn the_messages_are_tonic_healths_both_ways() {
        for service in [
            "",
            "envoy.service.ratelimit.v3.RateLimitService",
            &"x".repeat(300),
        ] {
            let ours = HealthCheckRequest {
                service: service.to_owned(),
            };
            let wire = theirs::HealthCheckRequest {
                service: service.to_owned(),
            }
            .encode_to_vec();
            assert_eq!(ours.encode_to_vec(), wire);
            assert_eq!(HealthCheckRequest::decode(&wire[..]).unwrap(), ours);
        }
        use theirs::health_check_response::ServingStatus as Theirs;
        for (ours, theirs) in [
            (ServingStatus::Unknown, Theirs::Unknown),
            (ServingStatus::Serving, Theirs::Serving),
            (ServingStatus::NotServing, Theirs::NotServing),
            (ServingStatus::ServiceUnknown, Theirs::ServiceUnknown),
        ] {
            let wire = theirs::HealthCheckResponse {
                status: theirs as i32,
            }
            .encode_to_vec();
            let decoded = HealthCheckResponse::decode(&wire[..]).unwrap();
            assert_eq!(decoded.status(), ours);
            let back = theirs::HealthCheckResponse::decode(
                &HealthCheckResponse {
                    status: ours as i32,
                }
                .encode_to_vec()[..],
            )
            .unwrap();
            assert_eq!(back.status(), theirs);
        }
    }

    #[test]
    fn a_status_is_its_code_and_its_message_percent_encoded() {
        let mut h = http::HeaderMap::new();
        put_status(&mut h, 8, "rate limited by rule `a`; 100% é\n");
        assert_eq!(h["grpc-status"], "8");
        assert_eq!(
            h["grpc-message"],
            "rate limited by rule `a`; 100%25 %C3%A9%0A"
        );
        let mut h = http::HeaderMap::new();
        put_status(&mut h, 0, "");
        assert_eq!(h["grpc-status"], "0");
        assert!(
            h.get("grpc-message").is_none(),
            "an empty message is left out"
        );
    }

    #[test]
    fn a_frame_is_a_zero_a_length_and_the_message() {
        let m = HealthCheckRequest {
            service: "abc".into(),
        };
        let f = framed(&m);
        assert_eq!(&f[..5], &[0, 0, 0, 0, 5]);
        assert_eq!(unframe(&f), Some(&f[5..]));
        assert_eq!(HealthCheckRequest::decode(unframe(&f).unwrap()).unwrap(), m);
        // Compressed, a length that is not the rest, too short: refused.
        assert_eq!(unframe(&[1, 0, 0, 0, 1, 7]), None);
        assert_eq!(unframe(&[0, 0, 0, 0, 2, 7]), None);
        assert_eq!(unframe(&[0, 0, 0, 0, 1, 7, 8]), None);
        assert_eq!(unframe(&[0, 0, 0]), None);
    }
}
