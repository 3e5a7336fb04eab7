package main

import (
	"bytes"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A period that starts before retention's cutoff says so; one after it
// does not.
func TestPrintAnalyticsSaysWhenPartial(t *testing.T) {
	t.Parallel()
	cut := time.Date(2026, 10, 27, 0, 0, 0, 0, time.UTC)
	for _, partial := range []bool{true, false} {
		var out bytes.Buffer
		g := &globals{stdout: &out}
		require.NoError(t, printAnalytics(g, analyticsView{Since: cut.Add(-time.Hour), Until: cut.Add(time.Hour), CompleteFrom: &cut, Partial: partial}))
		if partial {
			require.Contains(t, out.String(), "Partial: retention removed what is older than "+cut.Local().Format(time.RFC3339))
		} else {
			require.NotContains(t, out.String(), "Partial")
		}
	}
}
