package app

import (
	"context"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/puzzleq/puzzleq/internal/api"
	"github.com/puzzleq/puzzleq/internal/store"
)

// setWeights records the keys' weights in the share of solver slots,
// which the workers' slot scripts read from Redis. A failed write is only
// logged: the weights written last (or 1 for every key) stay in force
// until the next API start writes them.
func setWeights(st *store.Store, keys []api.APIKey, log *slog.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), redisIOTimeout)
	defer cancel()
	if err := st.SetWeights(ctx, keyWeights(keys)); err != nil {
		log.Warn("could not record the API keys' weights in Redis; the last ones written stay in force", "err", err)
	}
}

// slotsCollector reports, per API key with expensive work, the solver
// slots it holds and its runs waiting for one (cluster-wide, from Redis).
// The label is the key's name, never its secret.
type slotsCollector struct{ st *store.Store }

var (
	slotsHeldDesc = prometheus.NewDesc("puzzleq_slots_held",
		"Solver slots an API key's expensive runs hold (cluster-wide, from Redis).", []string{"key"}, nil)
	slotsWaitingDesc = prometheus.NewDesc("puzzleq_waiting",
		"Expensive runs of an API key parked until a solver slot goes to them, which asynq counts in its retry sets (cluster-wide, from Redis).", []string{"key"}, nil)
)

func (c slotsCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- slotsHeldDesc
	ch <- slotsWaitingDesc
}

func (c slotsCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), redisIOTimeout)
	defer cancel()
	uses, err := c.st.SlotUses(ctx)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(slotsHeldDesc, err)
		return
	}
	for _, u := range uses {
		ch <- prometheus.MustNewConstMetric(slotsHeldDesc, prometheus.GaugeValue, float64(u.Held), u.Owner)
		ch <- prometheus.MustNewConstMetric(slotsWaitingDesc, prometheus.GaugeValue, float64(u.Waiting), u.Owner)
	}
}
