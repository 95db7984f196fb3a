// Package deploy holds puzzleq's deployment files: deploy/k8s (kustomize
// base and overlays) and deploy/grafana (the dashboard). Its tests render
// them, and the Dockerfile and docker-compose.yml at the repository root,
// and check them against the code: probe paths against the routes the
// binaries serve, environment variables against the Config each binary
// reads, grace periods against the shutdown timeouts, queue keys against
// tasks.Queues and tasks.CheapQueues.
package deploy
