package contract

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
)

// StreamSchedules holds the JetStream message schedules of jobs: periodic
// schedules (schedules.<job_type>.<name>) and delayed first runs
// (delayed.<job_type>.<id>). The server fires them to
// fired.jobs.<job_type>[.<band>] in the same stream, and JOBS sources
// those subjects as jobs.<job_type>[.<band>]. They live apart from JOBS
// because a stream with message schedules must allow roll-ups, and a
// roll-up purges: only the scheduler publishes here, while every
// producer may publish on JOBS.
const StreamSchedules = "SCHEDULES"

// Headers of JetStream message schedules (nats-server 2.12+). The first
// three are set on a schedule; the server sets the last two on each
// message it fires.
const (
	HeaderSchedule         = "Nats-Schedule"
	HeaderScheduleTarget   = "Nats-Schedule-Target"
	HeaderScheduleTimeZone = "Nats-Schedule-Time-Zone"
	HeaderScheduleTTL      = "Nats-Schedule-TTL"
	HeaderScheduler        = "Nats-Scheduler"
	HeaderScheduleNext     = "Nats-Schedule-Next"
)

// FiredTTL is how long SCHEDULES keeps a job a schedule fired (its
// Nats-TTL): JOBS copies it in at once, so this only bounds the stream.
const FiredTTL = 7 * 24 * time.Hour

// scheduleNextPurge is the Nats-Schedule-Next of a one-shot schedule's
// message: the schedule is gone once it fired.
const scheduleNextPurge = "purge"

// ScheduleSubject is the subject of the periodic schedule name of a job
// type: schedules.<job_type>.<name>. A schedule subject holds one message,
// the schedule's latest version.
func ScheduleSubject(jobType, name string) string { return "schedules." + jobType + "." + name }

// DelayedSubject is the subject of the delayed first run of job id:
// delayed.<job_type>.<id>.
func DelayedSubject(jobType, id string) string { return "delayed." + jobType + "." + id }

// FiredSubject is where a schedule of a job fires, in SCHEDULES: the job's
// subject behind "fired.".
func FiredSubject(jobType string, p Priority) string { return "fired." + JobSubjectFor(jobType, p) }

// ParseScheduleSubject splits schedules.<job_type>.<name>.
func ParseScheduleSubject(subject string) (jobType, name string, err error) {
	parts := strings.Split(subject, ".")
	if len(parts) != 3 || parts[0] != "schedules" {
		return "", "", fieldErr("subject", fmt.Sprintf("%q is not schedules.<job_type>.<name>", subject))
	}
	return parts[1], parts[2], nil
}

// MaxScheduleIDLen bounds the id of a periodic schedule's job: each tick's
// job id adds "-" and a stream sequence of up to 20 digits.
const MaxScheduleIDLen = MaxIDLen - 21

// FiredJobID is the id of a job as its worker and the jobs projection
// know it. A periodic schedule fires the same job body on every tick, so
// a job fired by one (header Nats-Scheduler set, Nats-Schedule-Next not
// "purge") is named by its schedule's job id, "-", and the stream
// sequence of the tick's message in JOBS: distinct per tick, the same on
// every redelivery. Any other job, a delayed first run included, keeps
// its id.
func FiredJobID(d JobData, h nats.Header, jobsSeq uint64) string {
	if h == nil || h.Get(HeaderScheduler) == "" || h.Get(HeaderScheduleNext) == scheduleNextPurge {
		return d.ID
	}
	return d.ID + "-" + strconv.FormatUint(jobsSeq, 10)
}

// Schedule patterns a periodic schedule may use, as the server reads them:
// "@every <duration>" (at least a second), a six-field cron expression
// with seconds ("0 */5 * * * *"), or a predefined one (@hourly, @daily, …).
// MinScheduleEvery is the shortest interval.
const MinScheduleEvery = time.Second

// NewScheduleMsg builds the periodic schedule name of job d: the job's
// message as the worker gets it, with the schedule's headers. pattern is
// "@every <duration>" or a cron expression; timeZone is an IANA zone for
// cron patterns ("" is UTC). The job's id must leave room for the tick's
// sequence (MaxScheduleIDLen).
func NewScheduleMsg(source, name, pattern, timeZone string, d JobData, now time.Time) (*nats.Msg, error) {
	if err := ValidateToken("name", name); err != nil {
		return nil, fmt.Errorf("build schedule: %w", err)
	}
	if len(d.ID) > MaxScheduleIDLen {
		return nil, fmt.Errorf("build schedule: %w", fieldErr("data.id", fmt.Sprintf("is %d characters, more than the %d a schedule's job may have", len(d.ID), MaxScheduleIDLen)))
	}
	if err := ValidateSchedulePattern(pattern, timeZone); err != nil {
		return nil, fmt.Errorf("build schedule: %w", err)
	}
	msg, err := NewJobMsg(source, d, now)
	if err != nil {
		return nil, fmt.Errorf("build schedule: %w", err)
	}
	// The schedule subject keeps only its latest message; a Nats-Msg-Id
	// would drop a change made within the duplicate window.
	msg.Header.Del(HeaderMsgID)
	msg.Subject = ScheduleSubject(d.JobType, name)
	msg.Header.Set(HeaderSchedule, pattern)
	msg.Header.Set(HeaderScheduleTarget, FiredSubject(d.JobType, d.Priority))
	msg.Header.Set(HeaderScheduleTTL, FiredTTL.String())
	if timeZone != "" {
		msg.Header.Set(HeaderScheduleTimeZone, timeZone)
	}
	return msg, nil
}

// NewDelayedJobMsg builds the delayed first run of job d at runAt: a
// one-shot schedule on delayed.<job_type>.<id>. Its Nats-Msg-Id is the
// job's, so the same job is stored once.
func NewDelayedJobMsg(source string, d JobData, runAt, now time.Time) (*nats.Msg, error) {
	msg, err := NewJobMsg(source, d, now)
	if err != nil {
		return nil, fmt.Errorf("build delayed job: %w", err)
	}
	msg.Subject = DelayedSubject(d.JobType, d.ID)
	msg.Header.Set(HeaderSchedule, "@at "+runAt.UTC().Format(time.RFC3339Nano))
	msg.Header.Set(HeaderScheduleTarget, FiredSubject(d.JobType, d.Priority))
	msg.Header.Set(HeaderScheduleTTL, FiredTTL.String())
	return msg, nil
}

// ValidateSchedulePattern checks a periodic schedule's pattern and time
// zone as far as a client can; the server parses cron expressions. The
// errors name the request fields every, cron and time_zone.
func ValidateSchedulePattern(pattern, timeZone string) error {
	if every, ok := strings.CutPrefix(pattern, "@every "); ok {
		d, err := time.ParseDuration(every)
		switch {
		case err != nil:
			return fieldErr("every", fmt.Sprintf("%q is not a duration: %v", every, err))
		case d < MinScheduleEvery:
			return fieldErr("every", fmt.Sprintf("must be at least %s, got %s", MinScheduleEvery, d))
		case timeZone != "":
			return fieldErr("time_zone", "applies to cron patterns only, not to every")
		}
		return nil
	}
	if strings.HasPrefix(pattern, "@at ") {
		return fieldErr("cron", "a one-shot @at is a delayed job (run_at), not a schedule")
	}
	if timeZone != "" {
		if _, err := time.LoadLocation(timeZone); err != nil {
			return fieldErr("time_zone", fmt.Sprintf("%q is not a known time zone", timeZone))
		}
	}
	switch pattern {
	case "@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly":
		return nil
	}
	if n := len(strings.Fields(pattern)); n != 6 {
		return fieldErr("cron", fmt.Sprintf("%q has %d fields; want 6 (seconds minutes hours day-of-month month day-of-week) or @hourly, @daily, @weekly, @monthly, @yearly", pattern, n))
	}
	return nil
}

// NameFired gives a job that a periodic schedule fired its tick's id
// (FiredJobID), as read from JOBS at stream sequence jobsSeq, and checks
// it. Any other job is left as it is.
func (d *JobData) NameFired(h nats.Header, jobsSeq uint64) error {
	id := FiredJobID(*d, h, jobsSeq)
	if id == d.ID {
		return nil
	}
	if err := ValidateID("data.id", id); err != nil {
		return err
	}
	d.ID = id
	return nil
}
