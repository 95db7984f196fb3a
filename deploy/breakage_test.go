package deploy_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// dig walks maps (string keys) and lists (int indexes) of a decoded object.
func dig(v any, path ...any) any {
	for _, p := range path {
		switch k := p.(type) {
		case string:
			v = v.(map[string]any)[k]
		case int:
			v = v.([]any)[k]
		}
	}
	return v
}

func find(objs []map[string]any, kind, name string) map[string]any {
	for _, o := range objs {
		if o["kind"] == kind && dig(o, "metadata", "name") == name {
			return o
		}
	}
	panic("no " + kind + "/" + name)
}

// generated finds the object a kustomize generator named name made (its
// name is name and a hash of its data).
func generated(objs []map[string]any, kind, name string) map[string]any {
	for _, o := range objs {
		n, _ := dig(o, "metadata", "name").(string)
		if base, _, ok := cutHash(n); o["kind"] == kind && ok && base == name {
			return o
		}
	}
	panic("no generated " + kind + "/" + name)
}

func container(objs []map[string]any, kind, name string) map[string]any {
	return dig(find(objs, kind, name), "spec", "template", "spec", "containers", 0).(map[string]any)
}

// TestChecksCatchBrokenManifests breaks a rendered overlay or the compose
// file on purpose, one way at a time, and asserts that the checks report
// it: a check that cannot fail proves nothing.
func TestChecksCatchBrokenManifests(t *testing.T) {
	f := newFacts(t)
	k8sCases := []struct {
		name, overlay string
		mutate        func([]map[string]any)
		want          string
	}{
		{"misspelt field", "deploy/k8s/base", func(o []map[string]any) {
			probe := dig(container(o, "Deployment", "api"), "readinessProbe", "httpGet").(map[string]any)
			probe["pth"] = probe["path"]
			delete(probe, "path")
		}, `Deployment/api: strict decoding: error unmarshaling JSON: while decoding JSON: json: unknown field "pth"`},
		{"wrong probe path", "deploy/k8s/base", func(o []map[string]any) {
			dig(container(o, "Deployment", "worker"), "livenessProbe", "httpGet").(map[string]any)["path"] = "/health"
		}, "liveness probe path /health is not served by the worker"},
		{"api probe on a route it lacks", "deploy/k8s/base", func(o []map[string]any) {
			dig(container(o, "Deployment", "api"), "readinessProbe", "httpGet").(map[string]any)["path"] = "/ready"
		}, "readiness probe path /ready is not served by the api"},
		{"probe on the wrong port", "deploy/k8s/base", func(o []map[string]any) {
			dig(container(o, "Deployment", "worker"), "readinessProbe", "httpGet").(map[string]any)["port"] = 8080
		}, "readiness probe port 8080 is not the worker's HTTP_ADDR port 8081"},
		{"unknown env var", "deploy/k8s/base", func(o []map[string]any) {
			c := container(o, "Deployment", "worker")
			c["env"] = append(c["env"].([]any), map[string]any{"name": "WORKER_THREADS", "value": "4"})
		}, "sets WORKER_THREADS, which the worker does not read"},
		{"api-only var in the shared ConfigMap", "deploy/k8s/base", func(o []map[string]any) {
			generated(o, "ConfigMap", "puzzleq-config")["data"].(map[string]any)["MAX_WAIT"] = "30s"
		}, "sets MAX_WAIT, which the worker does not read"},
		{"ConfigMap data edited under the same name", "deploy/k8s/base", func(o []map[string]any) {
			generated(o, "ConfigMap", "puzzleq-config")["data"].(map[string]any)["LOG_LEVEL"] = "warn"
		}, "its name carries no hash of its data"},
		{"ConfigMap with a fixed name", "deploy/k8s/overlays/dev", func(o []map[string]any) {
			cm := generated(o, "ConfigMap", "puzzleq-config")
			old := dig(cm, "metadata", "name")
			dig(cm, "metadata").(map[string]any)["name"] = "puzzleq-config"
			for _, d := range []string{"api", "worker"} {
				for _, e := range container(o, "Deployment", d)["envFrom"].([]any) {
					if r := dig(e, "configMapRef").(map[string]any); r["name"] == old {
						r["name"] = "puzzleq-config"
					}
				}
			}
		}, "ConfigMap/puzzleq-config: its name carries no hash of its data"},
		{"grace period below the timeout", "deploy/k8s/base", func(o []map[string]any) {
			dig(find(o, "Deployment", "worker"), "spec", "template", "spec").(map[string]any)["terminationGracePeriodSeconds"] = 20
		}, "terminationGracePeriodSeconds 20s is below preStop 0s + DRAIN_TIME 0s + SHUTDOWN_TIMEOUT 25s"},
		{"timeout raised past the grace period", "deploy/k8s/overlays/dev", func(o []map[string]any) {
			for _, e := range container(o, "Deployment", "api")["env"].([]any) {
				if e := e.(map[string]any); e["name"] == "SHUTDOWN_TIMEOUT" {
					e["value"] = "1m"
				}
			}
		}, "terminationGracePeriodSeconds 30s is below preStop 5s + DRAIN_TIME 2s + SHUTDOWN_TIMEOUT 1m0s"},
		{"service selects nothing", "deploy/k8s/base", func(o []map[string]any) {
			dig(find(o, "Service", "api"), "spec", "selector").(map[string]any)["app.kubernetes.io/component"] = "apis"
		}, "Service/api: selector map[app.kubernetes.io/component:apis app.kubernetes.io/name:puzzleq] matches no pod template"},
		{"no limits", "deploy/k8s/base", func(o []map[string]any) {
			delete(dig(container(o, "StatefulSet", "redis"), "resources").(map[string]any), "limits")
		}, "StatefulSet/redis container redis: no memory limit"},
		{"writable root filesystem", "deploy/k8s/base", func(o []map[string]any) {
			dig(container(o, "Deployment", "worker"), "securityContext").(map[string]any)["readOnlyRootFilesystem"] = false
		}, "Deployment/worker container worker: readOnlyRootFilesystem is not true"},
		{"image drift", "deploy/k8s/base", func(o []map[string]any) {
			c := container(o, "Deployment", "worker")
			c["image"] = strings.Split(c["image"].(string), ":")[0] + ":0.0.9"
		}, "puzzleq containers use 2 images"},
		{"redis without AOF", "deploy/k8s/base", func(o []map[string]any) {
			cmd := container(o, "StatefulSet", "redis")["command"].([]any)
			for i := range cmd {
				if cmd[i] == "--appendonly" {
					cmd[i+1] = "no"
				}
			}
		}, `--appendonly "no", want "yes"`},
		{"everyone reaches redis", "deploy/k8s/base", func(o []map[string]any) {
			rule := dig(find(o, "NetworkPolicy", "redis"), "spec", "ingress", 0).(map[string]any)
			rule["from"] = append(rule["from"].([]any), map[string]any{"podSelector": map[string]any{}})
		}, "an empty podSelector lets every pod reach Redis"},
		{"wrong scrape port", "deploy/k8s/base", func(o []map[string]any) {
			dig(find(o, "Deployment", "api"), "spec", "template", "metadata", "annotations").(map[string]any)["prometheus.io/port"] = "8080"
		}, `prometheus.io/port "8080", want the /metrics port 9090`},
		{"api with auth off", "deploy/k8s/overlays/prod", func(o []map[string]any) {
			c := container(o, "Deployment", "api")
			var env []any
			for _, e := range c["env"].([]any) {
				if e.(map[string]any)["name"] != "API_KEYS_FILE" {
					env = append(env, e)
				}
			}
			c["env"] = env
		}, "no API_KEYS_FILE: the api would serve every route without auth"},
		{"keys file not from the Secret", "deploy/k8s/base", func(o []map[string]any) {
			c := container(o, "Deployment", "api")
			for _, e := range c["env"].([]any) {
				if e := e.(map[string]any); e["name"] == "API_KEYS_FILE" {
					e["value"] = "/tmp/keys.json"
				}
			}
		}, "API_KEYS_FILE /tmp/keys.json is not a file of a mounted Secret"},
		{"KEDA list of a queue that is not ours", "deploy/k8s/overlays/prod", func(o []map[string]any) {
			dig(find(o, "ScaledObject", "worker"), "spec", "triggers", 1, "metadata").(map[string]any)["listName"] = "asynq:bulk:pending"
		}, "triggers on lists [asynq:bulk:pending asynq:{bulk}:retry asynq:{cheap-bulk}:pending asynq:{cheap-bulk}:retry asynq:{cheap}:pending asynq:{cheap}:retry asynq:{interactive}:pending asynq:{interactive}:retry pq:backlog], want each queue's pending list and retry set, and the backlog [asynq:{bulk}:pending asynq:{bulk}:retry asynq:{cheap-bulk}:pending asynq:{cheap-bulk}:retry asynq:{cheap}:pending asynq:{cheap}:retry asynq:{interactive}:pending asynq:{interactive}:retry pq:backlog]"},
		{"KEDA blind to the backlog", "deploy/k8s/overlays/prod", func(o []map[string]any) {
			so := dig(find(o, "ScaledObject", "worker"), "spec").(map[string]any)
			so["triggers"] = append(so["triggers"].([]any)[:2], so["triggers"].([]any)[3:]...)
		}, "want each queue's pending list and retry set, and the backlog [asynq:{bulk}:pending asynq:{bulk}:retry asynq:{cheap-bulk}:pending asynq:{cheap-bulk}:retry asynq:{cheap}:pending asynq:{cheap}:retry asynq:{interactive}:pending asynq:{interactive}:retry pq:backlog]"},
		{"KEDA blind to parked work", "deploy/k8s/overlays/prod", func(o []map[string]any) {
			so := dig(find(o, "ScaledObject", "worker"), "spec").(map[string]any)
			so["triggers"] = so["triggers"].([]any)[:3]
		}, "want each queue's pending list and retry set, and the backlog"},
		{"KEDA misspelt trigger field", "deploy/k8s/overlays/prod", func(o []map[string]any) {
			m := dig(find(o, "ScaledObject", "worker"), "spec", "triggers", 0, "metadata").(map[string]any)
			m["listname"] = m["listName"]
		}, `unknown redis trigger field "listname"`},
	}
	for _, tc := range k8sCases {
		t.Run(tc.name, func(t *testing.T) {
			objs, err := render(overlayDir(tc.overlay))
			if err != nil {
				t.Fatal(err)
			}
			if p := checkK8s(f, expectFor(tc.overlay), objs); len(p) != 0 {
				t.Fatalf("unbroken overlay has problems: %v", p)
			}
			tc.mutate(objs)
			problems := checkK8s(f, expectFor(tc.overlay), objs)
			assertReported(t, problems, tc.want)
		})
	}

	composeCases := []struct{ name, old, new, want string }{
		{"misspelt field", "stop_grace_period: 40s", "stop_grace_periods: 40s",
			"services.worker.stop_grace_periods"},
		{"grace below the worker's timeout", "stop_grace_period: 40s", "stop_grace_period: 20s",
			"worker: stop_grace_period 20s is below DRAIN_TIME 0s + SHUTDOWN_TIMEOUT 25s"},
		{"unknown env var", "SHUTDOWN_TIMEOUT: 25s", "SHUTDOWN_TIMEOUT: 25s\n      WORKER_THREADS: \"4\"",
			"worker: sets WORKER_THREADS, which the worker does not read"},
		{"healthcheck on a path the worker lacks", "http://127.0.0.1:8081/readyz", "http://127.0.0.1:8081/ready",
			"worker: healthcheck path /ready is not served by the worker"},
		{"healthcheck through a shell", `test: ["CMD", "/usr/local/bin/healthcheck", "-url", "http://127.0.0.1:8080/readyz"]`,
			`test: ["CMD-SHELL", "curl -f http://127.0.0.1:8080/readyz"]`, "api: want an exec-form healthcheck"},
		{"one worker", "replicas: 3", "replicas: 1", "worker: want deploy.replicas 3"},
		{"fsync always", "- everysec", "- always", `redis: --appendfsync "always", want "everysec"`},
		{"fixed worker name", "    image: puzzleq:local\n    command: [\"/usr/local/bin/worker\"]",
			"    image: puzzleq:local\n    container_name: worker\n    command: [\"/usr/local/bin/worker\"]",
			"can't set container_name and worker as container name must be unique"},
	}
	orig := readFile(t, filepath.Join(root, "docker-compose.yml"))
	for _, tc := range composeCases {
		t.Run("compose/"+tc.name, func(t *testing.T) {
			if strings.Count(orig, tc.old) < 1 {
				t.Fatalf("docker-compose.yml no longer contains %q", tc.old)
			}
			broken := strings.Replace(orig, tc.old, tc.new, 1)
			if tc.name == "grace below the worker's timeout" || tc.name == "misspelt field" {
				// the worker's is the second stop_grace_period
				i := strings.Index(orig, "stop_grace_period: 25s")
				if i < 0 || strings.Index(orig, tc.old) < i {
					t.Fatalf("the worker's stop_grace_period moved")
				}
			}
			file := filepath.Join(t.TempDir(), "docker-compose.yml")
			if err := os.WriteFile(file, []byte(broken), 0o644); err != nil {
				t.Fatal(err)
			}
			assertReported(t, checkCompose(f, file), tc.want)
		})
	}
}

func expectFor(dir string) expect {
	for _, e := range overlays {
		if e.dir == dir {
			return e
		}
	}
	panic(dir)
}

func assertReported(t *testing.T, problems []string, want string) {
	t.Helper()
	for _, p := range problems {
		if strings.Contains(p, want) {
			t.Logf("reported: %s", p)
			return
		}
	}
	t.Errorf("the checks missed it: want a problem containing %q, got %d:\n%s", want, len(problems), strings.Join(problems, "\n"))
}
