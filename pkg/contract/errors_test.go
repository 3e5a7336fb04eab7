package contract_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/pkg/contract"
)

// A log reason names the field and the rule broken, never a value from
// the input.
func TestLogReasonNamesTheFieldNeverTheValue(t *testing.T) {
	t.Parallel()
	envelope := func(data string) []byte {
		return []byte(`{"specversion":"1.0","id":"event-failed:e1:1","source":"worker","type":"retry.failed",` +
			`"time":"2025-03-14T15:09:26Z","data":` + data + `}`)
	}
	cases := []struct {
		name, subject, data string
		want                string
		secret              string
	}{
		{"wrong type", "retry.event.failed.e1", `{"kind":"event","id":"e1","attempt":"s3cr3t"}`,
			`field "attempt" must be an integer, got string`, "s3cr3t"},
		{"a number where an integer goes", "retry.event.failed.e1", `{"kind":"event","id":"e1","attempt":1.2345}`,
			`field "attempt" must be an integer, got number`, "1.2345"},
		{"kind and id differ from the subject", "retry.event.failed.e1", `{"kind":"event","id":"pa55word","attempt":1}`,
			`does not match subject`, "pa55word"},
		{"an unknown field's name comes from the input", "retry.event.failed.e1", `{"kind":"event","id":"e1","attempt":1,"sk_live_abc123":1}`,
			`unknown field "…"`, "sk_live_abc123"},
	}
	for _, tc := range cases {
		_, err := contract.DecodeLifecycle(tc.subject, envelope(tc.data))
		require.Error(t, err, tc.name)
		reason := contract.LogReason(err)
		require.Contains(t, reason, tc.want, tc.name)
		require.NotContains(t, reason, tc.secret, tc.name)
	}
}
