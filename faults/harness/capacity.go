package harness

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// calibrationMsgs is how many messages StoreRate publishes: enough to
// average over a second or two of fsyncs on a slow disk.
const calibrationMsgs = 1500

// StoreRate measures how many messages per second the suite's NATS stores
// in one file stream right now. With sync_interval: always nats-server
// fsyncs every message it stores (no group commit), so this rate bounds
// every scenario that moves tens of thousands of lifecycle events through
// RETRIES, whatever retryd does; on 2 cores the CPU the services share
// with nats-server and Postgres lowers it further under load.
//
// It publishes lifecycle-sized messages to a scratch stream with up to
// 256 in flight, as the services do, and deletes the stream. Scenarios
// running in parallel share the disk and the cores: the rate measured is
// what this scenario can expect to get.
func (s *System) StoreRate(ctx context.Context) (float64, error) {
	tag := strconv.FormatInt(time.Now().UnixNano(), 36)
	name, subject := "FAULTS_CALIBRATE_"+tag, "faults.calibrate."+tag
	c, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if _, err := s.JS.CreateStream(c, jetstream.StreamConfig{
		Name: name, Subjects: []string{subject}, Storage: jetstream.FileStorage,
	}); err != nil {
		return 0, fmt.Errorf("create calibration stream: %w", err)
	}
	defer func() { _ = s.JS.DeleteStream(context.WithoutCancel(c), name) }()
	js, err := jetstream.New(s.NC, jetstream.WithPublishAsyncMaxPending(256))
	if err != nil {
		return 0, fmt.Errorf("calibration publisher: %w", err)
	}
	payload := make([]byte, 400)
	for i := range payload {
		payload[i] = 'a' + byte(i%26)
	}
	// On a cluster the new stream may have no leader yet, and a publish
	// then finds nobody to answer ("no response from stream"): wait for
	// one before the clock starts (CI run LL failed scenario 13 there).
	for {
		_, err := js.Publish(c, subject, payload, jetstream.WithMsgID(tag+"-warmup"))
		if err == nil {
			break
		}
		if !errors.Is(err, jetstream.ErrNoStreamResponse) && !errors.Is(err, nats.ErrNoResponders) {
			return 0, fmt.Errorf("calibration warm-up publish: %w", err)
		}
		select {
		case <-c.Done():
			return 0, fmt.Errorf("calibration stream has no leader: %w", c.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
	start := time.Now()
	futs := make([]jetstream.PubAckFuture, 0, calibrationMsgs)
	for i := range calibrationMsgs {
		m := &nats.Msg{Subject: subject, Data: payload, Header: nats.Header{}}
		m.Header.Set(jetstream.MsgIDHeader, tag+"-"+strconv.Itoa(i))
		// A broker busy with another scenario may not confirm anything for
		// a while: that time counts as a slower rate, not as an error.
		f, err := js.PublishMsgAsync(m, jetstream.WithStallWait(30*time.Second))
		if err != nil {
			return 0, fmt.Errorf("calibration publish: %w", err)
		}
		futs = append(futs, f)
	}
	for _, f := range futs {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			return 0, fmt.Errorf("calibration publish: %w", err)
		case <-c.Done():
			return 0, fmt.Errorf("calibration publish: %w", c.Err())
		}
	}
	return float64(calibrationMsgs) / time.Since(start).Seconds(), nil
}

// Pace is a scenario's speed assumption next to what the machine gives:
// the NATS store rate measured when the scenario started, and the lowest
// rate the scenario's timing was written for. Scenarios derive their waits
// from Measured and quote Explain in every timeout, so a failure says at
// once whether it found a defect (the machine was fast enough) or a slow
// machine.
type Pace struct {
	Scenario string
	// Measured is StoreRate at the start, in messages per second.
	Measured float64
	// Assumed is the lowest store rate the scenario's sizes and limits
	// were written for.
	Assumed float64
}

// Pace measures the store rate, records it and the assumption in r, and
// fails the scenario at once, with both figures, when the machine is
// slower than assumed.
func (s *System) Pace(r *Report, assumed float64) Pace {
	s.T.Helper()
	rate, err := s.StoreRate(s.Ctx)
	if err != nil {
		s.T.Fatalf("measure NATS store rate: %v", err)
	}
	p := Pace{Scenario: r.Scenario, Measured: rate, Assumed: assumed}
	r.Note("pace: NATS stores %.0f msg/s (one stream, sync_interval: always, measured at the start); the scenario assumes at least %.0f msg/s", rate, assumed)
	if rate < assumed {
		// The full suite (make faults) is sized for the rate it assumes.
		// The short run in make test shares a busy machine with every
		// other package, so it goes on: its waits are sized by the rate
		// measured here, and a timeout quotes Explain, which then says
		// the machine was slower than assumed.
		if Full() {
			s.T.Fatalf("machine too slow for scenario %q: %s", r.Scenario, p.Explain())
		}
		r.Note("below the assumed rate: the short run goes on, its waits sized by the measured rate")
	}
	return p
}

// For is how long storing msgs messages takes at the measured rate.
func (p Pace) For(msgs int) time.Duration {
	return time.Duration(math.Ceil(float64(msgs) / p.Measured * float64(time.Second)))
}

// Explain is the sentence timeouts quote.
func (p Pace) Explain() string {
	verdict := "the machine met the assumption, so a timeout here is a defect"
	if p.Measured < p.Assumed {
		verdict = "the machine is slower than the scenario assumes"
	}
	return fmt.Sprintf("NATS stored %.0f msg/s at the start, the scenario assumes at least %.0f msg/s: %s", p.Measured, p.Assumed, verdict)
}

// Missing fails the scenario because something it needs is not installed
// or not found. A scenario never skips for that: a suite that skips
// silently proves nothing, and .ci/run installs every requirement.
func Missing(t testing.TB, what string, err error, hint string) {
	t.Helper()
	t.Fatalf("missing %s (%v): %s", what, err, hint)
}
