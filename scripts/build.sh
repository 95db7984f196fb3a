#!/bin/sh
# Builds puzzleq's static, path-free binaries into the directory $1
# (default ./bin). This is the one build line: the Dockerfile runs this
# script, and deploy/deploy_test.go runs it too and checks that every
# binary is statically linked, so the image cannot drift from CI.
set -eu
out="${1:-bin}"
mkdir -p "$out"
CGO_ENABLED=0 go build -trimpath -buildvcs=false -ldflags="-s -w" -o "$out/" \
	./cmd/api ./cmd/worker ./cmd/puzzlectl ./cmd/healthcheck
