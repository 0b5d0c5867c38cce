# chaingate's container image: one static binary (the built-in providers run
# as this same binary in plugin mode), the example configs, a non-root user.
#
#   docker build -t chaingate/gateway .
#   docker run -p 8080:8080 -e CHAINGATE_API_TOKENS=... chaingate/gateway
#
# See docs/deployment.md.

FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
# Static: no libc to match in the final image. The commit is stamped from
# .git, which .dockerignore keeps, so "gateway version" names it.
RUN CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o /out/gateway ./cmd/gateway \
 && /out/gateway version \
 && /out/gateway validate configs/ \
 && mkdir -p /out/state

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/gateway /usr/local/bin/gateway
COPY --from=build /src/configs/ /etc/chaingate/
COPY --from=build --chown=nonroot:nonroot /out/state /var/lib/chaingate
USER nonroot:nonroot
WORKDIR /var/lib/chaingate
VOLUME ["/var/lib/chaingate"]
EXPOSE 8080
# The default command listens on every address of the container, where the
# gateway refuses to start without API tokens: set CHAINGATE_API_TOKENS (or
# [gateway.auth] in a mounted config).
HEALTHCHECK --interval=10s --timeout=5s --start-period=10s --retries=3 \
  CMD ["/usr/local/bin/gateway", "health", "--server", "http://127.0.0.1:8080"]
ENTRYPOINT ["/usr/local/bin/gateway"]
CMD ["serve", "--config", "/etc/chaingate", "--listen", "0.0.0.0:8080", "--state", "bolt:///var/lib/chaingate/gateway.db"]
