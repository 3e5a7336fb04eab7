package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"github.com/spf13/cobra"

	"github.com/retryd/retryd/internal/envvar"
	"github.com/retryd/retryd/internal/natsconn"
	"github.com/retryd/retryd/internal/streams"
	"github.com/retryd/retryd/stores/retention"
)

// Where a stream's max age was read (retention.StreamAge.From).
const (
	ageFromNATS    = "nats"
	ageFromEnv     = "env"
	ageFromDefault = "default"
)

// natsReadTimeout bounds reading the streams from NATS: maintenance runs
// without NATS too (the Helm CronJob has none), and a server that does not
// answer must not hold the run up.
const natsReadTimeout = 5 * time.Second

// streamAges are the max ages of the streams the item tables protect, and
// where each was read.
type streamAges struct {
	age  map[string]time.Duration
	from map[string]string
	// note says why NATS was not read, when it was configured but
	// could not be.
	note string
}

// protectedStreams are the streams retention.Tables protect, in order.
func protectedStreams() []string {
	var out []string
	for _, t := range retention.Tables {
		if t.Protects != "" && !slices.Contains(out, t.Protects) {
			out = append(out, t.Protects)
		}
	}
	return out
}

// readStreamAges reads each protected stream's max age from NATS when a
// server is configured (natsURL or NATS_URL) and answers, and otherwise,
// or for a stream the server does not have, from RETRYD_STREAM_<NAME>_MAX_AGE
// or the default: the same values `retryd streams ensure` would create the
// stream with.
func readStreamAges(ctx context.Context, cmd *cobra.Command, g *globals, natsURL string) (streamAges, error) {
	var e envvar.Reader
	opts := streams.OptionsFromEnv(&e)
	if err := e.Err(); err != nil {
		return streamAges{}, usageErrorf(cmd, "read stream limits: %v", err)
	}
	sa := streamAges{age: map[string]time.Duration{}, from: map[string]string{}}
	names := protectedStreams()
	for _, name := range names {
		c, _ := streams.Config(name, opts)
		sa.age[name], sa.from[name] = c.MaxAge, ageFromDefault
		if _, set := opts.MaxAge[name]; set {
			sa.from[name] = ageFromEnv
		}
	}
	if natsURL == "" && os.Getenv(natsconn.EnvURL) == "" {
		return sa, nil
	}
	if err := readNATSAges(ctx, g, natsURL, names, &sa); err != nil {
		sa.note = fmt.Sprintf("NATS not read (%v): max ages from RETRYD_STREAM_<NAME>_MAX_AGE or the defaults", err)
	}
	return sa, nil
}

// readNATSAges overwrites sa with the max ages of the streams the server
// has.
func readNATSAges(ctx context.Context, g *globals, natsURL string, names []string, sa *streamAges) error {
	o := natsconn.OptionsFromEnv("retryd-maintenance")
	if natsURL != "" {
		o.URL = natsURL
	}
	ctx, cancel := context.WithTimeout(ctx, min(g.timeout, natsReadTimeout))
	defer cancel()
	nc, js, err := natsconn.Connect(ctx, o, zerolog.Nop())
	if err != nil {
		return err
	}
	defer nc.Close()
	ctx, stop := natsconn.WithRefusals(ctx, nc)
	defer stop()
	for _, name := range names {
		s, err := js.Stream(ctx, name)
		err = natsconn.Refused(ctx, err)
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			continue // not created yet: what ensure would create it with
		}
		if err != nil {
			return fmt.Errorf("read stream %s: %w", name, err)
		}
		age := s.CachedInfo().Config.MaxAge
		if age <= 0 {
			age = retention.Unlimited
		}
		sa.age[name], sa.from[name] = age, ageFromNATS
	}
	return nil
}

// describe says where name's max age came from, for messages.
func (sa streamAges) describe(name string) string {
	switch sa.from[name] {
	case ageFromNATS:
		return "read from NATS"
	case ageFromEnv:
		return "from " + streams.EnvMaxAge(name)
	}
	return "the default; " + streams.EnvMaxAge(name) + " unset"
}

// applyFloors checks each item table's retention against the max age of
// the stream it protects (retention.Floor): a retention given shorter is a
// usage error naming the flag, the stream, its max age and the variable
// that sets it; a default shorter is raised to it (the stream was made to
// keep its messages longer, so the rows that refuse their replays must
// stay as long). given names the tables whose retention the command line
// set.
func applyFloors(cmd *cobra.Command, opts *retention.Options, sa streamAges, given map[string]bool) error {
	opts.MaxAge = sa.age
	for _, t := range retention.Tables {
		floor := retention.Floor(t, sa.age)
		if floor == 0 {
			continue
		}
		keep, ok := opts.Keep[t.Name]
		if !ok {
			keep = t.Default
		}
		if keep >= floor {
			continue
		}
		if given[t.Name] || floor == retention.Unlimited {
			return usageErrorf(cmd, "--retention %s=%s is shorter than the %s stream's max_age %s (%s): a message about a deleted row, redelivered or replayed from %s, would act again; give at least %s, or lower the stream's max_age (%s, then retryd streams ensure)",
				t.Name, retention.FormatDuration(keep), t.Protects, retention.FormatDuration(floor), sa.describe(t.Protects),
				t.Protects, retention.FormatDuration(floor), streams.EnvMaxAge(t.Protects))
		}
		opts.Keep[t.Name] = floor
	}
	return nil
}

// reportStreams lists the max ages read, with the tables each floors.
func reportStreams(sa streamAges) []retention.StreamAge {
	out := []retention.StreamAge{}
	for _, name := range protectedStreams() {
		s := retention.StreamAge{Stream: name, MaxAge: retention.FormatDuration(sa.age[name]), From: sa.from[name], Tables: []string{}}
		for _, t := range retention.Tables {
			if t.Protects == name {
				s.Tables = append(s.Tables, t.Name)
			}
		}
		out = append(out, s)
	}
	return out
}
