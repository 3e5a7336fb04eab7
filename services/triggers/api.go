package triggers

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/retryd/retryd/internal/audit"
	"github.com/retryd/retryd/internal/serve"
	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/services/triggers/internal/triggerstore"
	"github.com/retryd/retryd/stores/pgdb"
)

// endpoints is the trigger API. Each description is what GET /v1/ says
// about the route.
var endpoints = []serve.Endpoint[*Service]{
	{Route: serve.Route{Method: http.MethodPost, Path: "/v1/triggers", Role: serve.RoleAdmin,
		Description: "Create a trigger."}, Serve: (*Service).createTrigger},
	{Route: serve.Route{Method: http.MethodGet, Path: "/v1/triggers", Role: serve.RoleViewer,
		Description: "List triggers (?source=&event_type=&enabled=&after=&limit=)."}, Serve: (*Service).listTriggers},
	{Route: serve.Route{Method: http.MethodGet, Path: "/v1/triggers/{id}", Role: serve.RoleViewer,
		Description: "One trigger."}, Serve: (*Service).getTrigger},
	{Route: serve.Route{Method: http.MethodPut, Path: "/v1/triggers/{id}", Role: serve.RoleAdmin,
		Description: "Replace a trigger's definition."}, Serve: (*Service).putTrigger},
	{Route: serve.Route{Method: http.MethodDelete, Path: "/v1/triggers/{id}", Role: serve.RoleAdmin,
		Description: "Delete a trigger (its id is never reused)."}, Serve: (*Service).deleteTrigger},
	{Route: serve.Route{Method: http.MethodPost, Path: "/v1/triggers/{id}/enable", Role: serve.RoleAdmin,
		Description: "Switch a trigger on."}, Serve: func(s *Service, w http.ResponseWriter, r *http.Request) { s.setEnabled(true)(w, r) }},
	{Route: serve.Route{Method: http.MethodPost, Path: "/v1/triggers/{id}/disable", Role: serve.RoleAdmin,
		Description: "Switch a trigger off."}, Serve: func(s *Service, w http.ResponseWriter, r *http.Request) { s.setEnabled(false)(w, r) }},
	{Route: serve.Route{Method: http.MethodGet, Path: "/v1/triggers/{id}/versions", Role: serve.RoleViewer,
		Description: "Every version of a trigger's definition."}, Serve: (*Service).listVersions},
	{Route: serve.Route{Method: http.MethodGet, Path: "/v1/triggers/{id}/deliveries", Role: serve.RoleViewer,
		Description: "A trigger's deliveries, newest first (?status=&before=&limit=)."}, Serve: (*Service).listDeliveries},
	{Route: serve.Route{Method: http.MethodGet, Path: "/v1/deliveries/{id}", Role: serve.RoleViewer,
		Description: "One delivery."}, Serve: (*Service).getDelivery},
}

// Routes lists the trigger API, for the index at GET /v1/.
func Routes() []serve.Route { return serve.Routes(allEndpoints()) }

// Handler serves the trigger API under /v1/ (Routes lists it), to the
// principals a serve.Guard in front finds, by the role each route names.
// Every change bumps the trigger's version; a definition is compiled and
// type-checked before it is saved.
func (s *Service) Handler() http.Handler {
	mux := http.NewServeMux()
	serve.Mount(mux, s, allEndpoints())
	mux.HandleFunc("/v1/", func(w http.ResponseWriter, r *http.Request) {
		serve.WriteError(w, fmt.Errorf("%s %s: %w", r.Method, r.URL.Path, pgdb.ErrNotFound))
	})
	return mux
}

// storeErr maps store errors to the API's; what names the resource.
func storeErr(err error, what string) error {
	switch {
	case errors.Is(err, pgdb.ErrNotFound):
		return fmt.Errorf("%s %w", what, pgdb.ErrNotFound)
	case errors.Is(err, pgdb.ErrConflict):
		return fmt.Errorf("%s already exists (ids are never reused): %w", what, pgdb.ErrConflict)
	}
	return err
}

// writeErr answers err; the service's own failures (5xx) are logged, the
// client's are not.
func (s *Service) writeErr(w http.ResponseWriter, r *http.Request, err error) {
	serve.WriteErrorLog(w, r, s.log, err)
}

func pathID(r *http.Request) (string, error) {
	id := r.PathValue("id")
	return id, contract.ValidateID("id", id)
}

func (s *Service) createTrigger(w http.ResponseWriter, r *http.Request) {
	var in TriggerInput
	if err := serve.DecodeJSON(r, s.cfg.MaxBodyBytes, &in); err != nil {
		s.writeErr(w, r, err)
		return
	}
	def, progs, err := in.definition(s.exprs, true)
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	id := in.ID
	if id == "" {
		id = contract.NewID()
	}
	var t triggerstore.Trigger
	err = pgx.BeginFunc(r.Context(), s.cfg.Pool, func(tx pgx.Tx) error {
		if t, err = triggerstore.CreateTrigger(r.Context(), tx, id, def); err != nil {
			return err
		}
		return recordChange(r.Context(), tx, audit.TriggerCreate, t)
	})
	if err != nil {
		s.writeErr(w, r, storeErr(err, "trigger "+id))
		return
	}
	s.programs.put(programKey{t.ID, t.Version}, progs)
	s.logChange(t, "created")
	w.Header().Set("Location", "/v1/triggers/"+t.ID)
	serve.WriteJSON(w, http.StatusCreated, viewTrigger(t))
}

func (s *Service) getTrigger(w http.ResponseWriter, r *http.Request) {
	id, err := pathID(r)
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	t, err := triggerstore.GetTrigger(r.Context(), s.cfg.Pool, id)
	if err != nil {
		s.writeErr(w, r, storeErr(err, "trigger "+id))
		return
	}
	serve.WriteJSON(w, http.StatusOK, viewTrigger(t))
}

func (s *Service) putTrigger(w http.ResponseWriter, r *http.Request) {
	id, err := pathID(r)
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	var in TriggerInput
	if err := serve.DecodeJSON(r, s.cfg.MaxBodyBytes, &in); err != nil {
		s.writeErr(w, r, err)
		return
	}
	if in.ID != "" && in.ID != id {
		s.writeErr(w, r, invalidField("id", fmt.Sprintf("%q does not match the id in the path %q", in.ID, id)))
		return
	}
	var t triggerstore.Trigger
	var changed bool
	var progs compiled
	err = pgx.BeginFunc(r.Context(), s.cfg.Pool, func(tx pgx.Tx) error {
		cur, err := triggerstore.LockTrigger(r.Context(), tx, id)
		if err != nil {
			return storeErr(err, "trigger "+id)
		}
		if cur.Deleted() {
			return storeErr(pgdb.ErrNotFound, "trigger "+id)
		}
		def, p, err := in.definition(s.exprs, cur.Enabled)
		if err != nil {
			return err
		}
		progs = p
		if t, changed, err = triggerstore.UpdateTrigger(r.Context(), tx, id, def); err != nil {
			return storeErr(err, "trigger "+id)
		}
		if !changed {
			return nil // the same definition again: no version, no entry
		}
		return recordChange(r.Context(), tx, audit.TriggerUpdate, t)
	})
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	// Only committed versions are cached: a version number that rolled
	// back is reused by the next change.
	s.programs.put(programKey{t.ID, t.Version}, progs)
	if changed {
		s.logChange(t, "updated")
	}
	serve.WriteJSON(w, http.StatusOK, viewTrigger(t))
}

func (s *Service) deleteTrigger(w http.ResponseWriter, r *http.Request) {
	id, err := pathID(r)
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	var t triggerstore.Trigger
	err = pgx.BeginFunc(r.Context(), s.cfg.Pool, func(tx pgx.Tx) error {
		if t, err = triggerstore.DeleteTrigger(r.Context(), tx, id); err != nil {
			return err
		}
		return recordChange(r.Context(), tx, audit.TriggerDelete, t)
	})
	if err != nil {
		s.writeErr(w, r, storeErr(err, "trigger "+id))
		return
	}
	s.logChange(t, "deleted")
	w.WriteHeader(http.StatusNoContent)
}

func (s *Service) setEnabled(enabled bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		id, err := pathID(r)
		if err != nil {
			s.writeErr(w, r, err)
			return
		}
		var t triggerstore.Trigger
		var changed bool
		err = pgx.BeginFunc(r.Context(), s.cfg.Pool, func(tx pgx.Tx) error {
			if t, changed, err = triggerstore.SetEnabled(r.Context(), tx, id, enabled); err != nil || !changed {
				return err
			}
			return recordChange(r.Context(), tx, map[bool]string{true: audit.TriggerEnable, false: audit.TriggerDisable}[enabled], t)
		})
		if err != nil {
			s.writeErr(w, r, storeErr(err, "trigger "+id))
			return
		}
		if changed {
			s.logChange(t, map[bool]string{true: "enabled", false: "disabled"}[enabled])
		}
		serve.WriteJSON(w, http.StatusOK, viewTrigger(t))
	}
}

// recordChange writes the audit entry of a change to t, in its
// transaction tx.
func recordChange(ctx context.Context, tx pgx.Tx, action string, t triggerstore.Trigger) error {
	return audit.Record(ctx, tx, action, "trigger/"+t.ID, audit.Detail{"version": t.Version, "source": t.Source, "enabled": t.Enabled})
}

func (s *Service) logChange(t triggerstore.Trigger, what string) {
	s.log.Info().Str("trigger_id", t.ID).Int("version", t.Version).Str("source", t.Source).
		Str("type", t.EventType).Str("workflow", t.Workflow).Bool("enabled", t.Enabled).Msg("trigger " + what)
}

// viewAll is the API's view of each of xs, in order.
func viewAll[T, V any](xs []T, view func(T) V) []V {
	out := make([]V, len(xs))
	for i, x := range xs {
		out[i] = view(x)
	}
	return out
}

// queryLimit reads ?limit= (1 to 500, default 100).
func queryLimit(r *http.Request) (int, error) {
	v := r.URL.Query().Get("limit")
	if v == "" {
		return 100, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > 500 {
		return 0, invalidField("limit", fmt.Sprintf("must be a number between 1 and 500, got %q", v))
	}
	return n, nil
}

func (s *Service) listTriggers(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	o := triggerstore.ListTriggersOptions{Source: q.Get("source"), EventType: q.Get("event_type"), After: q.Get("after")}
	var err error
	if o.Limit, err = queryLimit(r); err != nil {
		s.writeErr(w, r, err)
		return
	}
	if v := q.Get("enabled"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			s.writeErr(w, r, invalidField("enabled", fmt.Sprintf("must be true or false, got %q", v)))
			return
		}
		o.Enabled = &b
	}
	ts, err := triggerstore.ListTriggers(r.Context(), s.cfg.Pool, o)
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	out := struct {
		Triggers []TriggerView `json:"triggers"`
		Next     string        `json:"next,omitempty"`
	}{Triggers: viewAll(ts, viewTrigger)}
	if len(ts) == o.Limit {
		out.Next = ts[len(ts)-1].ID
	}
	serve.WriteJSON(w, http.StatusOK, out)
}

func (s *Service) listVersions(w http.ResponseWriter, r *http.Request) {
	id, err := pathID(r)
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	vs, err := triggerstore.ListVersions(r.Context(), s.cfg.Pool, id)
	if err != nil {
		s.writeErr(w, r, storeErr(err, "trigger "+id))
		return
	}
	out := struct {
		Versions []VersionView `json:"versions"`
	}{Versions: viewAll(vs, viewVersion)}
	serve.WriteJSON(w, http.StatusOK, out)
}

// DeliveryView is how the API shows a delivery.
type DeliveryView struct {
	ID             string         `json:"id"`
	TriggerID      string         `json:"trigger_id"`
	TriggerVersion int            `json:"trigger_version"`
	EventID        string         `json:"event_id"`
	Source         string         `json:"source"`
	EventType      string         `json:"event_type"`
	Status         string         `json:"status"`
	StatusReason   string         `json:"status_reason,omitempty"`
	RunID          string         `json:"run_id,omitempty"`
	RetryState     string         `json:"retry_state"`
	RetryAttempts  int            `json:"retry_attempts"`
	NextAttemptAt  *time.Time     `json:"next_attempt_at,omitempty"`
	RetryMetadata  map[string]any `json:"retry_metadata,omitempty"`
	CreatedAt      time.Time      `json:"created_at"`
	UpdatedAt      time.Time      `json:"updated_at"`
	LaunchedAt     *time.Time     `json:"launched_at,omitempty"`
}

func viewDelivery(d triggerstore.Delivery) DeliveryView {
	return DeliveryView{
		ID: d.ID, TriggerID: d.TriggerID, TriggerVersion: d.TriggerVersion, EventID: d.EventID,
		Source: d.Source, EventType: d.EventType, Status: string(d.Status), StatusReason: d.StatusReason,
		RunID: d.RunID, RetryState: string(d.RetryState), RetryAttempts: d.RetryAttempts,
		NextAttemptAt: d.NextAttemptAt, RetryMetadata: d.RetryMetadata, CreatedAt: d.CreatedAt,
		UpdatedAt: d.UpdatedAt, LaunchedAt: d.LaunchedAt,
	}
}

var deliveryStatuses = map[string]bool{
	string(triggerstore.StatusLaunched): true, string(triggerstore.StatusFiltered): true,
	string(triggerstore.StatusThrottled): true, string(triggerstore.StatusConcurrencyLimited): true,
	string(triggerstore.StatusCancelled): true, string(triggerstore.StatusExhausted): true,
}

func (s *Service) listDeliveries(w http.ResponseWriter, r *http.Request) {
	id, err := pathID(r)
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	q := r.URL.Query()
	o := triggerstore.ListDeliveriesOptions{TriggerID: id, Status: triggerstore.Status(q.Get("status")), Before: q.Get("before")}
	if o.Status != "" && !deliveryStatuses[string(o.Status)] {
		s.writeErr(w, r, invalidField("status", fmt.Sprintf("%q is not a delivery status", o.Status)))
		return
	}
	if o.Limit, err = queryLimit(r); err != nil {
		s.writeErr(w, r, err)
		return
	}
	if _, err := triggerstore.ListVersions(r.Context(), s.cfg.Pool, id); err != nil {
		s.writeErr(w, r, storeErr(err, "trigger "+id))
		return
	}
	ds, err := triggerstore.ListDeliveries(r.Context(), s.cfg.Pool, o)
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	out := struct {
		Deliveries []DeliveryView `json:"deliveries"`
		Next       string         `json:"next,omitempty"`
	}{Deliveries: viewAll(ds, viewDelivery)}
	if len(ds) == o.Limit {
		out.Next = ds[len(ds)-1].ID
	}
	serve.WriteJSON(w, http.StatusOK, out)
}

func (s *Service) getDelivery(w http.ResponseWriter, r *http.Request) {
	id, err := pathID(r)
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	d, err := triggerstore.GetDelivery(r.Context(), s.cfg.Pool, id)
	if err != nil {
		s.writeErr(w, r, storeErr(err, "delivery "+id))
		return
	}
	serve.WriteJSON(w, http.StatusOK, viewDelivery(d))
}
