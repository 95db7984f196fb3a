package worker

import (
	"context"
	"sync"
)

// Cancels maps running task IDs to the cancel functions of their contexts.
type Cancels struct {
	mu sync.Mutex
	m  map[string][]*context.CancelFunc
}

// NewCancels returns an empty registry.
func NewCancels() *Cancels { return &Cancels{m: map[string][]*context.CancelFunc{}} }

func (c *Cancels) register(id string, cancel context.CancelFunc) (release func()) {
	p := &cancel
	c.mu.Lock()
	c.m[id] = append(c.m[id], p)
	c.mu.Unlock()
	return func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		list := c.m[id]
		for i, q := range list {
			if q == p {
				list = append(list[:i], list[i+1:]...)
				break
			}
		}
		if len(list) == 0 {
			delete(c.m, id)
		} else {
			c.m[id] = list
		}
	}
}

// Cancel cancels every running solve of task id in this process.
func (c *Cancels) Cancel(id string) {
	c.mu.Lock()
	list := append([]*context.CancelFunc(nil), c.m[id]...)
	c.mu.Unlock()
	for _, p := range list {
		(*p)()
	}
}

// Running returns how many task IDs are registered, for tests.
func (c *Cancels) Running() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.m)
}
