package worker

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the worker's Prometheus metrics.
type Metrics struct {
	Tasks        *prometheus.CounterVec
	CacheHits    prometheus.Counter
	SolveSeconds *prometheus.HistogramVec
	// Searches counts the expensive solves a worker started: with
	// identical submissions joined, one per puzzle in flight.
	Searches *prometheus.CounterVec
	// Joins counts expensive tasks that joined another run's solve.
	Joins prometheus.Counter
	// Waits counts the times an expensive task waited for a slot of its
	// key (MAX_EXPENSIVE_PER_KEY).
	Waits prometheus.Counter
	// WebhookAttempts counts webhook delivery attempts by outcome:
	// delivered, or failed (a non-2xx or no answer).
	WebhookAttempts *prometheus.CounterVec
	// WebhookWaits counts deliveries put back to wait because every
	// delivery slot of the worker was taken and their key held its share;
	// WebhookPreemptions, deliveries canceled because another key's took
	// their slot (DeliveryPool).
	WebhookWaits, WebhookPreemptions prometheus.Counter
}

// NewMetrics registers the worker metrics on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Tasks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "puzzleq_tasks_total", Help: "Tasks ended by a worker, by kind and outcome (completed or a failure code).",
		}, []string{"kind", "outcome"}),
		CacheHits: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "puzzleq_worker_cache_hits_total", Help: "Items a worker answered from the cache instead of solving.",
		}),
		SolveSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "puzzleq_solve_duration_seconds", Help: "Time spent in a solver per item.",
			Buckets: prometheus.ExponentialBuckets(0.00001, 4, 12),
		}, []string{"kind"}),
		WebhookAttempts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "puzzleq_webhook_attempts_total", Help: "Webhook delivery attempts, by outcome (delivered or failed).",
		}, []string{"outcome"}),
	}
	m.Searches = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "puzzleq_expensive_solves_total", Help: "Expensive solves a worker started, by kind (identical tasks in flight share one).",
	}, []string{"kind"})
	m.Joins = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "puzzleq_solve_joins_total", Help: "Expensive tasks that joined an identical puzzle's solve in flight instead of solving it.",
	})
	m.Waits = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "puzzleq_expensive_waits_total", Help: "Times an expensive task was put back to wait because its key held all its slots.",
	})
	m.WebhookWaits = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "puzzleq_webhook_waits_total", Help: "Webhook deliveries put back to wait: every delivery slot of the worker was taken, and their key held its share.",
	})
	m.WebhookPreemptions = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "puzzleq_webhook_preemptions_total", Help: "Webhook deliveries canceled, to be retried, because a key holding fewer delivery slots took theirs.",
	})
	reg.MustRegister(m.Tasks, m.CacheHits, m.SolveSeconds, m.Searches, m.Joins, m.Waits, m.WebhookAttempts, m.WebhookWaits, m.WebhookPreemptions)
	return m
}
