package harness

import (
	"bufio"
	"bytes"
	"net/http"
	"strconv"
	"strings"
)

// Metric sums every series of the Prometheus metric name (exact, labels
// ignored) that a running service exposes on /metrics; 0 when the
// service does not answer. Counters restart at 0 with the process.
func (s *System) Metric(service, name string) float64 {
	status, body, err := s.Do(http.MethodGet, s.URL(service)+"/metrics", nil)
	if err != nil || status != http.StatusOK {
		return 0
	}
	total := 0.0
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name) {
			continue
		}
		rest := line[len(name):]
		if rest == "" || (rest[0] != ' ' && rest[0] != '{') {
			continue
		}
		fields := strings.Fields(line)
		if v, err := strconv.ParseFloat(fields[len(fields)-1], 64); err == nil {
			total += v
		}
	}
	return total
}
