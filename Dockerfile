# The container image of mongobouncer, built from source with Docker or Podman:
#
#   docker build --build-arg VERSION="$(git describe --tags --always)" \
#     --build-arg REVISION="$(git rev-parse HEAD)" -t mongobouncer .
#
# VERSION and REVISION are optional: they become the binary's --version and
# the image's OCI labels (.git is not in the build context, see .dockerignore).
# The image is FROM scratch: the static binary (/mongobouncer), CA
# certificates, a non-root user (65532, "nonroot"), an empty /tmp and a
# default configuration (deploy/image/rootfs/etc/mongobouncer/mongobouncer.toml).
# `make image` builds the same final stage from a prebuilt binary with buildah
# (deploy/image/Dockerfile.prebuilt); README.md, "Deploy", says how to run it.

FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=
ARG REVISION=
RUN mkdir -p /rootfs/tmp /rootfs/etc/ssl/certs \
 && CGO_ENABLED=0 go build -trimpath \
      -ldflags "-s -w ${VERSION:+-X main.version=$VERSION} ${REVISION:+-X main.revision=$REVISION}" \
      -o /rootfs/mongobouncer ./cmd/mongobouncer \
 && cp -R deploy/image/rootfs/. /rootfs/ \
 && cp /etc/ssl/certs/ca-certificates.crt /rootfs/etc/ssl/certs/ \
 && chmod -R a+rX,go-w /rootfs \
 && chmod 1777 /rootfs/tmp

# Everything from FROM down is the final stage of
# deploy/image/Dockerfile.prebuilt, except the COPY line: keep the two
# identical (deploy/image's test compares them).
FROM scratch
ARG VERSION=
ARG REVISION=
COPY --from=build /rootfs/ /
USER 65532:65532
# The only writable place mongobouncer may need: the root filesystem can be
# read-only (docker run --read-only).
VOLUME ["/tmp"]
# Clients; the admin HTTP listener (metrics, health, status page).
EXPOSE 27017 9216
LABEL org.opencontainers.image.title="mongobouncer" \
      org.opencontainers.image.description="A connection pooler for MongoDB" \
      org.opencontainers.image.source="https://github.com/mongobouncer/mongobouncer" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}"
ENTRYPOINT ["/mongobouncer"]
CMD ["--config", "/etc/mongobouncer/mongobouncer.toml"]
