//! `grpc.health.v1.Health` on the RLS listener, answered as tonic-health
//! and grpc-go answer it: `Check` of a known name is SERVING, of any other
//! NOT_FOUND; `Watch` sends the name's status (SERVICE_UNKNOWN for an
//! unknown one) and stays open until the client goes. The names known are
//! the server as a whole (empty), the rate limit service, and `ratelimit`,
//! which envoyproxy/ratelimit's deployments probe. Their status does not
//! change while the listener serves.

use super::{APPLICATION_GRPC, SERVICE, Status, read_message, send_unary};
use crate::gateway::Gateway;
use crate::wire::grpc::{HealthCheckRequest, HealthCheckResponse, ServingStatus, framed};
use prost::Message as _;

/// Every method's path starts with this.
pub(super) const SERVICE_PATH: &str = "/grpc.health.v1.Health/";

/// A health request is a service's name: a few bytes; 4 KiB is plenty.
const MAX_MESSAGE: usize = 4 << 10;

/// The status of `service`, if it is one of ours.
fn status_of(service: &str) -> Option<ServingStatus> {
    ["", SERVICE, "ratelimit"]
        .contains(&service)
        .then_some(ServingStatus::Serving)
}

/// Answers one call to the health service.
pub(super) async fn call(
    gw: &Gateway,
    req: http::Request<h2::RecvStream>,
    mut respond: h2::server::SendResponse<bytes::Bytes>,
) {
    let watch = match &req.uri().path()[SERVICE_PATH.len()..] {
        "Check" => false,
        "Watch" => true,
        _ => {
            let answer = Err(Status::unimplemented(
                "no such method of grpc.health.v1.Health",
            ));
            return send_unary(&mut respond, answer);
        }
    };
    let asked = match request(gw, req).await {
        Ok(r) => r,
        Err(s) => return send_unary(&mut respond, Err(s)),
    };
    let status = status_of(&asked.service);
    if !watch {
        let answer = match status {
            Some(s) => Ok(answer(s)),
            None => Err(Status::not_found(format!(
                "unknown service `{}`",
                asked.service
            ))),
        };
        return send_unary(&mut respond, answer);
    }
    let mut head = http::Response::new(());
    head.headers_mut()
        .insert(http::header::CONTENT_TYPE, APPLICATION_GRPC);
    let Ok(mut send) = respond.send_response(head, false) else {
        return;
    };
    let first = answer(status.unwrap_or(ServingStatus::ServiceUnknown));
    if send.send_data(first, false).is_err() {
        return;
    }
    // Nothing more to send: the stream stays open until the client resets
    // it or the connection ends (which drops this call).
    let _ = std::future::poll_fn(|cx| send.poll_reset(cx)).await;
}

/// The call's request, read ([`read_message`]) and decoded.
async fn request(
    gw: &Gateway,
    req: http::Request<h2::RecvStream>,
) -> Result<HealthCheckRequest, Status> {
    let message = read_message(gw, req, MAX_MESSAGE).await?;
    HealthCheckRequest::decode(&message[..])
        .map_err(|e| Status::invalid_argument(format!("the request does not decode: {e}")))
}

/// `status` as one framed `HealthCheckResponse`.
fn answer(status: ServingStatus) -> bytes::Bytes {
    framed(&HealthCheckResponse {
        status: status as i32,
    })
    .into()
}
