// Package streams defines retryd's six JetStream streams and creates them.
//
// The configuration is the same everywhere it is used: Ensure creates or
// updates the streams at service start, Export writes them as JSON files
// for `nats stream add --config FILE`, and deploy/streams holds those files
// (generated, and checked by a test).
//
// Choices shared by every stream:
//   - File storage: a retry must survive a NATS restart.
//   - Limits retention, also for JOBS: several durable consumers read each
//     stream (the JOBS stream feeds both the workers and the jobs
//     projection), so no consumer's ack may remove a message.
//   - MaxAge 7 days, 30 days for RETRIES: the retry projection in Postgres
//     can be rebuilt by replaying RETRIES, so it is kept longer.
//   - A 2 minute duplicate window: every publish carries a deterministic
//     Nats-Msg-Id and a relay that crashed between publish and commit
//     republishes well within it.
//   - MaxMsgSize 1 MiB (contract.MaxEnvelopeBytes), headers included.
//   - A max_bytes (DefaultMaxBytes) on every stream, and discard new on
//     every stream but SCHEDULES: a full stream refuses new messages
//     rather than deleting old facts that a consumer has not read yet or
//     that the retry projection is rebuilt from. A refused publish is an
//     error its publisher sees: the HTTP intake answers 503, an outbox
//     keeps its row, the due emission rolls back, and JOBS's source from
//     SCHEDULES waits and resumes. Only max_age removes messages.
//   - SCHEDULES discards old, as the server requires of a stream with
//     message schedules, so at its max_bytes it deletes its oldest
//     messages, schedules included. It has one anyway: without it, a
//     SCHEDULES that kept growing (fired jobs JOBS refuses, a flood of
//     delayed jobs) would fill the server's store, which every stream
//     shares (the server checks what is stored, not what the others'
//     max_bytes reserve), and the server would then refuse every stream's
//     publishes, RETRIES's too. It holds the schedules, the delayed jobs
//     and each fired job for 7 days (its TTL).
package streams

import (
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/retryd/retryd/pkg/contract"
)

// Defaults of every stream.
const (
	DefaultMaxAge        = 7 * 24 * time.Hour
	DefaultRetriesMaxAge = 30 * 24 * time.Hour
	DuplicateWindow      = 2 * time.Minute
	MaxMsgSize           = contract.MaxEnvelopeBytes
)

// Binary sizes, for max_bytes.
const (
	KiB int64 = 1 << 10
	MiB int64 = 1 << 20
	GiB int64 = 1 << 30
)

// DefaultMaxBytes is each stream's max_bytes unless Options.MaxBytes names
// it. Together they take 10 GiB, half of the 20 GB (nats-server reads
// GiB) max_file_store of deploy/nats: the server reserves a stream's
// max_bytes against that limit when it creates the stream, so their sum
// must fit, and the rest is for the server's own overhead and other
// streams. Per stream:
//   - RETRIES 4 GiB: it keeps 30 days and the retry projection is rebuilt
//     from it, so it holds the most.
//   - JOBS 2 GiB: every job and every retry of one, 7 days.
//   - INGEST, EVENTS, RUNS 1 GiB each: inputs whose effects are in Postgres
//     minutes later; a full one stops its publishers until max_age frees
//     room or the limit is raised.
//   - SCHEDULES 1 GiB: schedules and delayed jobs are small and few next
//     to this, and fired jobs go within 7 days; reaching it deletes the
//     oldest (see the package comment), which the 80% alert warns of.
var DefaultMaxBytes = map[string]int64{
	contract.StreamIngest:    1 * GiB,
	contract.StreamEvents:    1 * GiB,
	contract.StreamRetries:   4 * GiB,
	contract.StreamRuns:      1 * GiB,
	contract.StreamSchedules: 1 * GiB,
	contract.StreamJobs:      2 * GiB,
}

// Names lists the streams in the order Configs returns them.
var Names = []string{
	contract.StreamIngest,
	contract.StreamEvents,
	contract.StreamRetries,
	contract.StreamRuns,
	contract.StreamSchedules,
	contract.StreamJobs,
}

// Options adjusts the stream configurations to a deployment. The zero value
// is a single-server deployment: file storage, one replica, default ages.
type Options struct {
	// Replicas is the number of copies in a cluster (num_replicas); use 3
	// in a three-node cluster. 0 means 1 for a stream Ensure creates and
	// leaves an existing stream's replicas as they are, so a service
	// started with defaults never scales an R3 stream down.
	Replicas int
	// Storage is jetstream.FileStorage (the zero value) or MemoryStorage
	// (tests and benchmarks only: a restart loses everything).
	Storage jetstream.StorageType
	// MaxAge overrides the max age of streams by name, e.g.
	// {"RETRIES": 90 * 24 * time.Hour}.
	MaxAge map[string]time.Duration
	// MaxBytes overrides the max_bytes of streams by name, e.g.
	// {"RETRIES": 16 * streams.GiB}; -1 is no limit. A stream it does not
	// name gets DefaultMaxBytes when Ensure creates it, and keeps a
	// max_bytes someone set (`nats stream edit`) when it exists.
	MaxBytes map[string]int64
	// Shards splits RETRIES into that many scheduler shards: the stream's
	// subject transform appends each item's shard as a fifth token
	// (contract.RetryShardTransform). 0 leaves an existing stream split as
	// it is (and creates it unsplit); 1 is unsplit. Ensure only ever
	// multiplies an existing count (resharding N to kN), never lowers it.
	Shards int
}

// Validate reports options a server would refuse, naming the field.
func (o Options) Validate() error {
	if o.Replicas < 0 || o.Replicas > 5 {
		return fmt.Errorf("Options.Replicas must be between 1 and 5, got %d", o.Replicas)
	}
	if o.Storage != jetstream.FileStorage && o.Storage != jetstream.MemoryStorage {
		return fmt.Errorf("Options.Storage must be file or memory, got %d", o.Storage)
	}
	for name, age := range o.MaxAge {
		if !isStream(name) {
			return fmt.Errorf("Options.MaxAge: %q is not a retryd stream (%v)", name, Names)
		}
		if name == contract.StreamSchedules {
			return fmt.Errorf("Options.MaxAge: %s has no max age: its schedules live until deleted", name)
		}
		if age < DuplicateWindow {
			return fmt.Errorf("Options.MaxAge[%s] must be at least the duplicate window %s, got %s", name, DuplicateWindow, age)
		}
	}
	if o.Shards < 0 || o.Shards > contract.MaxShards {
		return fmt.Errorf("Options.Shards must be between 1 and %d, got %d", contract.MaxShards, o.Shards)
	}
	for name, n := range o.MaxBytes {
		if !isStream(name) {
			return fmt.Errorf("Options.MaxBytes: %q is not a retryd stream (%v)", name, Names)
		}
		// Smaller than one message of the largest size is a typo, not a
		// limit: the stream could refuse every message.
		if n != -1 && n < MaxMsgSize {
			return fmt.Errorf("Options.MaxBytes[%s] must be -1 (no limit) or at least the max message size %d, got %d", name, MaxMsgSize, n)
		}
	}
	return nil
}

func isStream(name string) bool {
	for _, n := range Names {
		if n == name {
			return true
		}
	}
	return false
}

// definition is what differs between streams.
type definition struct {
	name        string
	subjects    []string
	maxAge      time.Duration
	description string
	// allowDirect serves "last message for subject" reads by a subject
	// (`$JS.API.DIRECT.GET.<stream>.<subject>`) that a NATS permission can
	// narrow: workers check a job's outcome on retry.job.* only.
	allowDirect bool
	// schedules turns on JetStream message schedules (which the server
	// pairs with roll-ups: each schedule subject keeps its latest message).
	schedules bool
	// sources are the streams whose subjects this one copies in, mapped.
	sources []*jetstream.StreamSource
}

var definitions = []definition{
	{
		name:        contract.StreamIngest,
		subjects:    []string{"ingest.*"},
		maxAge:      DefaultMaxAge,
		description: "retryd: producer events as accepted at the edge (ingest.<source>)",
	},
	{
		name:        contract.StreamEvents,
		subjects:    []string{"events.>"},
		maxAge:      DefaultMaxAge,
		description: "retryd: events admitted past the source gate (events.<source>.<type>)",
	},
	{
		name:        contract.StreamRetries,
		subjects:    []string{"retry.*.*.*"},
		maxAge:      DefaultRetriesMaxAge,
		description: "retryd: retry lifecycle, one subject per item (retry.<kind>.<event>.<id>); the retry projection is rebuilt from it",
		allowDirect: true,
	},
	{
		name:        contract.StreamRuns,
		subjects:    []string{"runs.*.*.*"},
		maxAge:      DefaultMaxAge,
		description: "retryd: workflow runs requested, completed and failed (runs.<workflow>.<event>.<run_id>)",
	},
	// Schedules of jobs, periodic and delayed, and the jobs they fire
	// (contract.StreamSchedules says why they are not on JOBS). No max
	// age: a schedule lives until it is deleted (or, delayed, fires);
	// each fired message expires by its own TTL (contract.FiredTTL) once
	// JOBS has long had its copy.
	{
		name:        contract.StreamSchedules,
		subjects:    []string{"schedules.*.*", "delayed.*.*", "fired.jobs.*", "fired.jobs.*.high", "fired.jobs.*.low"},
		description: "retryd: job schedules (schedules.<job_type>.<name>), delayed first runs (delayed.<job_type>.<id>) and what they fire (fired.jobs.<job_type>), copied into JOBS",
		schedules:   true,
	},
	// jobs.<job_type> is the normal priority band (and every job published
	// before priorities); high and low have their own token. The jobs that
	// schedules fire come in from SCHEDULES, "fired." dropped.
	{
		name:        contract.StreamJobs,
		subjects:    []string{"jobs.*", "jobs.*.high", "jobs.*.low"},
		maxAge:      DefaultMaxAge,
		description: "retryd: work for workers, read by the workers and the jobs projection (jobs.<job_type>, jobs.<job_type>.high, jobs.<job_type>.low)",
		sources: []*jetstream.StreamSource{{
			Name: contract.StreamSchedules,
			SubjectTransforms: []jetstream.SubjectTransformConfig{
				{Source: "fired.jobs.>", Destination: "jobs.>"},
			},
		}},
	},
}

// Configs returns the configuration of the six streams, INGEST, EVENTS,
// RETRIES, RUNS, SCHEDULES and JOBS, in that order. Limits that retryd leaves open are
// written as the server stores them (-1, unlimited) so that a config read
// back from the server compares equal.
func Configs(opts Options) []jetstream.StreamConfig {
	replicas := opts.Replicas
	if replicas <= 0 {
		replicas = 1
	}
	out := make([]jetstream.StreamConfig, 0, len(definitions))
	for _, d := range definitions {
		age := d.maxAge
		if v, ok := opts.MaxAge[d.name]; ok {
			age = v
		}
		maxBytes, discard := DefaultMaxBytes[d.name], jetstream.DiscardNew
		if d.schedules {
			discard = jetstream.DiscardOld
		}
		if v, ok := opts.MaxBytes[d.name]; ok {
			maxBytes = v
		}
		var transform *jetstream.SubjectTransformConfig
		if d.name == contract.StreamRetries && opts.Shards > 1 {
			src, dest := contract.RetryShardTransform(opts.Shards)
			transform = &jetstream.SubjectTransformConfig{Source: src, Destination: dest}
		}
		out = append(out, jetstream.StreamConfig{
			SubjectTransform:  transform,
			Name:              d.name,
			Description:       d.description,
			Subjects:          append([]string(nil), d.subjects...),
			Retention:         jetstream.LimitsPolicy,
			MaxConsumers:      -1,
			MaxMsgs:           -1,
			MaxBytes:          maxBytes,
			MaxAge:            age,
			MaxMsgsPerSubject: -1,
			MaxMsgSize:        MaxMsgSize,
			Discard:           discard,
			Storage:           opts.Storage,
			Replicas:          replicas,
			AllowDirect:       d.allowDirect,
			AllowMsgSchedules: d.schedules,
			AllowRollup:       d.schedules,
			AllowMsgTTL:       d.schedules,
			Sources:           d.sources,
			Duplicates:        DuplicateWindow,
			Compression:       jetstream.NoCompression,
		})
	}
	return out
}

// Config returns the configuration of one stream by name.
func Config(name string, opts Options) (jetstream.StreamConfig, bool) {
	for _, c := range Configs(opts) {
		if c.Name == name {
			return c, true
		}
	}
	return jetstream.StreamConfig{}, false
}
