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
		{contract.RetryFilter("*", contract.Failed), "retry.*.failed.>"},
		{contract.RetryFilter("job", contract.Due), "retry.job.due.>"},
		{contract.RetryUnsplitFilter("*", contract.Failed), "retry.*.failed.*"},
		{contract.RetryShardFilter(contract.Failed, 3), "retry.*.failed.*.3"},
		{contract.RetryItemFilter("job", "j1"), "retry.job.*.j1"},
		{contract.RetryItemShardFilter("job", "j1"), "retry.job.*.j1.*"},
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
}

func TestParseIngestAndJobSubjects(t *testing.T) {
	t.Parallel()
	src, err := contract.ParseIngestSubject("ingest.shop-1")
	require.NoError(t, err)
	require.Equal(t, "shop-1", src)
	jt, err := contract.ParseJobSubject("jobs.send_email")
	require.NoError(t, err)
	require.Equal(t, "send_email", jt)
}

func TestParseRunSubject(t *testing.T) {
	t.Parallel()
	for _, ev := range []string{contract.RunRequested, contract.RunCompleted, contract.RunFailed, contract.RunHeartbeat} {
		p, err := contract.ParseRunSubject(contract.RunSubject("billing", ev, "r-1"))
		require.NoError(t, err)
		require.Equal(t, contract.RunSubjectParts{Workflow: "billing", Event: ev, RunID: "r-1"}, p)
	}
}

// Each parser refuses a subject not of its form as invalid, naming in the
// error's field the part at fault.
func TestParseSubjectRefusals(t *testing.T) {
	t.Parallel()
	retry := func(s string) error { _, err := contract.ParseRetrySubject(s); return err }
	event := func(s string) error { _, _, err := contract.ParseEventSubject(s); return err }
	ingest := func(s string) error { _, err := contract.ParseIngestSubject(s); return err }
	run := func(s string) error { _, err := contract.ParseRunSubject(s); return err }
	job := func(s string) error { _, err := contract.ParseJobSubject(s); return err }
	for _, tc := range []struct {
		parse          func(string) error
		subject, field string
	}{
		{retry, "", "subject"},
		{retry, "retry", "subject"},
		{retry, "retry.event.failed", "subject"},
		{retry, "retry.event.failed.a.b", "subject"},
		{retry, "retries.event.failed.a", "subject"},
		{retry, "retry.Event.failed.a", "subject kind"},
		{retry, "retry..failed.a", "subject kind"},
		{retry, "retry.*.failed.a", "subject kind"},
		{retry, "retry.>.failed.a", "subject kind"},
		{retry, "retry.averyveryveryverylongkindthatisover32.failed.a", "subject kind"},
		{retry, "retry.event.broken.a", "subject event"},
		{retry, "retry.event.FAILED.a", "subject event"},
		{retry, "retry.event.failed.", "subject id"},
		{retry, "retry.event.failed.*", "subject id"},
		{retry, "retry.event.failed.>", "subject id"},
		{retry, "retry.event.failed.a b", "subject id"},
		{retry, "retry.event.failed.a\tb", "subject id"},
		{retry, "retry.event.failed.é", "subject id"},

		{event, "events.shop", "subject"},
		{event, "event.shop.a", "subject"},
		{event, "events.Shop.a", "subject source"},
		{event, "events.*.a", "subject source"},
		{event, "events.shop.", "subject type"},
		{event, "events.shop.a..b", "subject type"},
		{event, "events.shop.a.>", "subject type"},
		{event, "events.shop.A", "subject type"},

		{ingest, "ingest", "subject"},
		{ingest, "ingest.a.b", "subject"},
		{ingest, "events.a", "subject"},
		{ingest, "ingest.*", "subject source"},
		{ingest, "ingest.A", "subject source"},
		{ingest, "ingest.", "subject source"},

		{run, "runs.billing.requested", "subject"},
		{run, "run.billing.requested.r", "subject"},
		{run, "runs.billing.requested.r.x", "subject"},
		{run, "runs.Billing.requested.r", "subject workflow"},
		{run, "runs.billing.started.r", "subject event"},
		{run, "runs.billing.requested.*", "subject run_id"},
		{run, "runs.billing.requested.", "subject run_id"},

		{job, "jobs", "subject"},
		{job, "jobs.a.b", "subject"},
		{job, "job.a", "subject"},
		{job, "jobs.*", "subject job_type"},
		{job, "jobs.Email", "subject job_type"},
	} {
		requireFieldErr(t, tc.parse(tc.subject), contract.ErrInvalid, tc.field)
	}
}
