package promreg_test

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/internal/promreg"
)

func TestRegisterSharesExistingCollector(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	newCounter := func() prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Name: "things_total", Help: "Things."})
	}
	first, err := promreg.Register(reg, newCounter())
	require.NoError(t, err)
	second, err := promreg.Register(reg, newCounter())
	require.NoError(t, err)
	second.Inc()
	require.Same(t, first, second, "the second instance counts into the first one's series")

	_, err = promreg.Register(reg, prometheus.NewGauge(prometheus.GaugeOpts{Name: "things_total", Help: "Other help."}))
	require.Error(t, err, "a different collector under the same name is refused")

	c := newCounter()
	got, err := promreg.Register(nil, c)
	require.NoError(t, err)
	require.Same(t, c, got, "a nil registry registers nothing")
}

func TestBuilderRegistersAsItBuilds(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	build := func() (prometheus.Counter, *prometheus.GaugeVec, error) {
		b := promreg.Builder{Reg: reg, Namespace: "retryd", Subsystem: "test"}
		c := b.Counter("things_total", "Things.")
		g := b.GaugeVec("level", "Level.", "kind")
		return c, g, b.Err()
	}
	c1, g1, err := build()
	require.NoError(t, err)
	c2, g2, err := build()
	require.NoError(t, err)
	require.Same(t, c1, c2, "a second instance counts into the first one's series")
	require.Same(t, g1, g2)
	c2.Inc()
	g2.WithLabelValues("a").Set(2)
	families, err := reg.Gather()
	require.NoError(t, err)
	require.Len(t, families, 2)
	require.Equal(t, "retryd_test_level", families[0].GetName())
	require.Equal(t, "retryd_test_things_total", families[1].GetName())

	b := promreg.Builder{Reg: reg, Namespace: "retryd", Subsystem: "test"}
	b.Gauge("things_total", "Other help.")
	b.Histogram("latency_seconds", "Latency.", prometheus.DefBuckets)
	require.Error(t, b.Err(), "the first error is kept while later metrics are built")
}
