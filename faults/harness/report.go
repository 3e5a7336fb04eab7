package harness

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// Full reports whether the suite runs at full size (RETRYD_FAULTS=full,
// the counts docs/reliability.md gives per scenario) rather than the short
// default.
func Full() bool { return os.Getenv("RETRYD_FAULTS") == "full" }

// Size is short in the default mode and full with RETRYD_FAULTS=full;
// RETRYD_FAULTS_SCALE (a float) multiplies the short size, for runs in
// between.
func Size(short, full int) int {
	if Full() {
		return full
	}
	if v, err := strconv.ParseFloat(os.Getenv("RETRYD_FAULTS_SCALE"), 64); err == nil && v > 0 {
		return max(1, int(float64(short)*v))
	}
	return short
}

// Report is the figures every scenario prints.
type Report struct {
	Scenario string
	// Sent is the number of items put in (acknowledged by the system).
	Sent int
	// Lost is the number of items with no outcome at the end.
	Lost int
	// DuplicateEffects counts effects that happened more than once.
	DuplicateEffects int
	// Absorbed counts duplicates that deduplication (Nats-Msg-Id, inbox,
	// unique keys, idempotency keys) caught before they became effects.
	Absorbed int
	// Recover is how long the system took to reach the end state after
	// the last fault.
	Recover time.Duration
	// Faults says what was injected.
	Faults []string
	Notes  []string
}

var reportMu sync.Mutex

// Print logs the report and appends it to the file RETRYD_FAULTS_REPORT
// names, if set.
func (r *Report) Print(t testing.TB) {
	t.Helper()
	line := fmt.Sprintf("FAULTS %-44s mode=%s sent=%d lost=%d duplicate_effects=%d absorbed=%d recover=%s",
		r.Scenario, mode(), r.Sent, r.Lost, r.DuplicateEffects, r.Absorbed, r.Recover.Round(time.Millisecond))
	var b strings.Builder
	b.WriteString(line)
	for _, f := range r.Faults {
		b.WriteString("\n    fault: " + f)
	}
	for _, n := range r.Notes {
		b.WriteString("\n    note: " + n)
	}
	t.Log(b.String())
	if path := os.Getenv("RETRYD_FAULTS_REPORT"); path != "" {
		reportMu.Lock()
		defer reportMu.Unlock()
		f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err == nil {
			fmt.Fprintln(f, b.String())
			f.Close()
		}
	}
}

// Fault records an injected fault with the time it happened.
func (r *Report) Fault(format string, args ...any) {
	r.Faults = append(r.Faults, time.Now().Format("15:04:05.000")+" "+fmt.Sprintf(format, args...))
}

// Note adds a figure or remark.
func (r *Report) Note(format string, args ...any) {
	r.Notes = append(r.Notes, fmt.Sprintf(format, args...))
}

func mode() string {
	if Full() {
		return "full"
	}
	return "short"
}
