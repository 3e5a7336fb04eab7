package retrystore_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/migrations/pgtest"
	"github.com/retryd/retryd/pkg/backoff"
	"github.com/retryd/retryd/pkg/errclass"
	"github.com/retryd/retryd/pkg/policy"
	"github.com/retryd/retryd/stores/pgdb"
	"github.com/retryd/retryd/stores/retrystore"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func setup(t *testing.T) (context.Context, *pgxpool.Pool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx, pgtest.NewPool(t)
}

func scheduledRow(kind, id string, next time.Time) retrystore.Retry {
	return retrystore.Retry{
		Kind: kind, ItemID: id, State: retrystore.StateScheduled, Attempt: 2, RetryCount: 1,
		MaxRetries: 3, RetryEnabled: true, PolicyName: "default", PolicyVersion: 1,
		NextAttemptAt: &next,
	}
}

func TestSaveGetRoundTrip(t *testing.T) {
	t.Parallel()
	ctx, pool := setup(t)

	next := time.Now().Add(time.Hour).Truncate(time.Microsecond)
	r := scheduledRow("job", "j1", next)
	r.Payload = json.RawMessage(`{"b": 1, "a": [2]}`)
	r.Metadata = map[string]string{"tenant": "t1"}
	over := 7
	r.MaxRetriesOverride = &over
	saved, err := retrystore.Save(ctx, pool, r)
	require.NoError(t, err)
	require.False(t, saved.CreatedAt.IsZero())

	got, err := retrystore.Get(ctx, pool, "job", "j1")
	require.NoError(t, err)
	require.Equal(t, `{"b": 1, "a": [2]}`, string(got.Payload), "json column keeps the payload byte for byte")
	require.Nil(t, got.Checkpoint)
	require.Equal(t, map[string]string{"tenant": "t1"}, got.Metadata)
	require.Equal(t, 7, *got.MaxRetriesOverride)
	require.True(t, next.Equal(*got.NextAttemptAt))

	got.State = retrystore.StateExhausted
	got.Payload = nil
	_, err = retrystore.Save(ctx, pool, got)
	require.NoError(t, err)
	again, err := retrystore.Get(ctx, pool, "job", "j1")
	require.NoError(t, err)
	require.Equal(t, retrystore.StateExhausted, again.State)
	require.Nil(t, again.Payload)
	require.True(t, saved.CreatedAt.Equal(again.CreatedAt), "created_at is kept on update")

	_, err = retrystore.Get(ctx, pool, "job", "nope")
	require.ErrorIs(t, err, pgdb.ErrNotFound)

	bad := r
	bad.State = "waiting"
	_, err = retrystore.Save(ctx, pool, bad)
	require.Error(t, err)
}

// SaveMany reads back only the timestamps Postgres sets; every other
// field of the stored row is the one given, the last save of a row that
// appears twice included.
func TestSaveManyStoresRowsAsGiven(t *testing.T) {
	t.Parallel()
	ctx, pool := setup(t)

	next := time.Now().Add(time.Hour).Truncate(time.Microsecond)
	a := scheduledRow("job", "a", next)
	a.Payload = json.RawMessage(`{"b": 1}`)
	a.Metadata = map[string]string{"tenant": "t1"}
	b := scheduledRow("event", "b", next)
	b2 := b
	b2.State = retrystore.StateSucceeded
	b2.Attempt = 2
	rows := []*retrystore.Retry{&a, &b, &b2}
	require.NoError(t, retrystore.SaveMany(ctx, pool, rows))
	for _, r := range rows {
		require.False(t, r.CreatedAt.IsZero(), "%s/%s created_at", r.Kind, r.ItemID)
		require.False(t, r.UpdatedAt.IsZero(), "%s/%s updated_at", r.Kind, r.ItemID)
	}
	for _, want := range []retrystore.Retry{a, b2} {
		got, err := retrystore.Get(ctx, pool, want.Kind, want.ItemID)
		require.NoError(t, err)
		require.Equal(t, want, got)
	}
}

func TestHistoryKeepsOrder(t *testing.T) {
	t.Parallel()
	ctx, pool := setup(t)

	delay := int64(1500)
	at := time.Date(2030, 1, 2, 3, 4, 5, 6000, time.UTC)
	require.NoError(t, retrystore.InsertHistory(ctx, pool,
		retrystore.HistoryEntry{Kind: "event", ItemID: "e1", Attempt: 1, Event: "failed", ErrorClass: "timeout", At: at},
		retrystore.HistoryEntry{Kind: "event", ItemID: "e1", Attempt: 2, Event: "scheduled", DelayMS: &delay,
			DecidedBy: "backoff", Detail: json.RawMessage(`{"policy":"p"}`)},
		retrystore.HistoryEntry{Kind: "event", ItemID: "other", Attempt: 1, Event: "failed"},
	))
	h, err := retrystore.History(ctx, pool, "event", "e1")
	require.NoError(t, err)
	require.Len(t, h, 2)
	require.Equal(t, "failed", h[0].Event)
	require.True(t, at.Equal(h[0].At), "an explicit time is kept")
	require.Equal(t, "scheduled", h[1].Event)
	require.Equal(t, int64(1500), *h[1].DelayMS)
	require.JSONEq(t, `{"policy":"p"}`, string(h[1].Detail))
	require.Nil(t, h[0].Detail)
	require.Less(t, h[0].ID, h[1].ID)
	require.WithinDuration(t, time.Now(), h[1].At, time.Minute, "a zero time means now()")
}

func TestDueClaim(t *testing.T) {
	t.Parallel()
	ctx, pool := setup(t)

	past := time.Now().Add(-time.Minute)
	for _, r := range []retrystore.Retry{
		scheduledRow("event", "late2", past.Add(time.Second)),
		scheduledRow("event", "late1", past),
		scheduledRow("event", "late3", past.Add(2*time.Second)),
		scheduledRow("event", "future", time.Now().Add(time.Hour)),
	} {
		_, err := retrystore.Save(ctx, pool, r)
		require.NoError(t, err)
	}

	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx)
	rows, err := retrystore.ClaimDue(ctx, tx, 10, retrystore.Range{})
	require.NoError(t, err)
	require.Len(t, rows, 3)
	require.Equal(t, []string{"late1", "late2", "late3"}, []string{rows[0].ItemID, rows[1].ItemID, rows[2].ItemID}, "earliest first")
	require.Greater(t, rows[0].Lateness, 50*time.Second)
	require.Equal(t, retrystore.StateDue, rows[0].State, "claimed rows come back as they are now")
	require.Equal(t, 1, rows[0].DueEmissions)
	require.NotNil(t, rows[0].DueAt)
	require.Equal(t, retrystore.StateScheduled, rows[0].PrevState)
	require.Nil(t, rows[0].PrevDueAt)

	// A second transaction skips the locked rows instead of waiting.
	tx2, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer tx2.Rollback(ctx)
	other, err := retrystore.ClaimDue(ctx, tx2, 10, retrystore.Range{})
	require.NoError(t, err)
	require.Empty(t, other)
	require.NoError(t, tx2.Rollback(ctx))

	// late3's event was not published: releasing it puts it back.
	require.NoError(t, retrystore.ReleaseDue(ctx, tx, rows[2:]))
	require.NoError(t, tx.Commit(ctx))

	got, err := retrystore.Get(ctx, pool, "event", "late1")
	require.NoError(t, err)
	require.Equal(t, retrystore.StateDue, got.State)
	require.Equal(t, 1, got.DueEmissions)
	require.NotNil(t, got.DueAt)
	released, err := retrystore.Get(ctx, pool, "event", "late3")
	require.NoError(t, err)
	require.Equal(t, retrystore.StateScheduled, released.State)
	require.Equal(t, 0, released.DueEmissions)
	require.Nil(t, released.DueAt)

	next, ok, dbNow, err := retrystore.NextDue(ctx, pool)
	require.NoError(t, err)
	require.True(t, ok)
	require.Less(t, next.Sub(dbNow), time.Duration(0), "late3 is due again")

	// Nothing is old enough to be re-emitted yet; moving due_at back is
	// what the passing of RedueAfter looks like.
	redue, err := retrystore.ClaimRedue(ctx, pool, 5*time.Minute, 10)
	require.NoError(t, err)
	require.Empty(t, redue)
	_, err = pool.Exec(ctx, `UPDATE retries SET due_at = due_at - interval '6 minutes' WHERE item_id = 'late1'`)
	require.NoError(t, err)
	in, ok, err := retrystore.NextRedue(ctx, pool, 5*time.Minute)
	require.NoError(t, err)
	require.True(t, ok)
	require.Less(t, in, time.Duration(0))

	tx3, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer tx3.Rollback(ctx)
	redue, err = retrystore.ClaimRedue(ctx, tx3, 5*time.Minute, 10)
	require.NoError(t, err)
	require.Len(t, redue, 1)
	require.Equal(t, "late1", redue[0].ItemID)
	require.Equal(t, 2, redue[0].DueEmissions)
	require.Equal(t, retrystore.StateDue, redue[0].PrevState)
	require.NotNil(t, redue[0].PrevDueAt)
	require.NoError(t, retrystore.ReleaseDue(ctx, tx3, redue))
	require.NoError(t, tx3.Commit(ctx))
	got, err = retrystore.Get(ctx, pool, "event", "late1")
	require.NoError(t, err)
	require.Equal(t, 1, got.DueEmissions, "a released re-emission does not count")
	require.True(t, got.DueAt.Equal(*redue[0].PrevDueAt), "and keeps its old due_at, so it stays eligible")

	// Releasing a row that is not due is a bug in the caller.
	err = retrystore.ReleaseDue(ctx, pool, []retrystore.DueRow{{Retry: retrystore.Retry{Kind: "event", ItemID: "missing"}}})
	require.Error(t, err)
}

func TestDueClaimFrom(t *testing.T) {
	t.Parallel()
	ctx, pool := setup(t)

	past := time.Now().Add(-time.Minute)
	for i, id := range []string{"a", "b", "c"} {
		_, err := retrystore.Save(ctx, pool, scheduledRow("event", id, past.Add(time.Duration(i)*time.Second)))
		require.NoError(t, err)
	}
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx)
	rows, err := retrystore.ClaimDue(ctx, tx, 10, retrystore.Range{From: past.Add(time.Second)})
	require.NoError(t, err)
	require.Len(t, rows, 2, "a is before the floor")
	require.Equal(t, "b", rows[0].ItemID)
	require.Equal(t, "c", rows[1].ItemID)
	require.NoError(t, tx.Commit(ctx))

	// Without a lower bound the row left behind is found.
	rows, err = retrystore.ClaimDue(ctx, pool, 10, retrystore.Range{})
	require.NoError(t, err)
	require.Len(t, rows, 1)
	require.Equal(t, "a", rows[0].ItemID)
}

func TestDueBound(t *testing.T) {
	t.Parallel()
	ctx, pool := setup(t)

	past := time.Now().Add(-time.Minute).Truncate(time.Millisecond)
	at := func(i int) time.Time { return past.Add(time.Duration(i) * time.Second) }
	for i, id := range []string{"a", "b", "c", "d"} {
		_, err := retrystore.Save(ctx, pool, scheduledRow("event", id, at(i)))
		require.NoError(t, err)
	}
	_, err := retrystore.Save(ctx, pool, scheduledRow("event", "later", time.Now().Add(time.Hour)))
	require.NoError(t, err)

	bound, ok, err := retrystore.DueBound(ctx, pool, time.Time{}, 2)
	require.NoError(t, err)
	require.True(t, ok)
	require.True(t, bound.Equal(at(2)), "[start, c) holds a and b")
	bound, ok, err = retrystore.DueBound(ctx, pool, at(1), 2)
	require.NoError(t, err)
	require.True(t, ok)
	require.True(t, bound.Equal(at(3)), "[b, d) holds b and c")
	_, ok, err = retrystore.DueBound(ctx, pool, at(2), 2)
	require.NoError(t, err)
	require.False(t, ok, "only c and d are due from c on; later is not due")

	rows, err := retrystore.ClaimDue(ctx, pool, 10, retrystore.Range{From: at(1), Until: at(3)})
	require.NoError(t, err)
	require.Len(t, rows, 2)
	require.Equal(t, "b", rows[0].ItemID)
	require.Equal(t, "c", rows[1].ItemID)
}

func TestListPagination(t *testing.T) {
	t.Parallel()
	ctx, pool := setup(t)

	for i, id := range []string{"a", "b", "c", "d", "e"} {
		r := scheduledRow("job", id, time.Now())
		if i%2 == 0 {
			r.State = retrystore.StateExhausted
		}
		r.Source = "crm"
		_, err := retrystore.Save(ctx, pool, r)
		require.NoError(t, err)
	}
	_, err := retrystore.Save(ctx, pool, scheduledRow("event", "z", time.Now()))
	require.NoError(t, err)

	var ids []string
	cursor := ""
	for pages := 0; ; pages++ {
		require.Less(t, pages, 5)
		page, err := retrystore.List(ctx, pool, retrystore.ListFilter{Kind: "job", Limit: 2, Cursor: cursor})
		require.NoError(t, err)
		for _, r := range page.Retries {
			ids = append(ids, r.ItemID)
		}
		if page.NextCursor == "" {
			break
		}
		cursor = page.NextCursor
	}
	require.Equal(t, []string{"a", "b", "c", "d", "e"}, ids)

	page, err := retrystore.List(ctx, pool, retrystore.ListFilter{State: retrystore.StateExhausted, Source: "crm"})
	require.NoError(t, err)
	require.Len(t, page.Retries, 3)
	require.Empty(t, page.NextCursor)

	_, err = retrystore.List(ctx, pool, retrystore.ListFilter{Cursor: "!!"})
	require.ErrorIs(t, err, pgdb.ErrBadCursor)
	_, err = retrystore.List(ctx, pool, retrystore.ListFilter{Limit: retrystore.MaxListLimit + 1})
	require.Error(t, err)

	counts, err := retrystore.Pending(ctx, pool)
	require.NoError(t, err)
	require.Equal(t, []retrystore.PendingCount{
		{Kind: "event", State: retrystore.StateScheduled, Count: 1},
		{Kind: "job", State: retrystore.StateScheduled, Count: 2},
	}, counts)
}

func TestPolicies(t *testing.T) {
	t.Parallel()
	ctx, pool := setup(t)

	// Fallback order: exact job type, kind default, "*".
	p, err := retrystore.LookupPolicy(ctx, pool, "job", "email_campaign")
	require.NoError(t, err)
	require.Equal(t, "email-campaign", p.Name)
	p, err = retrystore.LookupPolicy(ctx, pool, "job", "unknown_type")
	require.NoError(t, err)
	require.Equal(t, "job-default", p.Name)
	p, err = retrystore.LookupPolicy(ctx, pool, "webhook", "")
	require.NoError(t, err)
	require.Equal(t, "default", p.Name)
	require.Equal(t, []errclass.Class{errclass.Authentication, errclass.Permission, errclass.Validation}, p.NonRetryableClasses)

	_, err = retrystore.GetPolicy(ctx, pool, "webhook", "")
	require.ErrorIs(t, err, pgdb.ErrNotFound)

	created, err := retrystore.PutPolicy(ctx, pool, policy.Policy{
		Kind: "webhook", Name: "webhooks", MaxRetries: 2, Enabled: true,
		Backoff: backoff.Config{Base: 100 * time.Millisecond, Multiplier: 3, Max: time.Second, Jitter: backoff.JitterNone},
	}, "alice")
	require.NoError(t, err)
	require.Equal(t, 1, created.Version)
	require.Empty(t, created.RetryableClasses)
	require.Equal(t, policy.DefaultMaxHold, created.MaxHold, "0 stores the default")
	require.Equal(t, 100*time.Millisecond, created.Backoff.Base)

	upd := created
	upd.MaxRetries = 4
	updated, err := retrystore.PutPolicy(ctx, pool, upd, "bob")
	require.NoError(t, err)
	require.Equal(t, 2, updated.Version)
	require.Equal(t, "bob", updated.UpdatedBy)

	upd.Version = 1 // stale read
	_, err = retrystore.PutPolicy(ctx, pool, upd, "carol")
	require.ErrorIs(t, err, retrystore.ErrVersionConflict)

	versions, err := retrystore.PolicyVersions(ctx, pool, "webhook", "")
	require.NoError(t, err)
	require.Len(t, versions, 2)
	require.Equal(t, 2, versions[0].Version)
	require.Equal(t, "bob", versions[0].ChangedBy)
	var snap map[string]any
	require.NoError(t, json.Unmarshal(versions[0].Policy, &snap))
	require.EqualValues(t, 4, snap["max_retries"])
	require.EqualValues(t, 2, snap["version"])

	p, err = retrystore.LookupPolicy(ctx, pool, "webhook", "anything")
	require.NoError(t, err)
	require.Equal(t, "webhooks", p.Name)

	all, err := retrystore.ListPolicies(ctx, pool)
	require.NoError(t, err)
	require.Len(t, all, len(policy.Defaults())+1, "the seeded policies and webhook")
}

// A policy read back is the policy written, every field of it: the
// columns and policy.Policy map one to one.
func TestPolicyRoundTrip(t *testing.T) {
	t.Parallel()
	ctx, pool := setup(t)
	first, limit := time.Duration(0), time.Minute
	jitter := backoff.JitterNone
	want := policy.Policy{
		Kind: "roundtrip", JobType: "every_field", Name: "round-trip", MaxRetries: 7, Enabled: false,
		Backoff: backoff.Config{Base: 250 * time.Millisecond, Max: 90 * time.Second, Multiplier: 1.5,
			Jitter: backoff.JitterEqual, JitterMax: 40 * time.Millisecond},
		RetryableClasses:    []errclass.Class{errclass.Permission},
		NonRetryableClasses: []errclass.Class{errclass.Validation, errclass.Authentication},
		MaxHold:             36 * time.Hour, MaxRetryAfter: 3 * time.Hour,
		ClassBackoff: map[errclass.Class]policy.ClassBackoff{
			errclass.Timeout:   {FirstDelay: &first},
			errclass.RateLimit: {Max: &limit, Jitter: &jitter},
		},
	}
	saved, err := retrystore.PutPolicy(ctx, pool, want, "dora")
	require.NoError(t, err)
	got, err := retrystore.GetPolicy(ctx, pool, "roundtrip", "every_field")
	require.NoError(t, err)
	require.Equal(t, saved, got)
	require.Equal(t, "dora", got.UpdatedBy)
	require.False(t, got.CreatedAt.IsZero())
	want.Version, want.UpdatedBy, want.CreatedAt, want.UpdatedAt = 1, got.UpdatedBy, got.CreatedAt, got.UpdatedAt
	require.Equal(t, want, got)
}

// A release counts for the holds of its reason, and a release of every
// reason ("") for all of them: a freed concurrency slot does not release a
// throttle hold of the same key.
func TestReleasedAfterIsPerHoldReason(t *testing.T) {
	t.Parallel()
	ctx, pool := setup(t)
	heldAt := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
	released := func(reason string) bool {
		t.Helper()
		ok, err := retrystore.ReleasedAfter(ctx, pool, "event_trigger", "trg", reason, heldAt)
		require.NoError(t, err)
		return ok
	}
	require.NoError(t, retrystore.RecordRelease(ctx, pool, "event_trigger", "trg", "concurrency", heldAt.Add(time.Second)))
	require.True(t, released("concurrency"))
	require.False(t, released("throttle"), "a freed slot is not a throttle release")

	// An older release of every reason changes nothing; a later one
	// releases every reason.
	require.NoError(t, retrystore.RecordRelease(ctx, pool, "event_trigger", "trg", "", heldAt.Add(-time.Second)))
	require.False(t, released("throttle"))
	require.NoError(t, retrystore.RecordRelease(ctx, pool, "event_trigger", "trg", "", heldAt))
	require.True(t, released("throttle"))
	require.True(t, released("pause"))
}

// A row another transaction locks, with or without the item's advisory
// lock, is reported busy at once; the free rows are locked; a key without
// a row is in neither.
func TestTryGetManyForUpdateSkipsHeldRows(t *testing.T) {
	t.Parallel()
	ctx, pool := setup(t)
	now := time.Now()
	for _, id := range []string{"free", "held"} {
		_, err := retrystore.Save(ctx, pool, scheduledRow("try", id, now))
		require.NoError(t, err)
	}
	peer, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer peer.Rollback(ctx) //nolint:errcheck // read-only
	_, err = peer.Exec(ctx, `SELECT 1 FROM retries WHERE kind = 'try' AND item_id = 'held' FOR UPDATE`)
	require.NoError(t, err)

	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck // read-only
	_, err = tx.Exec(ctx, `SET LOCAL lock_timeout = '1min'`)
	require.NoError(t, err)
	keys := []retrystore.Key{{Kind: "try", ItemID: "free"}, {Kind: "try", ItemID: "held"}, {Kind: "try", ItemID: "new"}}
	rows, busy, err := retrystore.TryGetManyForUpdate(ctx, tx, keys)
	require.NoError(t, err)
	require.Equal(t, map[retrystore.Key]bool{{Kind: "try", ItemID: "held"}: true}, busy)
	require.Len(t, rows, 1)
	require.Equal(t, retrystore.StateScheduled, rows[retrystore.Key{Kind: "try", ItemID: "free"}].State)

	// The free row is locked by tx now: the peer cannot take it.
	_, err = peer.Exec(ctx, `SET LOCAL lock_timeout = '50ms'`)
	require.NoError(t, err)
	_, err = peer.Exec(ctx, `SELECT 1 FROM retries WHERE kind = 'try' AND item_id = 'free' FOR UPDATE`)
	require.ErrorContains(t, err, "55P03")
}
