package contract_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/pkg/contract"
)

func TestSubjectBuilders(t *testing.T) {
	t.Parallel()
	tests := []struct{ got, want string }{
		{contract.IngestSubject("shop"), "ingest.shop"},
		{contract.EventSubject("shop", "invoice.paid"), "events.shop.invoice.paid"},
		{contract.RetrySubject("event", contract.Failed, "01J"), "retry.event.failed.01J"},
		{contract.RetrySubject("event-trigger", contract.Due, "d1"), "retry.event-trigger.due.d1"},
		{contract.RetryFilter("*", contract.Failed), "retry.*.failed.*"},
		{contract.RetryFilter("job", contract.Due), "retry.job.due.*"},
		{contract.RetryItemFilter("job", "j1"), "retry.job.*.j1"},
		{contract.RunSubject("billing", contract.RunRequested, "r1"), "runs.billing.requested.r1"},
		{contract.JobSubject("email"), "jobs.email"},
	}
	for _, tc := range tests {
		require.Equal(t, tc.want, tc.got)
	}
}

func TestLifecycle(t *testing.T) {
	t.Parallel()
	require.Equal(t, []contract.Lifecycle{"failed", "held", "released", "scheduled", "rescheduled", "due", "succeeded", "exhausted", "cancelled"}, contract.Lifecycles)
	for _, l := range contract.Lifecycles {
		require.True(t, l.Valid(), l)
		require.Equal(t, "retry."+string(l), l.CloudEventType())
	}
	for _, l := range []contract.Lifecycle{"", "Failed", "fail", "due ", "*", ">"} {
		require.False(t, l.Valid(), l)
	}
}

func TestParseRetrySubject(t *testing.T) {
	t.Parallel()
	for _, ev := range contract.Lifecycles {
		for _, kind := range []string{"event", "event-trigger", "job", "my_kind-2"} {
			subj := contract.RetrySubject(kind, ev, "01JABC_d-1")
			p, err := contract.ParseRetrySubject(subj)
			require.NoError(t, err, subj)
			require.Equal(t, contract.RetrySubjectParts{Kind: kind, Event: ev, ID: "01JABC_d-1"}, p)
		}
	}
	bad := []struct{ subject, field string }{
		{"", "subject"},
		{"retry", "subject"},
		{"retry.event.failed", "subject"},
		{"retry.event.failed.a.b", "subject"},
		{"retries.event.failed.a", "subject"},
		{"retry.Event.failed.a", "subject kind"},
		{"retry..failed.a", "subject kind"},
		{"retry.*.failed.a", "subject kind"},
		{"retry.>.failed.a", "subject kind"},
		{"retry.averyveryveryverylongkindthatisover32.failed.a", "subject kind"},
		{"retry.event.broken.a", "subject event"},
		{"retry.event.FAILED.a", "subject event"},
		{"retry.event.failed.", "subject id"},
		{"retry.event.failed.*", "subject id"},
		{"retry.event.failed.>", "subject id"},
		{"retry.event.failed.a b", "subject id"},
		{"retry.event.failed.a\tb", "subject id"},
		{"retry.event.failed.é", "subject id"},
	}
	for _, tc := range bad {
		_, err := contract.ParseRetrySubject(tc.subject)
		requireFieldErr(t, err, contract.ErrInvalid, tc.field)
	}
}

func TestParseEventSubject(t *testing.T) {
	t.Parallel()
	src, typ, err := contract.ParseEventSubject("events.shop.invoice.paid")
	require.NoError(t, err)
	require.Equal(t, "shop", src)
	require.Equal(t, "invoice.paid", typ)
	src, typ, err = contract.ParseEventSubject(contract.EventSubject("a", "b"))
	require.NoError(t, err)
	require.Equal(t, []string{"a", "b"}, []string{src, typ})

	for _, tc := range []struct{ subject, field string }{
		{"events.shop", "subject"},
		{"event.shop.a", "subject"},
		{"events.Shop.a", "subject source"},
		{"events.*.a", "subject source"},
		{"events.shop.", "subject type"},
		{"events.shop.a..b", "subject type"},
		{"events.shop.a.>", "subject type"},
		{"events.shop.A", "subject type"},
	} {
		_, _, err := contract.ParseEventSubject(tc.subject)
		requireFieldErr(t, err, contract.ErrInvalid, tc.field)
	}
}

func TestParseIngestSubject(t *testing.T) {
	t.Parallel()
	src, err := contract.ParseIngestSubject("ingest.shop-1")
	require.NoError(t, err)
	require.Equal(t, "shop-1", src)
	for _, tc := range []struct{ subject, field string }{
		{"ingest", "subject"},
		{"ingest.a.b", "subject"},
		{"events.a", "subject"},
		{"ingest.*", "subject source"},
		{"ingest.A", "subject source"},
		{"ingest.", "subject source"},
	} {
		_, err := contract.ParseIngestSubject(tc.subject)
		requireFieldErr(t, err, contract.ErrInvalid, tc.field)
	}
}

func TestParseRunSubject(t *testing.T) {
	t.Parallel()
	for _, ev := range []string{contract.RunRequested, contract.RunCompleted, contract.RunFailed, contract.RunHeartbeat} {
		p, err := contract.ParseRunSubject(contract.RunSubject("billing", ev, "r-1"))
		require.NoError(t, err)
		require.Equal(t, contract.RunSubjectParts{Workflow: "billing", Event: ev, RunID: "r-1"}, p)
	}
	for _, tc := range []struct{ subject, field string }{
		{"runs.billing.requested", "subject"},
		{"run.billing.requested.r", "subject"},
		{"runs.billing.requested.r.x", "subject"},
		{"runs.Billing.requested.r", "subject workflow"},
		{"runs.billing.started.r", "subject event"},
		{"runs.billing.requested.*", "subject run_id"},
		{"runs.billing.requested.", "subject run_id"},
	} {
		_, err := contract.ParseRunSubject(tc.subject)
		requireFieldErr(t, err, contract.ErrInvalid, tc.field)
	}
}

func TestParseJobSubject(t *testing.T) {
	t.Parallel()
	jt, err := contract.ParseJobSubject("jobs.send_email")
	require.NoError(t, err)
	require.Equal(t, "send_email", jt)
	for _, tc := range []struct{ subject, field string }{
		{"jobs", "subject"},
		{"jobs.a.b", "subject"},
		{"job.a", "subject"},
		{"jobs.*", "subject job_type"},
		{"jobs.Email", "subject job_type"},
	} {
		_, err := contract.ParseJobSubject(tc.subject)
		requireFieldErr(t, err, contract.ErrInvalid, tc.field)
	}
}
