package contract_test

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/pkg/contract"
)

func TestJobSubjectForBands(t *testing.T) {
	t.Parallel()
	require.Equal(t, "jobs.email", contract.JobSubjectFor("email", ""))
	require.Equal(t, "jobs.email", contract.JobSubjectFor("email", contract.PriorityNormal))
	require.Equal(t, "jobs.email.high", contract.JobSubjectFor("email", contract.PriorityHigh))
	require.Equal(t, "jobs.email.low", contract.JobSubjectFor("email", contract.PriorityLow))
	require.Equal(t, []string{"jobs.email.high", "jobs.email", "jobs.email.low"}, contract.JobFilters("email"))

	for subject, want := range map[string]contract.Priority{
		"jobs.email": contract.PriorityNormal, "jobs.email.high": contract.PriorityHigh, "jobs.email.low": contract.PriorityLow,
	} {
		jt, band, err := contract.ParseJobSubjectBand(subject)
		require.NoError(t, err, subject)
		require.Equal(t, "email", jt)
		require.Equal(t, want, band, subject)
	}
	for _, subject := range []string{"jobs.email.normal", "jobs.email.urgent", "jobs.email.HIGH", "jobs.email.high.x"} {
		_, _, err := contract.ParseJobSubjectBand(subject)
		requireFieldErr(t, err, contract.ErrInvalid, "subject")
	}
}

func TestJobPriorityRoundTrip(t *testing.T) {
	t.Parallel()
	for _, p := range []contract.Priority{"", contract.PriorityHigh, contract.PriorityNormal, contract.PriorityLow} {
		msg, err := contract.NewJobMsg("w", contract.JobData{ID: "j1", JobType: "email", Attempt: 1, Priority: p}, now)
		require.NoError(t, err)
		require.Equal(t, contract.JobSubjectFor("email", p), msg.Subject)
		_, got, err := contract.DecodeJob(msg.Subject, msg.Data)
		require.NoError(t, err)
		require.Equal(t, p, got.Priority)
		require.Equal(t, p.Band(), got.Priority.Band())
	}
}

// A job without a priority on jobs.<job_type> is what every publisher
// sent before priorities: it still decodes, as a normal job.
func TestJobWithoutPriorityIsNormal(t *testing.T) {
	t.Parallel()
	body := []byte(`{"specversion":"1.0","id":"x","source":"s","type":"job.requested","time":"2024-01-01T00:00:00Z","data":{"id":"a","job_type":"email","attempt":1}}`)
	_, d, err := contract.DecodeJob("jobs.email", body)
	require.NoError(t, err)
	require.Equal(t, contract.Priority(""), d.Priority)
	require.Equal(t, contract.PriorityNormal, d.Priority.Band())
}

func TestJobPriorityRefused(t *testing.T) {
	t.Parallel()
	envelope := func(data string) []byte {
		return []byte(`{"specversion":"1.0","id":"x","source":"s","type":"job.requested","time":"2024-01-01T00:00:00Z","data":` + data + `}`)
	}
	for _, tc := range []struct{ name, subject, data, field string }{
		{"unknown band", "jobs.email", `{"id":"a","job_type":"email","attempt":1,"priority":"urgent"}`, "data.priority"},
		{"other case", "jobs.email", `{"id":"a","job_type":"email","attempt":1,"priority":"High"}`, "data.priority"},
		{"seed number", "jobs.email", `{"id":"a","job_type":"email","attempt":1,"priority":5}`, `"priority" must be a string: high, normal or low, got number`},
		{"high on normal subject", "jobs.email", `{"id":"a","job_type":"email","attempt":1,"priority":"high"}`, "data.priority"},
		{"none on high subject", "jobs.email.high", `{"id":"a","job_type":"email","attempt":1}`, "data.priority"},
		{"low on high subject", "jobs.email.high", `{"id":"a","job_type":"email","attempt":1,"priority":"low"}`, "data.priority"},
		{"normal band token", "jobs.email.normal", `{"id":"a","job_type":"email","attempt":1,"priority":"normal"}`, "subject band"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, _, err := contract.DecodeJob(tc.subject, envelope(tc.data))
			requireFieldErr(t, err, contract.ErrInvalid, tc.field)
		})
	}
	_, err := contract.NewJobMsg("w", contract.JobData{ID: "a", JobType: "email", Attempt: 1, Priority: "urgent"}, now)
	requireFieldErr(t, err, contract.ErrInvalid, "data.priority")
}

// A job's failure, hold and due carry its priority, so a retry runs in
// its band; an unknown band is refused on each of them.
func TestLifecyclePriority(t *testing.T) {
	t.Parallel()
	fd := contract.FailedData{Kind: contract.KindJob, ID: "j1", Attempt: 1, Error: contract.ErrorInfo{Class: "network", Message: "x"}, JobType: "email", Priority: contract.PriorityHigh}
	msg, err := contract.NewLifecycleMsg("w", contract.Failed, fd, now)
	require.NoError(t, err)
	ev, err := contract.DecodeLifecycle(msg.Subject, msg.Data)
	require.NoError(t, err)
	require.Equal(t, contract.PriorityHigh, ev.Failed.Priority)

	dd := contract.DueData{Kind: contract.KindJob, ID: "j1", Attempt: 2, NextAttemptAt: now, JobType: "email", Priority: contract.PriorityLow}
	msg, err = contract.NewLifecycleMsg("s", contract.Due, dd, now)
	require.NoError(t, err)
	ev, err = contract.DecodeLifecycle(msg.Subject, msg.Data)
	require.NoError(t, err)
	require.Equal(t, contract.PriorityLow, ev.Due.Priority)

	hd := contract.HeldData{Kind: contract.KindJob, ID: "j1", Attempt: 1, Reason: contract.HoldThrottle, JobType: "email", Priority: contract.PriorityHigh}
	msg, err = contract.NewLifecycleMsg("w", contract.Held, hd, now)
	require.NoError(t, err)
	ev, err = contract.DecodeLifecycle(msg.Subject, msg.Data)
	require.NoError(t, err)
	require.Equal(t, contract.PriorityHigh, ev.Held.Priority)

	fd.Priority = "5"
	_, err = contract.NewLifecycleMsg("w", contract.Failed, fd, now)
	requireFieldErr(t, err, contract.ErrInvalid, "data.priority")
	dd.Priority = "urgent"
	_, err = contract.NewLifecycleMsg("s", contract.Due, dd, now)
	requireFieldErr(t, err, contract.ErrInvalid, "data.priority")
	hd.Priority = "LOW"
	_, err = contract.NewLifecycleMsg("w", contract.Held, hd, now)
	requireFieldErr(t, err, contract.ErrInvalid, "data.priority")

	raw, err := json.Marshal(contract.DueData{Kind: contract.KindJob, ID: "j1", Attempt: 2, NextAttemptAt: now})
	require.NoError(t, err)
	require.NotContains(t, string(raw), "priority", "a due without a priority leaves the field out")
}

func TestParsePriority(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]contract.Priority{"": contract.PriorityNormal, "HIGH": contract.PriorityHigh, " low ": contract.PriorityLow, "Normal": contract.PriorityNormal} {
		got, err := contract.ParsePriority("priority", in)
		require.NoError(t, err, in)
		require.Equal(t, want, got, in)
	}
	for _, in := range []string{"5", "urgent", "highest"} {
		_, err := contract.ParsePriority("priority", in)
		requireFieldErr(t, err, contract.ErrInvalid, "priority")
	}
}
