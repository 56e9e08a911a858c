# syntax=docker/dockerfile:1
#
# ratelimitd: a static binary on a distroless base, running as non-root.
#   docker build -t ratelimitd --build-arg VERSION=$(git describe --tags --always) .
#   docker run --rm -p 8081:8081 -p 8080:8080 ratelimitd
# serves the shipped example config (examples/config) with the in-memory
# backend; mount your own config directory over /etc/ratelimitd/config.

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
      -o /out/ratelimitd ./cmd/ratelimitd

FROM gcr.io/distroless/static:nonroot
COPY --from=build /out/ratelimitd /ratelimitd
COPY examples/config/ /etc/ratelimitd/config/
ENV RATELIMITD_CONFIG=/etc/ratelimitd/config
# 65532 is distroless's "nonroot" user; numeric so runAsNonRoot can verify it.
USER 65532:65532
# gRPC (Envoy RLS v3 + health), HTTP (/healthcheck, /json, /metrics), debug (pprof, /rlconfig).
EXPOSE 8081 8080 6070
ENTRYPOINT ["/ratelimitd", "serve"]
