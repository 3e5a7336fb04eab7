package contract_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/pkg/contract"
)

func TestNewID(t *testing.T) {
	t.Parallel()
	seen := map[string]bool{}
	for range 1000 {
		id := contract.NewID()
		require.Len(t, id, 26)
		require.NoError(t, contract.ValidateID("id", id))
		require.False(t, seen[id], "duplicate id %s", id)
		seen[id] = true
	}
}

func TestValidators(t *testing.T) {
	t.Parallel()
	type validator func(field, v string) error
	tests := []struct {
		name  string
		fn    validator
		good  []string
		bad   []string
		field string
	}{
		{
			name: "ValidateID", fn: contract.ValidateID, field: "data.id",
			good: []string{"a", "01JABCDEF", "A_b-9", strings.Repeat("x", contract.MaxIDLen)},
			bad:  []string{"", "a.b", "a*", ">", "a b", " a", "a\n", "é", "a:b", "a/b", strings.Repeat("x", contract.MaxIDLen+1)},
		},
		{
			name: "ValidateToken", fn: contract.ValidateToken, field: "data.source",
			good: []string{"a", "shop", "send_email", "a-1", "9x", strings.Repeat("x", contract.MaxTokenLen)},
			bad:  []string{"", "A", "Shop", "_a", "-a", "a.b", "a*", "a b", "a>", strings.Repeat("x", contract.MaxTokenLen+1)},
		},
		{
			name: "ValidateKind", fn: contract.ValidateKind, field: "data.kind",
			good: []string{"event", "event-trigger", "job", strings.Repeat("k", contract.MaxKindLen)},
			bad:  []string{"", "Event", "ev.ent", "*", strings.Repeat("k", contract.MaxKindLen+1)},
		},
		{
			name: "ValidateType", fn: contract.ValidateType, field: "type",
			good: []string{"a", "invoice.paid", "a.b.c", "x_1.y-2", strings.Repeat("t", contract.MaxTypeLen)},
			bad:  []string{"", ".a", "a.", "a..b", "A.b", "a.*", "a.>", "a b", strings.Repeat("t", contract.MaxTypeLen+1)},
		},
	}
	for _, tc := range tests {
		for _, v := range tc.good {
			require.NoError(t, tc.fn(tc.field, v), "%s(%q)", tc.name, v)
		}
		for _, v := range tc.bad {
			requireFieldErr(t, tc.fn(tc.field, v), contract.ErrInvalid, tc.field)
		}
	}
}

func TestValidateAttempt(t *testing.T) {
	t.Parallel()
	for _, n := range []int{1, 2, contract.MaxAttempt} {
		require.NoError(t, contract.ValidateAttempt("data.attempt", n))
	}
	for _, n := range []int{0, -1, contract.MaxAttempt + 1, 1 << 62} {
		requireFieldErr(t, contract.ValidateAttempt("data.attempt", n), contract.ErrInvalid, "data.attempt")
	}
}

func TestMsgIDs(t *testing.T) {
	t.Parallel()
	tests := []struct{ got, want string }{
		{contract.DueMsgID("event", "01J", 3), "event-retry:01J:3"},
		{contract.DueMsgID("event-trigger", "d1", 2), "event-trigger-retry:d1:2"},
		{contract.LifecycleMsgID("event", contract.Due, "01J", 3), "event-retry:01J:3"},
		{contract.LifecycleMsgID("event", contract.Failed, "01J", 1), "event-failed:01J:1"},
		{contract.LifecycleMsgID("job", contract.Scheduled, "j", 2), "job-scheduled:j:2"},
		{contract.LifecycleMsgID("job", contract.Rescheduled, "j", 3), "job-rescheduled:j:3"},
		{contract.LifecycleMsgID("job", contract.Succeeded, "j", 3), "job-succeeded:j:3"},
		{contract.LifecycleMsgID("job", contract.Exhausted, "j", 4), "job-exhausted:j:4"},
		{contract.LifecycleMsgID("job", contract.Cancelled, "j", 0), "job-cancelled:j:0"},
		{contract.JobMsgID("j", 1), "job:j:1"},
		{contract.JobMsgID("j", 0), "job:j:1"},
		{contract.JobMsgID("j", 2), "job-retry:j:2"},
		{contract.RunMsgID(contract.RunRequested, "r1"), "run-requested:r1"},
		{contract.RunMsgID(contract.RunCompleted, "r1"), "run-completed:r1"},
	}
	for _, tc := range tests {
		require.Equal(t, tc.want, tc.got)
	}
}

func TestParseDueMsgID(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		kind, id string
		attempt  int
	}{{"event", "01J", 3}, {"event-trigger", "d_1", 2}, {"job", "j", contract.MaxAttempt}, {"x-retry", "a", 1}} {
		kind, id, attempt, err := contract.ParseDueMsgID(contract.DueMsgID(tc.kind, tc.id, tc.attempt))
		require.NoError(t, err)
		require.Equal(t, tc.kind, kind)
		require.Equal(t, tc.id, id)
		require.Equal(t, tc.attempt, attempt)
	}
	for _, tc := range []struct{ in, field string }{
		{"", "Nats-Msg-Id"},
		{"event-retry:a", "Nats-Msg-Id"},
		{"event-retry:a:1:2", "Nats-Msg-Id"},
		{"event-failed:a:1", "Nats-Msg-Id"},
		{"event:a:1", "Nats-Msg-Id"},
		{"-retry:a:1", "Nats-Msg-Id kind"},
		{"Event-retry:a:1", "Nats-Msg-Id kind"},
		{"ev.ent-retry:a:1", "Nats-Msg-Id kind"},
		{"event-retry::1", "Nats-Msg-Id id"},
		{"event-retry:a.b:1", "Nats-Msg-Id id"},
		{"event-retry:a b:1", "Nats-Msg-Id id"},
		{"event-retry:a:x", "Nats-Msg-Id attempt"},
		{"event-retry:a:", "Nats-Msg-Id attempt"},
		{"event-retry:a:+3", "Nats-Msg-Id attempt"},
		{"event-retry:a:03", "Nats-Msg-Id attempt"},
		{"event-retry:a: 3", "Nats-Msg-Id attempt"},
		{"event-retry:a:0", "Nats-Msg-Id attempt"},
		{"event-retry:a:-1", "Nats-Msg-Id attempt"},
		{"event-retry:a:99999999999999999999", "Nats-Msg-Id attempt"},
		{"event-retry:a:1000001", "Nats-Msg-Id attempt"},
	} {
		_, _, _, err := contract.ParseDueMsgID(tc.in)
		requireFieldErr(t, err, contract.ErrInvalid, tc.field)
	}
}
