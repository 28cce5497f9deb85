# syntax=docker/dockerfile:1
# A multi-stage build: compile in the Rust image, run in a slim one as an
# unprivileged user. `docker build -t ratewarden .`, then
#   docker run -p 8080:8080 -e UPSTREAM=http://your-api:9000 ratewarden
FROM rust:1-slim-bookworm AS build
WORKDIR /src
# aws-lc-rs builds its C with the image's compiler.
RUN apt-get update && apt-get install -y --no-install-recommends g++ && rm -rf /var/lib/apt/lists/*
COPY . .
RUN cargo build --release --locked --bin ratewarden \
 && strip target/release/ratewarden

FROM debian:bookworm-slim
# The system trust store, for https upstreams and rediss://.
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin ratewarden
COPY --from=build /src/target/release/ratewarden /usr/local/bin/ratewarden
COPY deploy/docker.yaml /etc/ratewarden/ratewarden.yaml
USER 10001:10001
ENV NO_COLOR=1
EXPOSE 8080
HEALTHCHECK --interval=10s --timeout=3s --start-period=5s --retries=3 \
  CMD ["ratewarden", "healthcheck", "127.0.0.1:9090"]
STOPSIGNAL SIGTERM
ENTRYPOINT ["ratewarden", "serve", "-c", "/etc/ratewarden/ratewarden.yaml"]
