package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// cost is a snapshot of the resources work consumes: this process's CPU
// time (client, API and workers together) and, with our own stack, the
// redis-server's CPU time and command count. Per-task costs are far less
// sensitive to a noisy shared machine than rates are.
type cost struct {
	cpu       time.Duration
	redisCPU  time.Duration
	redisCmds int64
	ok        bool // redis figures are valid
}

func (lg *loadgen) sampleCost(ctx context.Context) cost {
	var c cost
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) == nil {
		c.cpu = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	if lg.st == nil {
		return c
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	info, err := lg.st.RDB.Info(ctx, "stats", "cpu").Result()
	if err != nil {
		return c
	}
	f := infoFields(info)
	n, err1 := strconv.ParseInt(f["total_commands_processed"], 10, 64)
	u, err2 := strconv.ParseFloat(f["used_cpu_user"], 64)
	s, err3 := strconv.ParseFloat(f["used_cpu_sys"], 64)
	if err1 == nil && err2 == nil && err3 == nil {
		c.redisCmds, c.redisCPU, c.ok = n, time.Duration((u+s)*float64(time.Second)), true
	}
	return c
}

func infoFields(info string) map[string]string {
	m := map[string]string{}
	for line := range strings.SplitSeq(info, "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), ":"); ok {
			m[k] = v
		}
	}
	return m
}

// costSum accumulates the cost of one scenario over its slices.
type costSum struct {
	cpu, redisCPU time.Duration
	redisCmds     int64
	ok            bool
}

func (s *costSum) add(before, after cost) {
	s.cpu += after.cpu - before.cpu
	if before.ok && after.ok {
		s.redisCPU += after.redisCPU - before.redisCPU
		s.redisCmds += after.redisCmds - before.redisCmds
		s.ok = true
	}
}

// PerTask is what one completed task cost.
type PerTask struct {
	// CPUMs is this process's CPU (loadgen's clients, the API and the
	// workers) per task, in milliseconds.
	CPUMs float64 `json:"process_cpu_ms"`
	// RedisCPUMs is redis-server's CPU per task, in milliseconds.
	RedisCPUMs float64 `json:"redis_cpu_ms,omitempty"`
	// RedisCmds is Redis commands per task, commands run inside Lua
	// scripts included.
	RedisCmds float64 `json:"redis_commands,omitempty"`
}

func (s *costSum) perTask(n int) *PerTask {
	if n == 0 {
		return nil
	}
	p := &PerTask{CPUMs: ms(s.cpu) / float64(n)}
	if s.ok {
		p.RedisCPUMs = ms(s.redisCPU) / float64(n)
		p.RedisCmds = float64(s.redisCmds) / float64(n)
	}
	return p
}

// String is the one-line form used in the table.
func (p *PerTask) String() string {
	if p == nil {
		return ""
	}
	s := fmt.Sprintf("per task: %.3f ms CPU in this process", p.CPUMs)
	if p.RedisCmds > 0 {
		s += fmt.Sprintf(", %.3f ms redis-server CPU, %.1f Redis commands", p.RedisCPUMs, p.RedisCmds)
	}
	return s
}
