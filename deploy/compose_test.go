package deploy_test

import (
	"context"
	"fmt"
	"net/url"
	"path"
	"path/filepath"
	"strconv"
	"time"

	"github.com/compose-spec/compose-go/v2/loader"
	"github.com/compose-spec/compose-go/v2/types"
)

// loadCompose loads a compose file as `docker compose` does: validated
// against the Compose schema (unknown keys fail), interpolated and
// normalised.
func loadCompose(file string) (*types.Project, error) {
	abs, err := filepath.Abs(file)
	if err != nil {
		return nil, err
	}
	return loader.LoadWithContext(context.Background(), types.ConfigDetails{
		WorkingDir:  filepath.Dir(abs),
		ConfigFiles: []types.ConfigFile{{Filename: abs}},
		Environment: types.Mapping{},
	}, func(o *loader.Options) { o.SetProjectName("puzzleq", true) })
}

// checkCompose checks docker-compose.yml against the code.
func checkCompose(f *facts, file string) []string {
	var problems []string
	bad := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	p, err := loadCompose(file)
	if err != nil {
		return []string{"load: " + err.Error()}
	}
	svc := func(name string) (types.ServiceConfig, bool) {
		s, ok := p.Services[name]
		if !ok {
			bad("no service %q", name)
		}
		return s, ok
	}

	// Redis 7 with AOF on a volume, and a healthcheck.
	if r, ok := svc("redis"); ok {
		if r.Image == "" || !hasPrefix(r.Image, "redis:7") {
			bad("redis: image %q, want Redis 7", r.Image)
		}
		args := redisArgs(r.Command)
		for k, v := range map[string]string{"appendonly": "yes", "appendfsync": "everysec", "maxmemory-policy": "noeviction"} {
			if args[k] != v {
				bad("redis: --%s %q, want %q", k, args[k], v)
			}
		}
		dir := args["dir"]
		if dir == "" {
			dir = "/data" // the official image's working directory
		}
		found := false
		for _, v := range r.Volumes {
			found = found || (v.Type == types.VolumeTypeVolume && v.Target == dir)
		}
		if !found {
			bad("redis: no named volume on %s", dir)
		}
		if r.HealthCheck == nil || len(r.HealthCheck.Test) < 2 || r.HealthCheck.Disable {
			bad("redis: no healthcheck")
		}
	}

	images := map[string]bool{}
	for _, name := range []string{"api", "worker"} {
		s, ok := svc(name)
		if !ok {
			continue
		}
		images[s.Image] = true
		if s.Build == nil {
			bad("%s: no build section: `docker compose up --build` would not build it", name)
		}
		if len(s.Command) == 0 || path.Dir(s.Command[0]) != f.binDir || path.Base(s.Command[0]) != name {
			bad("%s: command %v, want %s/%s", name, []string(s.Command), f.binDir, name)
		}
		env := map[string]string{}
		for k, v := range s.Environment {
			if !f.envKnown(name)[k] {
				bad("%s: sets %s, which the %s does not read", name, k, name)
			}
			if v != nil {
				env[k] = *v
			}
		}
		cfg, err := f.load[name](env)
		if err != nil {
			bad("%s: the %s rejects its configuration: %v", name, name, err)
			continue
		}
		port := addrPort(cfg.HTTPAddr)
		if s.StopGracePeriod == nil {
			bad("%s: no stop_grace_period (Docker's default 10s is below DRAIN_TIME %s + SHUTDOWN_TIMEOUT %s)", name, cfg.DrainTime, cfg.ShutdownTimeout)
		} else if g := time.Duration(*s.StopGracePeriod); g < cfg.DrainTime+cfg.ShutdownTimeout+graceMargin {
			bad("%s: stop_grace_period %s is below DRAIN_TIME %s + SHUTDOWN_TIMEOUT %s + margin %s", name, g, cfg.DrainTime, cfg.ShutdownTimeout, graceMargin)
		}
		if d, ok := s.DependsOn["redis"]; !ok || d.Condition != types.ServiceConditionHealthy {
			bad("%s: does not wait for redis to be healthy", name)
		}
		// The image has no shell or curl: the healthcheck runs the
		// healthcheck binary on a path the process serves, on its port.
		hc := s.HealthCheck
		if hc == nil || hc.Disable || len(hc.Test) < 2 || hc.Test[0] != "CMD" {
			bad("%s: want an exec-form healthcheck [CMD ...] (the image has no shell)", name)
		} else if path.Dir(hc.Test[1]) != f.binDir || !f.binaries[path.Base(hc.Test[1])] {
			bad("%s: healthcheck runs %s, which is not in the image", name, hc.Test[1])
		} else {
			u := ""
			for i, a := range hc.Test {
				if a == "-url" && i+1 < len(hc.Test) {
					u = hc.Test[i+1]
				}
			}
			pu, err := url.Parse(u)
			switch {
			case u == "" || err != nil:
				bad("%s: healthcheck has no -url", name)
			case pu.Port() != strconv.Itoa(int(port)):
				bad("%s: healthcheck port %q is not HTTP_ADDR's %d", name, pu.Port(), port)
			case !f.serves(name, pu.Path):
				bad("%s: healthcheck path %s is not served by the %s", name, pu.Path, name)
			}
		}
		if !s.ReadOnly {
			bad("%s: read_only is not set", name)
		}
	}
	if len(images) != 1 {
		bad("api and worker use different images %v", keys(images))
	}

	if a, ok := p.Services["api"]; ok {
		published := false
		for _, pc := range a.Ports {
			published = published || (pc.Target == 8080 && pc.Published == "8080")
		}
		if !published {
			bad("api: port 8080 is not published")
		}
	}
	if w, ok := p.Services["worker"]; ok {
		if w.Deploy == nil || w.Deploy.Replicas == nil || *w.Deploy.Replicas != 3 {
			bad("worker: want deploy.replicas 3")
		}
		if w.ContainerName != "" {
			bad("worker: container_name %q stops --scale worker=N", w.ContainerName)
		}
		if len(w.Ports) != 0 {
			bad("worker: host ports stop --scale worker=N")
		}
	}
	return problems
}

func hasPrefix(s, p string) bool { return len(s) >= len(p) && s[:len(p)] == p }
