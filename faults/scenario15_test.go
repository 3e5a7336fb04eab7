package faults_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/retryd/retryd/faults/harness"
)

// readyWithin is how soon /readyz must follow a lost or returned
// dependency (docs/operations.md).
const readyWithin = 5 * time.Second

// Scenario 15: /readyz follows the backends. Postgres is stopped, then
// NATS: every service's /readyz turns 503 within 5 s, naming what it lost,
// so a load balancer or Kubernetes stops sending it traffic; once the
// backend is back, /readyz is 200 again.
func TestScenario15ReadinessFollowsBackends(t *testing.T) {
	t.Parallel()
	pg := ownPostgres(t, "retryd")
	s := setup(t, harness.Options{DatabaseURL: pg.URL("retryd")})
	r := &harness.Report{Scenario: "15 readiness follows postgres and nats"}
	services := []string{harness.Scheduler, harness.Ingress, harness.Triggers}
	for _, name := range services {
		s.Start(name)
	}
	waitReadiness := func(what string, want int, lost string, within time.Duration) {
		t.Helper()
		start := time.Now()
		for _, name := range services {
			var code int
			var down []string
			if _, ok := harness.Eventually(s.Ctx, within, 50*time.Millisecond, func() bool {
				code, down = readyz(s, name)
				return code == want && (lost == "" || slices.Contains(down, lost))
			}); !ok {
				t.Fatalf("%s: /readyz of %s answered %d (down %v) %s after %s, want %d", what, name, code, down, within, what, want)
			}
		}
		r.Note("%s: every /readyz answered %d within %s", what, want, time.Since(start).Round(time.Millisecond))
	}
	waitReadiness("start", http.StatusOK, "", time.Minute)

	if err := pg.Stop(s.Ctx, "fast"); err != nil {
		t.Fatal(err)
	}
	r.Fault("postgres stopped")
	waitReadiness("postgres stopped", http.StatusServiceUnavailable, "postgres", readyWithin)
	if err := pg.Start(s.Ctx); err != nil {
		t.Fatal(err)
	}
	waitReadiness("postgres back", http.StatusOK, "", 30*time.Second)

	if err := s.NATS.Term(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	r.Fault("nats-server stopped")
	waitReadiness("nats stopped", http.StatusServiceUnavailable, "nats", readyWithin)
	if err := s.NATS.StartReady(s.Ctx); err != nil {
		t.Fatal(err)
	}
	waitReadiness("nats back", http.StatusOK, "", 30*time.Second)
	r.Print(t)
}

// readyz returns a service's /readyz status and the dependencies it says
// are down.
func readyz(s *harness.System, name string) (int, []string) {
	code, body, err := s.Do(http.MethodGet, s.URL(name)+"/readyz", nil)
	if err != nil {
		return 0, []string{fmt.Sprintf("unreachable: %v", err)}
	}
	var out struct {
		Down []string `json:"down"`
	}
	_ = json.Unmarshal(body, &out)
	return code, out.Down
}
