# syntax=docker/dockerfile:1
# puzzleq's one image: api, worker, puzzlectl and healthcheck, static, on
# distroless (no shell, no package manager), running as a non-root user.
#   docker build -t puzzleq .
#   docker run --rm -p 8080:8080 puzzleq                  # the API, embedded
#   docker run --rm puzzleq /usr/local/bin/worker         # needs REDIS_URL

FROM golang:1.26.8-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
# The build line lives in scripts/build.sh, which the tests run as well.
RUN sh scripts/build.sh /out

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/ /usr/local/bin/
# 65532 is distroless's "nonroot" user.
USER 65532:65532
EXPOSE 8080 8081
CMD ["/usr/local/bin/api"]
