package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"runtime/pprof"
	"strings"
	"time"

	"github.com/google/pprof/profile"
)

// The scheduler, the NATS server, River and the owners all run in the
// bench process, so /proc has one CPU figure for all of them. Goroutines
// inherit the profiler labels of the goroutine that starts them, so each
// component is started under a label and the CPU profile of the window
// splits the process's CPU by it. Work with no label is the Go runtime's
// own (the garbage collector's background workers, timers), except the
// NATS server's (see sampleComponent).
const componentLabel = "component"

const (
	compOwner     = "bench owner"
	compScheduler = "scheduler"
	compNATS      = "nats-server"
	compRiver     = "River client"
	compRuntime   = "runtime (GC) and unlabelled"
)

// labelled runs f with goroutines it starts labelled as component.
func labelled(ctx context.Context, component string, f func(context.Context)) {
	pprof.Do(ctx, pprof.Labels(componentLabel, component), f)
}

// cpuProfile is a CPU profile running into memory; nil when one could not
// start (--cpuprofile already profiles the whole run: Go has one CPU
// profile at a time).
type cpuProfile struct {
	buf     bytes.Buffer
	started time.Time
	err     error
}

func startCPUProfile() *cpuProfile {
	p := &cpuProfile{started: time.Now()}
	if err := pprof.StartCPUProfile(&p.buf); err != nil {
		p.err = fmt.Errorf("start cpu profile (is --cpuprofile set?): %w", err)
	}
	return p
}

// stop ends the profile, writes it to path unless path is "", and returns
// the CPU time by component.
func (p *cpuProfile) stop(path string) (map[string]time.Duration, error) {
	if p == nil {
		return nil, errors.New("no profile")
	}
	if p.err != nil {
		return nil, p.err
	}
	pprof.StopCPUProfile()
	if path != "" {
		if err := os.WriteFile(path, p.buf.Bytes(), 0o644); err != nil {
			return nil, fmt.Errorf("write cpu profile: %w", err)
		}
	}
	prof, err := profile.Parse(bytes.NewReader(p.buf.Bytes()))
	if err != nil {
		return nil, fmt.Errorf("parse cpu profile: %w", err)
	}
	return cpuByLabel(prof)
}

// cpuByLabel sums the profile's CPU time by the component label.
func cpuByLabel(prof *profile.Profile) (map[string]time.Duration, error) {
	idx := -1
	for i, st := range prof.SampleType {
		if st.Type == "cpu" && st.Unit == "nanoseconds" {
			idx = i
		}
	}
	if idx < 0 {
		return nil, errors.New("cpu profile has no cpu/nanoseconds samples")
	}
	out := map[string]time.Duration{}
	for _, s := range prof.Sample {
		out[sampleComponent(s)] += time.Duration(s.Value[idx])
	}
	return out, nil
}

// natsServerPkg prefixes the functions of the embedded server.
const natsServerPkg = "github.com/nats-io/nats-server/"

// sampleComponent is the component a sample's CPU is charged to. The NATS
// server replaces the labels of its stream and consumer goroutines with
// its own (account, stream, consumer), dropping the inherited one, so an
// unlabelled sample with the server's code on its stack is the server's.
func sampleComponent(s *profile.Sample) string {
	if v := s.Label[componentLabel]; len(v) > 0 {
		return v[0]
	}
	for _, loc := range s.Location {
		for _, ln := range loc.Line {
			if ln.Function != nil && strings.HasPrefix(ln.Function.Name, natsServerPkg) {
				return compNATS
			}
		}
	}
	return compRuntime
}
