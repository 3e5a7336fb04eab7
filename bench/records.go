package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"sync"
	"time"
)

// record is one figure of a run, kept for --json (and for the plot, which
// reads the lateness records back).
type record struct {
	Scenario string         `json:"scenario"`
	System   string         `json:"system"`
	Metric   string         `json:"metric"`
	Value    float64        `json:"value"`
	Unit     string         `json:"unit"`
	Params   map[string]any `json:"params,omitempty"`
	At       time.Time      `json:"at"`
}

// recorder collects records; the zero value works and keeps them in
// memory only.
type recorder struct {
	mu   sync.Mutex
	recs []record
	// run holds the settings of the run (mode, durability flags), added
	// to every record's params so a results file describes itself.
	run map[string]any
}

func (r *recorder) add(scenario, system, metric string, value float64, unit string, params map[string]any) {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.run) > 0 {
		merged := make(map[string]any, len(params)+len(r.run))
		for k, v := range r.run {
			merged[k] = v
		}
		for k, v := range params {
			merged[k] = v
		}
		params = merged
	}
	r.recs = append(r.recs, record{Scenario: scenario, System: system, Metric: metric, Value: value, Unit: unit, Params: params, At: time.Now().UTC()})
}

func (r *recorder) addDuration(scenario, system, metric string, d time.Duration, params map[string]any) {
	r.add(scenario, system, metric, float64(d)/float64(time.Millisecond), "ms", params)
}

func (r *recorder) all() []record {
	if r == nil {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]record(nil), r.recs...)
}

// writeJSONLines appends the records to path, one JSON object a line, so
// several invocations can add to one file.
func writeJSONLines(path string, recs []record) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return fmt.Errorf("open results file: %w", err)
	}
	w := bufio.NewWriter(f)
	enc := json.NewEncoder(w)
	for _, r := range recs {
		if err := enc.Encode(r); err != nil {
			f.Close()
			return fmt.Errorf("write results: %w", err)
		}
	}
	if err := w.Flush(); err != nil {
		f.Close()
		return fmt.Errorf("write results: %w", err)
	}
	return f.Close()
}

func readJSONLines(path string) ([]record, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open results file: %w", err)
	}
	defer f.Close()
	var out []record
	dec := json.NewDecoder(f)
	for dec.More() {
		var r record
		if err := dec.Decode(&r); err != nil {
			return nil, fmt.Errorf("read results %s: %w", path, err)
		}
		out = append(out, r)
	}
	return out, nil
}
