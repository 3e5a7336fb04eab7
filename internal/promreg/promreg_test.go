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
