// Package envflag binds a binary's settings to environment variables and
// flags from one table, so the same table documents the defaults, lists
// every variable a manifest may set, and names the field at fault when a
// value is bad. The tables themselves, the binaries' Configs, are in
// internal/app.
package envflag

import (
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"
)

// Var is one setting: its environment name, its flag name, its default
// and where to store it.
type Var struct {
	Env     string // e.g. "REDIS_URL"
	Default string // textual default; "" means empty
	Usage   string
	set     func(string) error
}

// Set is a table of settings.
type Set struct{ vars []Var }

// Vars returns the settings in declaration order.
func (s *Set) Vars() []Var { return s.vars }

// EnvNames returns every environment variable the set reads.
func (s *Set) EnvNames() []string {
	out := make([]string, len(s.vars))
	for i, v := range s.vars {
		out[i] = v.Env
	}
	return out
}

func (s *Set) add(env, def, usage string, set func(string) error) {
	s.vars = append(s.vars, Var{Env: env, Default: def, Usage: usage, set: set})
}

// String binds a string setting.
func (s *Set) String(p *string, env, def, usage string) {
	s.add(env, def, usage, func(v string) error { *p = v; return nil })
}

// Int binds an integer setting.
func (s *Set) Int(p *int, env, def, usage string) {
	s.add(env, def, usage, func(v string) error {
		n, err := strconv.Atoi(strings.TrimSpace(v))
		if err != nil {
			return fmt.Errorf("not an integer: %q", v)
		}
		*p = n
		return nil
	})
}

// Int64 binds a 64-bit integer setting; it accepts a K/M/G/Ki/Mi/Gi suffix.
func (s *Set) Int64(p *int64, env, def, usage string) {
	s.add(env, def, usage, func(v string) error {
		n, err := ParseSize(v)
		if err != nil {
			return err
		}
		*p = n
		return nil
	})
}

// Duration binds a duration setting ("250ms", "24h").
func (s *Set) Duration(p *time.Duration, env, def, usage string) {
	s.add(env, def, usage, func(v string) error {
		d, err := time.ParseDuration(strings.TrimSpace(v))
		if err != nil {
			return fmt.Errorf("not a duration such as 30s: %q", v)
		}
		*p = d
		return nil
	})
}

// Bool binds a boolean setting.
func (s *Set) Bool(p *bool, env, def, usage string) {
	s.add(env, def, usage, func(v string) error {
		b, err := strconv.ParseBool(strings.TrimSpace(v))
		if err != nil {
			return fmt.Errorf("not a boolean: %q", v)
		}
		*p = b
		return nil
	})
}

// FlagName is the flag spelling of an environment name: REDIS_URL ->
// redis-url.
func FlagName(env string) string { return strings.ToLower(strings.ReplaceAll(env, "_", "-")) }

// Load applies defaults, then the environment, then flags from args; the
// last one set wins. Errors name the variable or flag at fault.
func (s *Set) Load(name string, args []string, getenv func(string) string, usageOut io.Writer) error {
	for _, v := range s.vars {
		if err := v.set(v.Default); err != nil && v.Default != "" {
			return fmt.Errorf("default of %s: %w", v.Env, err)
		}
	}
	for _, v := range s.vars {
		if val := getenv(v.Env); val != "" {
			if err := v.set(val); err != nil {
				return fmt.Errorf("%s: %w", v.Env, err)
			}
		}
	}
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	if usageOut != nil {
		fs.SetOutput(usageOut)
	}
	for _, v := range s.vars {
		v := v
		usage := fmt.Sprintf("%s (env %s, default %q)", v.Usage, v.Env, v.Default)
		fs.Func(FlagName(v.Env), usage, func(val string) error { return v.set(val) })
	}
	return fs.Parse(args)
}

// ParseSize parses "1048576", "1Mi", "16MiB", "10k".
func ParseSize(v string) (int64, error) {
	t := strings.TrimSpace(v)
	mult := int64(1)
	for _, suf := range []struct {
		s string
		m int64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"Ki", 1 << 10}, {"Mi", 1 << 20}, {"Gi", 1 << 30},
		{"k", 1000}, {"K", 1000}, {"M", 1000 * 1000}, {"G", 1000 * 1000 * 1000}} {
		if strings.HasSuffix(t, suf.s) {
			t, mult = strings.TrimSuffix(t, suf.s), suf.m
			break
		}
	}
	n, err := strconv.ParseInt(t, 10, 64)
	if err != nil || n < 0 || (mult > 1 && n > (1<<62)/mult) {
		return 0, fmt.Errorf("not a size such as 1048576 or 1Mi: %q", v)
	}
	return n * mult, nil
}

// ParseWeights parses queue weights "interactive=6,bulk=1".
func ParseWeights(v string) (map[string]int, error) {
	out := map[string]int{}
	for _, part := range strings.Split(v, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		name, w, ok := strings.Cut(part, "=")
		n, err := strconv.Atoi(strings.TrimSpace(w))
		if !ok || err != nil || n < 1 || strings.TrimSpace(name) == "" {
			return nil, fmt.Errorf("expected queue=weight pairs such as interactive=6,bulk=1, got %q", part)
		}
		out[strings.TrimSpace(name)] = n
	}
	return out, nil
}
