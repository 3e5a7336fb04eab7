package contract

import (
	"fmt"
	"strconv"
	"strings"
)

// Stream names.
const (
	StreamIngest  = "INGEST"
	StreamEvents  = "EVENTS"
	StreamRetries = "RETRIES"
	StreamRuns    = "RUNS"
	StreamJobs    = "JOBS"
)

// Built-in retry kinds.
const (
	KindEvent        = "event"
	KindEventTrigger = "event-trigger"
	KindJob          = "job"
	// KindRun is a workflow run launched by a trigger: the triggers
	// service reports its failures and launches it again, from its
	// checkpoint, when it comes due.
	KindRun = "run"
)

// Lifecycle is the name of a retry lifecycle event; it is the third token
// of a RETRIES subject and, prefixed with "retry.", the CloudEvents type.
type Lifecycle string

const (
	Failed      Lifecycle = "failed"
	Succeeded   Lifecycle = "succeeded"
	Scheduled   Lifecycle = "scheduled"
	Rescheduled Lifecycle = "rescheduled"
	Due         Lifecycle = "due"
	Exhausted   Lifecycle = "exhausted"
	Cancelled   Lifecycle = "cancelled"
	// Held is an owner holding an item back (a throttle, a pause, a
	// concurrency limit): waiting, not failing. See HeldData.
	Held Lifecycle = "held"
	// Released is an owner lifting a hold for every item held under one
	// hold key (a source resumed); its subject's last token is the hold
	// key, not an item id. See ReleasedData.
	Released Lifecycle = "released"
)

// Lifecycles lists every lifecycle event in the order an item goes through
// them.
var Lifecycles = []Lifecycle{Failed, Held, Released, Scheduled, Rescheduled, Due, Succeeded, Exhausted, Cancelled}

// Valid reports whether l is a known lifecycle event.
func (l Lifecycle) Valid() bool {
	for _, v := range Lifecycles {
		if v == l {
			return true
		}
	}
	return false
}

// CloudEventType is the CloudEvents "type" of the lifecycle event, e.g.
// "retry.failed".
func (l Lifecycle) CloudEventType() string { return "retry." + string(l) }

// Run lifecycle events on RUNS.
const (
	RunRequested = "requested"
	RunCompleted = "completed"
	RunFailed    = "failed"
	// RunHeartbeat is an executor renewing the lease of a run in flight:
	// the run keeps its concurrency slot for another run timeout. See
	// RunHeartbeatData.
	RunHeartbeat = "heartbeat"
	// RunStep is an executor reporting one node of a run: completed with
	// its output, or failed with its error. The completed nodes make the
	// run's checkpoint. See RunStepData.
	RunStep = "step"
)

// IngestSubject is "ingest.<source>", the source given as its key
// (SourceKey: a token source is its own key).
func IngestSubject(source string) string { return "ingest." + SourceKey(source) }

// EventSubject is "events.<source>.<type>", the source given as its key
// (SourceKey); a dotted type adds tokens.
func EventSubject(source, typ string) string { return "events." + SourceKey(source) + "." + typ }

// RetrySubject is "retry.<kind>.<event>.<id>".
func RetrySubject(kind string, ev Lifecycle, id string) string {
	return "retry." + kind + "." + string(ev) + "." + id
}

// RetryFilter is the consumer filter for one lifecycle event of one kind
// on RETRIES; kind may be "*" for every kind. It ends in ">" so that it
// matches the stored subjects of a RETRIES split into shards too (a fifth
// token, see RetryShardTransform) as well as those of an unsplit one.
func RetryFilter(kind string, ev Lifecycle) string {
	return "retry." + kind + "." + string(ev) + ".>"
}

// RetryUnsplitFilter matches one lifecycle event of one kind as stored in
// an unsplit RETRIES (four tokens) and nothing stored after a split: what
// the scheduler of shard 0 consumes of the stream's history.
func RetryUnsplitFilter(kind string, ev Lifecycle) string {
	return "retry." + kind + "." + string(ev) + ".*"
}

// RetryItemFilter matches every lifecycle event of one item as published
// (core NATS subscribers, `nats sub`), and as stored in an unsplit
// RETRIES: what `nats stream view RETRIES --subject` takes to show an
// item's history. In a split stream add the item's shard as a fifth token
// (RetryItemShardFilter).
func RetryItemFilter(kind, id string) string { return "retry." + kind + ".*." + id }

// RetryItemShardFilter matches every lifecycle event of one item as
// stored in a RETRIES split into shards: retry.<kind>.*.<id>.*.
func RetryItemShardFilter(kind, id string) string { return RetryItemFilter(kind, id) + ".*" }

// RunSubject is "runs.<workflow>.<event>.<run_id>".
func RunSubject(workflow, event, runID string) string {
	return "runs." + workflow + "." + event + "." + runID
}

// JobSubject is "jobs.<job_type>": a job of normal priority, or of none
// (see JobSubjectFor for the other bands).
func JobSubject(jobType string) string { return "jobs." + jobType }

// RetrySubjectParts is a parsed RETRIES subject.
type RetrySubjectParts struct {
	Kind  string
	Event Lifecycle
	ID    string
	// Shard is the fifth token a split RETRIES stores (the item's shard,
	// in decimal), empty as published and in an unsplit stream.
	Shard string
}

// ParseRetrySubject splits and validates "retry.<kind>.<event>.<id>", as
// published, or "retry.<kind>.<event>.<id>.<shard>", as a RETRIES split
// into shards stores it (RetryShardTransform).
func ParseRetrySubject(subject string) (RetrySubjectParts, error) {
	toks := strings.Split(subject, ".")
	if (len(toks) != 4 && len(toks) != 5) || toks[0] != "retry" {
		return RetrySubjectParts{}, fieldErr("subject", fmt.Sprintf("%q is not of the form retry.<kind>.<event>.<id>", subject))
	}
	p := RetrySubjectParts{Kind: toks[1], Event: Lifecycle(toks[2]), ID: toks[3]}
	if len(toks) == 5 {
		n, err := strconv.Atoi(toks[4])
		if err != nil || n < 0 || n >= MaxShards || strconv.Itoa(n) != toks[4] {
			return RetrySubjectParts{}, fieldErr("subject shard", fmt.Sprintf("%q is not a shard between 0 and %d", toks[4], MaxShards-1))
		}
		p.Shard = toks[4]
	}
	if err := ValidateKind("subject kind", p.Kind); err != nil {
		return RetrySubjectParts{}, err
	}
	if !p.Event.Valid() {
		return RetrySubjectParts{}, fieldErr("subject event", fmt.Sprintf("%q is not a lifecycle event", toks[2]))
	}
	if err := ValidateID("subject id", p.ID); err != nil {
		return RetrySubjectParts{}, err
	}
	return p, nil
}

// ParseEventSubject splits "events.<source>.<type>".
func ParseEventSubject(subject string) (source, typ string, err error) {
	toks := strings.SplitN(subject, ".", 3)
	if len(toks) != 3 || toks[0] != "events" {
		return "", "", fieldErr("subject", fmt.Sprintf("%q is not of the form events.<source>.<type>", subject))
	}
	if err := ValidateToken("subject source", toks[1]); err != nil {
		return "", "", err
	}
	if err := ValidateType("subject type", toks[2]); err != nil {
		return "", "", err
	}
	return toks[1], toks[2], nil
}

// ParseIngestSubject returns the source of "ingest.<source>".
func ParseIngestSubject(subject string) (string, error) {
	toks := strings.Split(subject, ".")
	if len(toks) != 2 || toks[0] != "ingest" {
		return "", fieldErr("subject", fmt.Sprintf("%q is not of the form ingest.<source>", subject))
	}
	if err := ValidateToken("subject source", toks[1]); err != nil {
		return "", err
	}
	return toks[1], nil
}

// RunSubjectParts is a parsed RUNS subject.
type RunSubjectParts struct {
	Workflow string
	Event    string
	RunID    string
}

// ParseRunSubject splits "runs.<workflow>.<event>.<run_id>".
func ParseRunSubject(subject string) (RunSubjectParts, error) {
	toks := strings.Split(subject, ".")
	if len(toks) != 4 || toks[0] != "runs" {
		return RunSubjectParts{}, fieldErr("subject", fmt.Sprintf("%q is not of the form runs.<workflow>.<event>.<run_id>", subject))
	}
	p := RunSubjectParts{Workflow: toks[1], Event: toks[2], RunID: toks[3]}
	if err := ValidateToken("subject workflow", p.Workflow); err != nil {
		return RunSubjectParts{}, err
	}
	switch p.Event {
	case RunRequested, RunCompleted, RunFailed, RunHeartbeat, RunStep:
	default:
		return RunSubjectParts{}, fieldErr("subject event", fmt.Sprintf("%q is not requested, completed, failed, heartbeat or step", p.Event))
	}
	if err := ValidateID("subject run_id", p.RunID); err != nil {
		return RunSubjectParts{}, err
	}
	return p, nil
}

// ParseJobSubject returns the job type of "jobs.<job_type>" or
// "jobs.<job_type>.<band>" (high or low).
func ParseJobSubject(subject string) (string, error) {
	jt, _, err := ParseJobSubjectBand(subject)
	return jt, err
}

// ParseJobSubjectBand splits "jobs.<job_type>" (band normal) and
// "jobs.<job_type>.high" or "jobs.<job_type>.low". A normal job has no
// band token: "jobs.<job_type>.normal" is not a job subject.
func ParseJobSubjectBand(subject string) (string, Priority, error) {
	toks := strings.Split(subject, ".")
	if (len(toks) != 2 && len(toks) != 3) || toks[0] != "jobs" {
		return "", "", fieldErr("subject", fmt.Sprintf("%q is not of the form jobs.<job_type> or jobs.<job_type>.<high|low>", subject))
	}
	if err := ValidateToken("subject job_type", toks[1]); err != nil {
		return "", "", err
	}
	if len(toks) == 2 {
		return toks[1], PriorityNormal, nil
	}
	switch p := Priority(toks[2]); p {
	case PriorityHigh, PriorityLow:
		return toks[1], p, nil
	}
	return "", "", fieldErr("subject band", fmt.Sprintf("%q is not high or low (normal jobs use jobs.<job_type>)", truncateReason(toks[2])))
}

// JobFilters are the subject filters of every band of one job type,
// highest first.
func JobFilters(jobType string) []string {
	out := make([]string, 0, len(Priorities))
	for _, p := range Priorities {
		out = append(out, JobSubjectFor(jobType, p))
	}
	return out
}
