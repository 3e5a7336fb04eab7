package ingress

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/retryd/retryd/internal/audit"
	"github.com/retryd/retryd/internal/outbox"
	"github.com/retryd/retryd/internal/serve"
	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/services/ingress/internal/ingressstore"
	"github.com/retryd/retryd/stores/pgdb"
	"github.com/retryd/retryd/stores/pgtext"
)

// maxOperatorBody caps the body of operator requests.
const maxOperatorBody = 64 << 10

// endpoints is the intake and operator API. Each description is what
// GET /v1/ says about the route.
var endpoints = []serve.Endpoint[*Service]{
	{Route: serve.Route{Method: http.MethodPost, Path: "/v1/events", Role: serve.RoleProducer,
		Description: "Send one event; 202 once JetStream stored it."}, Serve: (*Service).postEvent},
	{Route: serve.Route{Method: http.MethodPost, Path: "/v1/events:batch", Role: serve.RoleProducer,
		Description: `Send several events in one request ({"events": [...]}, 500 at most by default); 202 once JetStream stored them.`}, Serve: (*Service).postBatch},
	{Route: serve.Route{Method: http.MethodGet, Path: "/v1/events/{id}", Role: serve.RoleViewer,
		Description: "One event as ingress stored it, with its deferral if any."}, Serve: (*Service).getEvent},
	{Route: serve.Route{Method: http.MethodPost, Path: "/v1/events/{id}/cancel", Role: serve.RoleOperator,
		Description: `Cancel a deferred event ({"reason"}; the token's name is recorded as by).`}, Serve: (*Service).cancelEvent},
	{Route: serve.Route{Method: http.MethodGet, Path: "/v1/sources", Role: serve.RoleViewer,
		Description: "List sources and their gates."}, Serve: (*Service).listSources},
	{Route: serve.Route{Method: http.MethodGet, Path: "/v1/sources/{source}", Role: serve.RoleViewer,
		Description: "One source's gate: rate limit, pause, allowed types, deferred events."}, Serve: (*Service).getSource},
	{Route: serve.Route{Method: http.MethodPut, Path: "/v1/sources/{source}", Role: serve.RoleAdmin,
		Description: "Set a source's rate limit and allowed types; releases its held events."}, Serve: (*Service).putSource},
	{Route: serve.Route{Method: http.MethodPost, Path: "/v1/sources/{source}/pause", Role: serve.RoleOperator,
		Description: `Pause a source, optionally until a time ({"until"}); its events are held.`}, Serve: (*Service).pauseSource},
	{Route: serve.Route{Method: http.MethodPost, Path: "/v1/sources/{source}/resume", Role: serve.RoleOperator,
		Description: "Resume a paused source; its held events come back now, in arrival order."}, Serve: (*Service).resumeSource},
}

// intakeEndpoints are the producers' routes; the rest are the operators'.
// They may be served on different listeners (IntakeHandler,
// OperatorHandler), so the port producers reach exposes nothing else.
var intakeEndpoints, operatorEndpoints = splitEndpoints()

func splitEndpoints() (intake, operator []serve.Endpoint[*Service]) {
	for _, e := range endpoints {
		if e.Role == serve.RoleProducer {
			intake = append(intake, e)
		} else {
			operator = append(operator, e)
		}
	}
	return intake, operator
}

// Routes lists the intake and operator API, for the index at GET /v1/.
func Routes() []serve.Route { return serve.Routes(endpoints) }

// IntakeRoutes lists the intake API alone (POST /v1/events and
// /v1/events:batch).
func IntakeRoutes() []serve.Route { return serve.Routes(intakeEndpoints) }

// OperatorRoutes lists the operator API alone (events' reads and cancel,
// sources).
func OperatorRoutes() []serve.Route { return serve.Routes(operatorEndpoints) }

func (s *Service) mount(eps []serve.Endpoint[*Service]) http.Handler {
	mux := http.NewServeMux()
	serve.Mount(mux, s, eps)
	return mux
}

// SourceView is a source's gate as the API shows it.
type SourceView struct {
	Source       string     `json:"source"`
	RateLimit    *int       `json:"rate_limit"`
	RateWindow   string     `json:"rate_window,omitempty"`
	RateWindowMS int64      `json:"rate_window_ms,omitempty"`
	Paused       bool       `json:"paused"`
	PausedUntil  *time.Time `json:"paused_until,omitempty"`
	PauseReason  string     `json:"pause_reason,omitempty"`
	AllowedTypes []string   `json:"allowed_types"`
	Deferred     int64      `json:"deferred"`
	UpdatedBy    string     `json:"updated_by"`
	CreatedAt    time.Time  `json:"created_at"`
	UpdatedAt    time.Time  `json:"updated_at"`
}

func sourceView(src ingressstore.Source) SourceView {
	v := SourceView{
		Source: src.Source, RateLimit: src.RateLimit, Paused: src.Paused, PausedUntil: src.PausedUntil,
		PauseReason: src.PauseReason, AllowedTypes: src.AllowedTypes, Deferred: src.Deferred,
		UpdatedBy: src.UpdatedBy, CreatedAt: src.CreatedAt, UpdatedAt: src.UpdatedAt,
	}
	if src.RateLimit != nil {
		v.RateWindow = src.RateWindow.String()
		v.RateWindowMS = src.RateWindow.Milliseconds()
	}
	return v
}

// sourceParam is the source a route names, as its key: a token source
// is its own key; a URI-reference (percent-encoded in the path) becomes
// the key its events carry (contract.SourceKey).
func sourceParam(r *http.Request) (string, error) {
	source := r.PathValue("source")
	if err := contract.ValidateSource("source", source); err != nil {
		return "", err
	}
	return contract.SourceKey(source), nil
}

func eventParam(r *http.Request) (string, error) {
	id := r.PathValue("id")
	return id, contract.ValidateID("id", id)
}

func (s *Service) listSources(w http.ResponseWriter, r *http.Request) {
	list, err := ingressstore.ListSources(r.Context(), s.cfg.Pool)
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	views := make([]SourceView, len(list))
	for i, src := range list {
		views[i] = sourceView(src)
	}
	serve.WriteJSON(w, http.StatusOK, SourceList{Sources: views})
}

// SourceList is GET /v1/sources.
type SourceList struct {
	Sources []SourceView `json:"sources"`
}

func (s *Service) getSource(w http.ResponseWriter, r *http.Request) {
	source, err := sourceParam(r)
	if err != nil {
		serve.WriteError(w, err)
		return
	}
	src, err := ingressstore.GetSource(r.Context(), s.cfg.Pool, source)
	if err != nil {
		s.writeErr(w, r, notFoundAs(err, fmt.Sprintf("source %q has no gate configured (it has no limits)", source)))
		return
	}
	serve.WriteJSON(w, http.StatusOK, sourceView(src))
}

// PutSourceRequest is the body of PUT /v1/sources/{source}. It replaces
// the rate limit and the allowed types; a pause stays as it is.
type PutSourceRequest struct {
	// RateLimit events per RateWindow; leave both out for no limit.
	RateLimit *int `json:"rate_limit"`
	// RateWindow is a Go duration: "1s", "1m", "1h".
	RateWindow   string   `json:"rate_window"`
	AllowedTypes []string `json:"allowed_types"`
}

func (s *Service) putSource(w http.ResponseWriter, r *http.Request) {
	source, err := sourceParam(r)
	if err != nil {
		serve.WriteError(w, err)
		return
	}
	var req PutSourceRequest
	if err := serve.DecodeJSON(r, maxOperatorBody, &req); err != nil {
		serve.WriteError(w, err)
		return
	}
	cfg := ingressstore.SourceConfig{Source: source, AllowedTypes: req.AllowedTypes, UpdatedBy: serve.Actor(r)}
	if req.RateLimit != nil {
		if *req.RateLimit < 1 || *req.RateLimit > 1_000_000_000 {
			serve.WriteError(w, invalid("rate_limit", fmt.Sprintf("must be between 1 and 1000000000, got %d", *req.RateLimit)))
			return
		}
		cfg.RateLimit = *req.RateLimit
	}
	if req.RateWindow != "" {
		d, err := time.ParseDuration(req.RateWindow)
		if err != nil || d < time.Millisecond || d > 366*24*time.Hour {
			serve.WriteError(w, invalid("rate_window", fmt.Sprintf("%q must be a duration between 1ms and 8784h, such as \"1s\" or \"1m\"", req.RateWindow)))
			return
		}
		cfg.RateWindow = d
	}
	if (cfg.RateLimit == 0) != (cfg.RateWindow == 0) {
		serve.WriteError(w, invalid("rate_window", "rate_limit and rate_window are set together (leave both out for no limit)"))
		return
	}
	if len(req.AllowedTypes) > 1000 {
		serve.WriteError(w, invalid("allowed_types", "has more than 1000 types"))
		return
	}
	for i, typ := range req.AllowedTypes {
		if err := contract.ValidateType(fmt.Sprintf("allowed_types[%d]", i), typ); err != nil {
			serve.WriteError(w, err)
			return
		}
	}
	// The new limit may admit what the old one held back: a release in the
	// same transaction has the scheduler bring the held events back now
	// rather than at the end of the old window.
	var src ingressstore.Source
	err = s.inTx(r.Context(), func(tx pgx.Tx) error {
		if src, err = ingressstore.PutSource(r.Context(), tx, cfg); err != nil {
			return err
		}
		d := audit.Detail{"allowed_types": len(cfg.AllowedTypes)}
		if cfg.RateLimit > 0 {
			d["rate_limit"], d["rate_window"] = cfg.RateLimit, cfg.RateWindow.String()
		}
		if err := audit.Record(r.Context(), tx, audit.SourceSettings, "source/"+source, d); err != nil {
			return err
		}
		return s.release(r.Context(), tx, source, contract.ReleaseLimitChanged, serve.Actor(r))
	})
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	s.relay.Kick()
	s.kickRelease()
	s.types.forget(source)
	s.log.Info().Str("source", source).Interface("rate_limit", src.RateLimit).Dur("rate_window", src.RateWindow).
		Int("allowed_types", len(src.AllowedTypes)).Msg("source gate updated")
	serve.WriteJSON(w, http.StatusOK, sourceView(src))
}

// PauseRequest is the body of POST /v1/sources/{source}/pause; an empty
// body pauses until resumed.
type PauseRequest struct {
	// Until ends the pause by itself (RFC 3339); leave it out to pause
	// until POST .../resume.
	Until  *time.Time `json:"until"`
	Reason string     `json:"reason"`
}

func (s *Service) pauseSource(w http.ResponseWriter, r *http.Request) {
	source, err := sourceParam(r)
	if err != nil {
		serve.WriteError(w, err)
		return
	}
	var req PauseRequest
	if err := serve.DecodeOptionalJSON(r, maxOperatorBody, &req); err != nil {
		serve.WriteError(w, err)
		return
	}
	if req.Until != nil && !req.Until.After(s.cfg.Now()) {
		serve.WriteError(w, invalid("until", fmt.Sprintf("%s is not in the future", req.Until.Format(time.RFC3339))))
		return
	}
	if err := pgtext.Check("reason", req.Reason, 1024); err != nil {
		serve.WriteError(w, err)
		return
	}
	var src ingressstore.Source
	err = s.inTx(r.Context(), func(tx pgx.Tx) error {
		if src, err = ingressstore.PauseSource(r.Context(), tx, source, req.Until, req.Reason, serve.Actor(r)); err != nil {
			return err
		}
		d := audit.Detail{"reason": req.Reason}
		if req.Until != nil {
			d["until"] = req.Until.UTC().Format(time.RFC3339)
		}
		return audit.Record(r.Context(), tx, audit.SourcePause, "source/"+source, d)
	})
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	e := s.log.Info().Str("source", source)
	if req.Until != nil {
		e = e.Time("until", *req.Until)
	}
	e.Msg("source paused")
	serve.WriteJSON(w, http.StatusOK, sourceView(src))
}

// resumeSource ends a source's pause and, in the same transaction, puts
// retry.event.released.<source> in the outbox: the scheduler then makes
// every event the pause holds due, in arrival order (at once, or paced at
// the source's rate limit), instead of at the pause's end or its
// max_hold.
func (s *Service) resumeSource(w http.ResponseWriter, r *http.Request) {
	source, err := sourceParam(r)
	if err != nil {
		serve.WriteError(w, err)
		return
	}
	var src ingressstore.Source
	err = s.inTx(r.Context(), func(tx pgx.Tx) error {
		if src, err = ingressstore.ResumeSource(r.Context(), tx, source, serve.Actor(r)); err != nil {
			return err
		}
		if err := audit.Record(r.Context(), tx, audit.SourceResume, "source/"+source, nil); err != nil {
			return err
		}
		return s.release(r.Context(), tx, source, contract.ReleaseResume, serve.Actor(r))
	})
	if err != nil {
		s.writeErr(w, r, notFoundAs(err, fmt.Sprintf("source %q has no gate configured", source)))
		return
	}
	s.relay.Kick()
	s.kickRelease()
	s.log.Info().Str("source", source).Int64("deferred", src.Deferred).Msg("source resumed: held events released")
	serve.WriteJSON(w, http.StatusOK, sourceView(src))
}

// release puts retry.event.released.<source> in the outbox of tx, which
// has just changed the source's row. Its time is read after that change,
// so it is later than any gate decision made under the old settings (the
// gate holds the source row FOR SHARE while it decides): the scheduler
// releases such a hold even if it arrives after the release.
//
// The held events are put in a release line first
// (ingressstore.PaceRelease), each at its slot of the rate limit (or at
// once without one), and the release says so (owner_admits, with the
// pace): this instance's releaser admits them itself, in order, and the
// scheduler emits no due for them, only a fallback one if ingress never
// answers. Under a rate limit newcomers queue behind the line.
func (s *Service) release(ctx context.Context, tx pgx.Tx, source, reason, by string) error {
	pace, paced, err := ingressstore.PaceRelease(ctx, tx, source)
	if err != nil {
		return err
	}
	var at time.Time
	if err := tx.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&at); err != nil {
		return fmt.Errorf("read database clock: %w", err)
	}
	switch {
	case pace != nil:
		s.log.Info().Str("source", source).Int64("events", paced).Int("rate_limit", pace.Limit).
			Time("from", pace.From).Msg("release paced at the source's rate limit")
	case paced > 0:
		s.log.Info().Str("source", source).Int64("events", paced).Msg("release: held events lined up for admission")
	}
	m, err := releasedMsg(source, reason, by, at, pace, paced > 0, s.cfg.Now())
	if err != nil {
		return err
	}
	return outbox.Insert(ctx, tx, OutboxOwner, m)
}

// EventView is an event's status and, when it was deferred, its retry.
type EventView struct {
	ID         string     `json:"id"`
	Source     string     `json:"source"`
	Type       string     `json:"type"`
	Status     string     `json:"status"`
	ReceivedAt time.Time  `json:"received_at"`
	AdmittedAt *time.Time `json:"admitted_at,omitempty"`
	UpdatedAt  time.Time  `json:"updated_at"`
	Retry      *RetryView `json:"retry"`
}

// RetryView is an event's row of event_ingress_retries.
type RetryView struct {
	State         string         `json:"retry_state"`
	Attempts      int            `json:"attempts"`
	NextAttemptAt *time.Time     `json:"next_attempt_at,omitempty"`
	LastError     string         `json:"last_error"`
	Metadata      map[string]any `json:"metadata"`
	CreatedAt     time.Time      `json:"created_at"`
	UpdatedAt     time.Time      `json:"updated_at"`
}

func (s *Service) eventView(ctx context.Context, db ingressstore.DB, ev ingressstore.Event) (EventView, error) {
	v := EventView{ID: ev.ID, Source: ev.Source, Type: ev.Type, Status: string(ev.Status),
		ReceivedAt: ev.ReceivedAt, AdmittedAt: ev.AdmittedAt, UpdatedAt: ev.UpdatedAt}
	r, err := ingressstore.GetRetry(ctx, db, ev.ID)
	switch {
	case errors.Is(err, pgdb.ErrNotFound):
	case err != nil:
		return EventView{}, err
	default:
		v.Retry = &RetryView{State: string(r.State), Attempts: r.Attempts, NextAttemptAt: r.NextAttemptAt,
			LastError: r.LastError, Metadata: r.Metadata, CreatedAt: r.CreatedAt, UpdatedAt: r.UpdatedAt}
	}
	return v, nil
}

func (s *Service) getEvent(w http.ResponseWriter, r *http.Request) {
	id, err := eventParam(r)
	if err != nil {
		serve.WriteError(w, err)
		return
	}
	ev, err := ingressstore.GetEvent(r.Context(), s.cfg.Pool, id)
	if err != nil {
		s.writeErr(w, r, notFoundAs(err, fmt.Sprintf("event %q is not stored (not accepted, or still in INGEST)", id)))
		return
	}
	v, err := s.eventView(r.Context(), s.cfg.Pool, ev)
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	serve.WriteJSON(w, http.StatusOK, v)
}

// CancelRequest is the optional body of POST /v1/events/{id}/cancel.
type CancelRequest struct {
	Reason string `json:"reason"`
	// By names who cancels (default "operator").
	By string `json:"by"`
}

// cancelEvent cancels a deferral: the event is never admitted, and the
// scheduler closes the retry on retry.event.cancelled.<id>. Cancelling a
// cancelled event again is a no-op (200); an event already admitted or
// exhausted is a conflict (409).
func (s *Service) cancelEvent(w http.ResponseWriter, r *http.Request) {
	id, err := eventParam(r)
	if err != nil {
		serve.WriteError(w, err)
		return
	}
	var req CancelRequest
	if err := serve.DecodeOptionalJSON(r, maxOperatorBody, &req); err != nil {
		serve.WriteError(w, err)
		return
	}
	// A "by" in the body is ignored: the record names the token's
	// principal.
	req.By = serve.Actor(r)
	if err := pgtext.CheckActor(req.By, req.Reason, 1024); err != nil {
		serve.WriteError(w, err)
		return
	}
	var view EventView
	var cancelled bool
	err = s.inTx(r.Context(), func(tx pgx.Tx) error {
		cancelled = false
		ev, err := ingressstore.LockEvent(r.Context(), tx, id)
		if err != nil {
			return notFoundAs(err, fmt.Sprintf("event %q is not stored", id))
		}
		switch ev.Status {
		case ingressstore.StatusCancelled:
		case ingressstore.StatusDeferred:
			last := 0
			if rr, err := ingressstore.GetRetry(r.Context(), tx, id); err == nil {
				last = rr.Attempts
			} else if !errors.Is(err, pgdb.ErrNotFound) {
				return err
			}
			if err := s.cancelDeferral(r.Context(), tx, ev, last, req.By, req.Reason); err != nil {
				return err
			}
			// Only a cancel that changed something is recorded: cancelling
			// a cancelled event again is a no-op.
			if err := audit.Record(r.Context(), tx, audit.EventCancel, "event/"+id, audit.Detail{"reason": req.Reason, "source": ev.Source}); err != nil {
				return err
			}
			cancelled = true
			if ev, err = ingressstore.GetEvent(r.Context(), tx, id); err != nil {
				return err
			}
		default:
			return fmt.Errorf("event %q is %s, only a deferred event can be cancelled: %w", id, ev.Status, pgdb.ErrConflict)
		}
		view, err = s.eventView(r.Context(), tx, ev)
		return err
	})
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	if cancelled {
		s.relay.Kick()
		s.metrics.retry(view.Source, retryCancelled)
		s.log.Info().Str("source", view.Source).Str("event_id", id).Str("by", req.By).Msg("deferred event cancelled")
	}
	serve.WriteJSON(w, http.StatusOK, view)
}

// writeErr answers err; the service's own failures (5xx) are logged, the
// client's are only answered.
func (s *Service) writeErr(w http.ResponseWriter, r *http.Request, err error) {
	serve.WriteErrorLog(w, r, s.log, err)
}

// notFoundAs says what the store's pgdb.ErrNotFound in err means to the
// client (a 404 with that message); other errors stay as they are.
func notFoundAs(err error, what string) error {
	if errors.Is(err, pgdb.ErrNotFound) {
		return fmt.Errorf("%s: %w", what, pgdb.ErrNotFound)
	}
	return err
}
