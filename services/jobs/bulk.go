package jobs

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/retryd/retryd/internal/audit"
	"github.com/retryd/retryd/internal/serve"
	"github.com/retryd/retryd/internal/wait"
	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/stores/jobstore"
	"github.com/retryd/retryd/stores/pgdb"
	"github.com/retryd/retryd/stores/pgtext"
)

// BulkFilter selects the jobs of a bulk retry. Status defaults to the
// exhausted statuses, failed and failed_max_retries.
type BulkFilter struct {
	Status        Statuses   `json:"status,omitempty"`
	JobType       string     `json:"job_type,omitempty"`
	ErrorClass    string     `json:"error_class,omitempty"`
	MinRetryCount int        `json:"min_retry_count,omitempty"`
	Since         *time.Time `json:"since,omitempty"`
	Until         *time.Time `json:"until,omitempty"`
}

// Statuses is one status ("failed") or a list (["failed", "cancelled"]).
type Statuses []jobstore.Status

// UnmarshalJSON accepts a string or an array of strings.
func (s *Statuses) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	if len(b) > 0 && b[0] == '"' {
		var one jobstore.Status
		if err := json.Unmarshal(b, &one); err != nil {
			return err
		}
		*s = Statuses{one}
		return nil
	}
	var many []jobstore.Status
	if err := json.Unmarshal(b, &many); err != nil {
		return err
	}
	*s = many
	return nil
}

// BulkRetryRequest is the body of POST /v1/jobs/bulk-retry. DryRun is
// required, so that a bulk action is never started by accident.
type BulkRetryRequest struct {
	Filter        BulkFilter `json:"filter"`
	DryRun        *bool      `json:"dry_run"`
	RatePerSecond float64    `json:"rate_per_second,omitempty"`
	Reason        string     `json:"reason,omitempty"`
	By            string     `json:"by,omitempty"`
	ResetAttempts bool       `json:"reset_attempts,omitempty"`
}

// DryRunResponse answers a dry run: how many jobs the filter matches now.
type DryRunResponse struct {
	DryRun  bool  `json:"dry_run"`
	Matched int64 `json:"matched"`
}

// OperationResponse is GET /v1/operations/{id} (and the answer to a real
// bulk retry): the operation's progress and, for a finished item that was
// skipped or failed, why.
type OperationResponse struct {
	Operation jobstore.Operation       `json:"operation"`
	Problems  []jobstore.OperationItem `json:"problems"`
}

// maxProblems bounds the problem items GET /v1/operations/{id} shows.
const maxProblems = 100

// releaseTimeout bounds the release of one job of a bulk retry.
const releaseTimeout = 30 * time.Second

func (f BulkFilter) toFilter() (jobstore.Filter, error) {
	out := jobstore.Filter{
		JobType: f.JobType, ErrorClass: f.ErrorClass,
		MinRetryCount: f.MinRetryCount, Since: f.Since, Until: f.Until,
	}
	for _, st := range f.Status {
		sts, err := parseStatus("filter.status", string(st))
		if err != nil {
			return out, err
		}
		out.Statuses = append(out.Statuses, sts...)
	}
	if len(out.Statuses) == 0 {
		out.Statuses = slices.Clone(permanentlyFailed)
	}
	if out.JobType != "" {
		if err := contract.ValidateToken("filter.job_type", out.JobType); err != nil {
			return out, err
		}
	}
	if out.ErrorClass != "" {
		if err := contract.ValidateToken("filter.error_class", out.ErrorClass); err != nil {
			return out, err
		}
	}
	if out.MinRetryCount < 0 {
		return out, invalid("filter.min_retry_count", "must not be negative")
	}
	if out.Since != nil && out.Until != nil && !out.Until.After(*out.Since) {
		return out, invalid("filter.until", "must be after filter.since")
	}
	return out, nil
}

func (a *API) handleBulkRetry(w http.ResponseWriter, r *http.Request) {
	var req BulkRetryRequest
	if err := serve.DecodeJSON(r, a.cfg.MaxBodyBytes, &req); err != nil {
		serve.WriteError(w, err)
		return
	}
	f, err := req.Filter.toFilter()
	if err != nil {
		serve.WriteError(w, err)
		return
	}
	if req.DryRun == nil {
		serve.WriteError(w, invalid("dry_run", "is required: true to count the matching jobs, false to retry them"))
		return
	}
	if req.RatePerSecond == 0 {
		req.RatePerSecond = DefaultRatePerSecond
	}
	if !(req.RatePerSecond > 0 && req.RatePerSecond <= MaxRatePerSecond) {
		serve.WriteError(w, invalid("rate_per_second", fmt.Sprintf("must be above 0 and at most %d", MaxRatePerSecond)))
		return
	}
	// A "by" in the body is ignored: the operation names the token's
	// principal.
	req.By = serve.Actor(r)
	if err := pgtext.CheckActor(req.By, req.Reason, 1024); err != nil {
		serve.WriteError(w, err)
		return
	}
	if *req.DryRun {
		n, err := jobstore.Count(r.Context(), a.cfg.Pool, f)
		if err != nil {
			a.writeErr(w, r, err)
			return
		}
		serve.WriteJSON(w, http.StatusOK, DryRunResponse{DryRun: true, Matched: n})
		return
	}
	filterJSON, err := json.Marshal(req.Filter)
	if err != nil {
		a.writeErr(w, r, err)
		return
	}
	var op jobstore.Operation
	err = pgx.BeginFunc(r.Context(), a.cfg.Pool, func(tx pgx.Tx) error {
		op, err = jobstore.CreateBulkRetry(r.Context(), tx, jobstore.NewBulkRetry{
			ID: "op-" + contract.NewID(), Filter: f, FilterJSON: filterJSON, Reason: req.Reason,
			RequestedBy: req.By, ResetAttempts: req.ResetAttempts, RatePerSecond: req.RatePerSecond,
		})
		if err != nil {
			return err
		}
		// One entry for the operation; its items are retried later by the
		// runner, with no request, and record none.
		return audit.Record(r.Context(), tx, audit.JobBulkRetry, "operation/"+op.ID, audit.Detail{
			"reason": req.Reason, "total": op.Total, "rate_per_second": op.RatePerSecond, "reset_attempts": req.ResetAttempts,
		})
	})
	if errors.Is(err, jobstore.ErrTooManyItems) {
		serve.WriteError(w, invalid("filter", fmt.Sprintf("matches more than %d jobs; narrow it", jobstore.MaxOperationItems)))
		return
	}
	if err != nil {
		a.writeErr(w, r, err)
		return
	}
	a.log.Info().Str("operation_id", op.ID).Int("total", op.Total).Float64("rate_per_second", op.RatePerSecond).
		Str("by", op.RequestedBy).Msg("bulk retry created")
	a.wake()
	serve.WriteJSON(w, http.StatusAccepted, OperationResponse{Operation: op, Problems: []jobstore.OperationItem{}})
}

func (a *API) operationID(w http.ResponseWriter, r *http.Request) (string, bool) {
	id := r.PathValue("id")
	if err := contract.ValidateID("id", id); err != nil {
		serve.WriteError(w, err)
		return "", false
	}
	return id, true
}

func (a *API) writeOperation(w http.ResponseWriter, r *http.Request, op jobstore.Operation, err error) {
	if errors.Is(err, pgdb.ErrNotFound) {
		serve.WriteError(w, fmt.Errorf("operation %s: %w", op.ID, pgdb.ErrNotFound))
		return
	}
	if err != nil {
		a.writeErr(w, r, err)
		return
	}
	problems, err := jobstore.OperationItems(r.Context(), a.cfg.Pool, op.ID, maxProblems)
	if err != nil {
		a.writeErr(w, r, err)
		return
	}
	serve.WriteJSON(w, http.StatusOK, OperationResponse{Operation: op, Problems: problems})
}

func (a *API) handleGetOperation(w http.ResponseWriter, r *http.Request) {
	id, ok := a.operationID(w, r)
	if !ok {
		return
	}
	op, err := jobstore.GetOperation(r.Context(), a.cfg.Pool, id)
	op.ID = id
	a.writeOperation(w, r, op, err)
}

func (a *API) handleCancelOperation(w http.ResponseWriter, r *http.Request) {
	id, ok := a.operationID(w, r)
	if !ok {
		return
	}
	var op jobstore.Operation
	err := pgx.BeginFunc(r.Context(), a.cfg.Pool, func(tx pgx.Tx) error {
		var err error
		if op, err = jobstore.CancelOperation(r.Context(), tx, id); err != nil {
			return err
		}
		return audit.Record(r.Context(), tx, audit.OperationCancel, "operation/"+id, audit.Detail{"status": op.Status})
	})
	op.ID = id
	a.writeOperation(w, r, op, err)
}

// Start runs the bulk retry runner: it takes the lease of running
// operations (its own after a restart, or those of a runner that died) and
// releases their jobs at each operation's rate. ctx bounds nothing; Stop
// ends the runner.
func (a *API) Start(_ context.Context) error {
	return a.start("jobs api", func(loops context.Context) error {
		a.wg.Add(1)
		go a.scan(loops)
		return nil
	})
}

// Stop ends the runner and waits for the releases in flight; operations
// stay running in the database and resume on the next Start (here or in
// another process once the lease expires). It is idempotent.
func (a *API) Stop(ctx context.Context) error {
	if !a.stop() {
		return nil
	}
	if err := wait.Group(ctx, &a.wg); err != nil {
		return fmt.Errorf("stop jobs api: %w", err)
	}
	return nil
}

func (a *API) wake() {
	select {
	case a.kick <- struct{}{}:
	default:
	}
}

// scan leases runnable operations every ScanInterval (or when kicked) and
// starts a runner goroutine for each one not already running here.
func (a *API) scan(ctx context.Context) {
	defer a.wg.Done()
	t := time.NewTicker(a.cfg.ScanInterval)
	defer t.Stop()
	for {
		ids, err := jobstore.LeaseOperations(ctx, a.cfg.Pool, a.cfg.Runner, a.cfg.LeaseTTL)
		if err != nil && ctx.Err() == nil {
			a.log.Warn().Err(err).Msg("lease bulk retries failed")
		}
		for _, id := range ids {
			a.mu.Lock()
			if !a.running[id] && !a.stopped {
				a.running[id] = true
				a.wg.Add(1)
				go a.run(ctx, id)
			}
			a.mu.Unlock()
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-a.kick:
		}
	}
}

// run releases the pending jobs of one operation, one per tick of its
// rate, renewing the lease as it goes. It returns when the operation is
// done, cancelled, its lease lost, or the runner stops.
func (a *API) run(ctx context.Context, id string) {
	defer a.wg.Done()
	defer func() {
		a.mu.Lock()
		delete(a.running, id)
		a.mu.Unlock()
	}()
	log := a.log.With().Str("operation_id", id).Logger()
	op, err := jobstore.GetOperation(ctx, a.cfg.Pool, id)
	if err != nil {
		log.Warn().Err(err).Msg("read bulk retry failed")
		return
	}
	interval := time.Duration(float64(time.Second) / op.RatePerSecond)
	tick := time.NewTicker(interval)
	defer tick.Stop()
	renewed := time.Now()
	reason := "bulk retry " + id
	if op.Reason != "" {
		reason += ": " + op.Reason
	}
	for {
		if time.Since(renewed) > a.cfg.LeaseTTL/3 {
			held, err := jobstore.RenewLease(ctx, a.cfg.Pool, id, a.cfg.Runner, a.cfg.LeaseTTL)
			if err != nil || !held {
				log.Info().Err(err).Msg("bulk retry lease lost or operation stopped")
				return
			}
			renewed = time.Now()
		}
		more, err := a.releaseOne(ctx, id, reason, op)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			log.Warn().Err(err).Msg("release failed; trying again")
		}
		if !more && err == nil {
			done, err := jobstore.CompleteOperation(ctx, a.cfg.Pool, id)
			if err != nil {
				log.Warn().Err(err).Msg("complete bulk retry failed")
			}
			if done {
				log.Info().Msg("bulk retry completed")
			}
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// releaseOne retries the next pending job of the operation. more is false
// when there was none (or the operation stopped running here). A job the
// scheduler refuses (not found, not in a state to retry, invalid) is
// recorded as skipped or failed; any other error leaves it pending.
func (a *API) releaseOne(ctx context.Context, id, reason string, op jobstore.Operation) (more bool, err error) {
	// Stop does not cut a release short: between the scheduler's retry and
	// the item's commit it would leave the item pending, and the next
	// runner would retry the job a second time.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
	defer cancel()
	state := ""
	err = pgx.BeginFunc(ctx, a.cfg.Pool, func(tx pgx.Tx) error {
		jobID, ok, err := jobstore.NextItem(ctx, tx, id, a.cfg.Runner)
		if err != nil || !ok {
			return err
		}
		more = true
		msg := ""
		state = jobstore.ItemReleased
		switch rerr := a.cfg.Retry.RetryNow(ctx, contract.KindJob, jobID, pgtext.Truncate(reason, contract.MaxMessageLen), op.RequestedBy, op.ResetAttempts, ""); {
		case rerr == nil:
		case errors.Is(rerr, pgdb.ErrNotFound), errors.Is(rerr, pgdb.ErrConflict):
			state, msg = jobstore.ItemSkipped, pgtext.Truncate(rerr.Error(), 512)
		case errors.Is(rerr, contract.ErrInvalid):
			state, msg = jobstore.ItemFailed, pgtext.Truncate(rerr.Error(), 512)
		default:
			return fmt.Errorf("retry job %s: %w", jobID, rerr)
		}
		return jobstore.FinishItem(ctx, tx, id, jobID, state, msg)
	})
	if err == nil && more {
		a.m.bulkItems.WithLabelValues(state).Inc()
	}
	return more, err
}
