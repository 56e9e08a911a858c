# syntax=docker/dockerfile:1
#
# ratelimitd: a static binary on a distroless base, running as non-root.
#   docker build -t ratelimitd --build-arg VERSION=$(git describe --tags --always) .
#   docker run --rm -p 8081:8081 -p 8080:8080 ratelimitd
# serves the shipped example config (examples/config) with the in-memory
# backend; mount your own config directory over /etc/ratelimitd/config.
#
# The example config is the binary's default --config (./config, from the
# WORKDIR), not an ENV: envoyproxy/ratelimit's variables (RUNTIME_ROOT,
# REDIS_URL, ...) and RATELIMITD_* both outrank it, so the image is a
# drop-in for envoyproxy/ratelimit's. /bin/ratelimit (that image's binary
# path, used as `command:` by Istio's and Envoy Gateway's manifests) is a
# symlink to /ratelimitd: invoked so, it serves from the environment in
# reference mode (docs/migrating.md).

ARG GO_VERSION=1.26

FROM --platform=$BUILDPLATFORM golang:${GO_VERSION} AS build
ARG TARGETOS
ARG TARGETARCH
ARG VERSION=dev
ARG COMMIT=unknown
WORKDIR /src
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
RUN --mount=type=cache,target=/go/pkg/mod \
    --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 GOOS=${TARGETOS} GOARCH=${TARGETARCH} \
    go build -trimpath \
      -ldflags "-s -w -X main.version=${VERSION} -X main.commit=${COMMIT}" \
      -o /out/ratelimitd ./cmd/ratelimitd && \
    mkdir -p /out/bin && ln -s /ratelimitd /out/bin/ratelimit

FROM gcr.io/distroless/static:nonroot
COPY --from=build /out/ratelimitd /ratelimitd
# A directory copy keeps the symlink a symlink.
COPY --from=build /out/bin/ /bin/
COPY examples/config/ /etc/ratelimitd/config/
WORKDIR /etc/ratelimitd
# 65532 is distroless's "nonroot" user; numeric so runAsNonRoot can verify it.
USER 65532:65532
# gRPC (Envoy RLS v3 + health), HTTP (/healthcheck, /json, /metrics), debug (pprof, /rlconfig).
EXPOSE 8081 8080 6070
ENTRYPOINT ["/ratelimitd", "serve"]
