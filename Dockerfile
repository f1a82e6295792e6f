# A small runtime image with the `reshard` binary:
#   docker build -t reshard .
#   docker run --rm -e RESHARD_DATABASE_URL=postgres://... reshard migration list
#   docker run --rm -p 9187:9187 -e RESHARD_DATABASE_URL=... reshard exporter --metrics-addr :9187
#   docker run --rm -p 27018:27018 -e RESHARD_DATABASE_URL=... reshard front --listen 0.0.0.0:27018 ...
# The build stage's Rust is the crate's rust-version (Cargo.toml; tests/packaging.rs keeps it
# true); the build uses Cargo.lock as it is (--locked). Nothing here needs OpenSSL: TLS is
# rustls, built in.

FROM rust:1.89-slim-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src src
COPY migrations migrations
COPY benches benches
COPY examples examples
COPY tests tests
RUN cargo build --release --locked --bin reshard \
    && strip target/release/reshard

FROM debian:bookworm-slim
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --no-create-home reshard
COPY --from=build /src/target/release/reshard /usr/local/bin/reshard
COPY playbooks /usr/share/reshard/playbooks
USER reshard
ENTRYPOINT ["reshard"]
CMD ["--help"]
