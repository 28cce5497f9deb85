//! A gRPC server for the gateway's gRPC bench (`bench/grpc.sh`): tonic's
//! own `grpc.health.v1` service (every service SERVING), on the address
//! given, until killed.
//!
//!     cargo run --release -p ratewarden-gateway --example grpc_server -- 127.0.0.1:50051

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let addr: std::net::SocketAddr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:50051".into())
        .parse()
        .expect("an address");
    let (reporter, health) = tonic_health::server::health_reporter();
    reporter
        .set_service_status("", tonic_health::ServingStatus::Serving)
        .await;
    tonic::transport::Server::builder()
        .add_service(health)
        .serve(addr)
        .await
        .expect("the server");
}
