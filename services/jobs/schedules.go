package jobs

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/retryd/retryd/internal/audit"
	"github.com/retryd/retryd/internal/serve"
	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/stores/pgdb"
)

// MaxSchedules is how many schedules GET /v1/schedules lists.
const MaxSchedules = 1000

// ScheduleRequest is the body of PUT /v1/schedules/{job_type}/{name}:
// when the job runs (every, or cron with an optional time_zone) and the
// job each tick runs.
type ScheduleRequest struct {
	// Every is a Go duration of at least a second ("1s", "15m").
	Every string `json:"every,omitempty"`
	// Cron is six fields, seconds first ("0 30 2 * * *"), or @hourly,
	// @daily, @weekly, @monthly, @yearly.
	Cron     string `json:"cron,omitempty"`
	TimeZone string `json:"time_zone,omitempty"`
	JobFields
}

// ScheduleView is a periodic schedule as the API shows it.
type ScheduleView struct {
	JobType string `json:"job_type"`
	Name    string `json:"name"`
	// Pattern is what the server reads: "@every 1s" or a cron expression.
	Pattern  string `json:"pattern"`
	TimeZone string `json:"time_zone,omitempty"`
	// JobID is the schedule's job id; each tick's job is
	// "<job_id>-<its sequence in JOBS>".
	JobID string `json:"job_id"`
	JobFields
	// UpdatedAt is when this version of the schedule was stored.
	UpdatedAt time.Time `json:"updated_at"`
}

// ScheduleList is the body of GET /v1/schedules.
type ScheduleList struct {
	Schedules []ScheduleView `json:"schedules"`
}

// scheduleJobID is the job id of schedule name: ticks add their sequence.
func scheduleJobID(name string) string { return "sched-" + name }

func (req ScheduleRequest) pattern() (string, error) {
	switch {
	case req.Every != "" && req.Cron != "":
		return "", invalid("every", "give every or cron, not both")
	case req.Every != "":
		return "@every " + req.Every, nil
	case req.Cron != "":
		return req.Cron, nil
	}
	return "", invalid("every", "a schedule needs every or cron")
}

func (a *API) schedulesStream(ctx context.Context) (jetstream.Stream, error) {
	s, err := a.cfg.JS.Stream(ctx, contract.StreamSchedules)
	if err != nil {
		return nil, fmt.Errorf("open stream %s: %w", contract.StreamSchedules, err)
	}
	return s, nil
}

func (a *API) handlePutSchedule(w http.ResponseWriter, r *http.Request) {
	jobType, name := r.PathValue("job_type"), r.PathValue("name")
	var req ScheduleRequest
	if err := serve.DecodeJSON(r, a.cfg.MaxBodyBytes, &req); err != nil {
		serve.WriteError(w, err)
		return
	}
	pattern, err := req.pattern()
	if err == nil {
		err = contract.ValidateSchedulePattern(pattern, req.TimeZone)
	}
	if err == nil {
		err = contract.ValidateToken("job_type", jobType)
	}
	if err == nil {
		err = contract.ValidateToken("name", name)
	}
	if err != nil {
		serve.WriteError(w, err)
		return
	}
	msg, err := contract.NewScheduleMsg(EnqueueSource, name, pattern, req.TimeZone, req.firstRun(scheduleJobID(name), jobType), a.cfg.Now())
	if err != nil {
		serve.WriteError(w, err)
		return
	}
	if _, err := a.cfg.JS.PublishMsg(r.Context(), msg); err != nil {
		// The server is the judge of a cron expression.
		var apiErr *jetstream.APIError
		if errors.As(err, &apiErr) && apiErr.Code == http.StatusBadRequest {
			serve.WriteError(w, invalid("cron", "is refused by the server: "+apiErr.Description))
			return
		}
		a.writeErr(w, r, fmt.Errorf("publish schedule %s/%s: %w", jobType, name, err))
		return
	}
	if err := audit.Record(r.Context(), a.cfg.Pool, audit.SchedulePut, "schedule/"+jobType+"/"+name, audit.Detail{"pattern": pattern}); err != nil {
		a.writeErr(w, r, err)
		return
	}
	a.log.Info().Str("job_type", jobType).Str("schedule", name).Str("pattern", pattern).Msg("schedule stored")
	view, err := a.schedule(r.Context(), jobType, name)
	if err != nil {
		a.writeErr(w, r, err)
		return
	}
	serve.WriteJSON(w, http.StatusOK, view)
}

func (a *API) handleGetSchedule(w http.ResponseWriter, r *http.Request) {
	view, err := a.schedule(r.Context(), r.PathValue("job_type"), r.PathValue("name"))
	if err != nil {
		a.writeErr(w, r, err)
		return
	}
	serve.WriteJSON(w, http.StatusOK, view)
}

func (a *API) handleDeleteSchedule(w http.ResponseWriter, r *http.Request) {
	jobType, name := r.PathValue("job_type"), r.PathValue("name")
	if _, err := a.schedule(r.Context(), jobType, name); err != nil {
		a.writeErr(w, r, err)
		return
	}
	s, err := a.schedulesStream(r.Context())
	if err == nil {
		err = s.Purge(r.Context(), jetstream.WithPurgeSubject(contract.ScheduleSubject(jobType, name)))
	}
	if err != nil {
		a.writeErr(w, r, fmt.Errorf("delete schedule %s/%s: %w", jobType, name, err))
		return
	}
	if err := audit.Record(r.Context(), a.cfg.Pool, audit.ScheduleDelete, "schedule/"+jobType+"/"+name, nil); err != nil {
		a.writeErr(w, r, err)
		return
	}
	a.log.Info().Str("job_type", jobType).Str("schedule", name).Msg("schedule deleted")
	w.WriteHeader(http.StatusNoContent)
}

func (a *API) handleListSchedules(w http.ResponseWriter, r *http.Request) {
	s, err := a.schedulesStream(r.Context())
	var info *jetstream.StreamInfo
	if err == nil {
		info, err = s.Info(r.Context(), jetstream.WithSubjectFilter("schedules.>"))
	}
	if err != nil {
		a.writeErr(w, r, fmt.Errorf("list schedules: %w", err))
		return
	}
	subjects := make([]string, 0, len(info.State.Subjects))
	for subj := range info.State.Subjects {
		subjects = append(subjects, subj)
	}
	slices.Sort(subjects)
	list := ScheduleList{Schedules: []ScheduleView{}}
	for _, subj := range subjects[:min(len(subjects), MaxSchedules)] {
		jobType, name, err := contract.ParseScheduleSubject(subj)
		if err != nil {
			continue
		}
		view, err := a.schedule(r.Context(), jobType, name)
		if errors.Is(err, pgdb.ErrNotFound) {
			continue // deleted since the stream's info
		}
		if err != nil {
			a.writeErr(w, r, err)
			return
		}
		list.Schedules = append(list.Schedules, view)
	}
	serve.WriteJSON(w, http.StatusOK, list)
}

// schedule reads schedule name of jobType from SCHEDULES.
func (a *API) schedule(ctx context.Context, jobType, name string) (ScheduleView, error) {
	if err := contract.ValidateToken("job_type", jobType); err != nil {
		return ScheduleView{}, err
	}
	if err := contract.ValidateToken("name", name); err != nil {
		return ScheduleView{}, err
	}
	s, err := a.schedulesStream(ctx)
	if err != nil {
		return ScheduleView{}, err
	}
	raw, err := s.GetLastMsgForSubject(ctx, contract.ScheduleSubject(jobType, name))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return ScheduleView{}, fmt.Errorf("schedule %s/%s: %w", jobType, name, pgdb.ErrNotFound)
	}
	if err != nil {
		return ScheduleView{}, fmt.Errorf("read schedule %s/%s: %w", jobType, name, err)
	}
	target := strings.TrimPrefix(raw.Header.Get(contract.HeaderScheduleTarget), "fired.")
	_, job, err := contract.DecodeJob(target, raw.Data)
	if err != nil {
		return ScheduleView{}, fmt.Errorf("decode schedule %s/%s: %w", jobType, name, err)
	}
	return ScheduleView{
		JobType: jobType, Name: name, Pattern: raw.Header.Get(contract.HeaderSchedule),
		TimeZone: raw.Header.Get(contract.HeaderScheduleTimeZone), JobID: job.ID, JobFields: jobFieldsOf(job),
		UpdatedAt: raw.Time.UTC(),
	}, nil
}
