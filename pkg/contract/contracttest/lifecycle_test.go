package contracttest_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/pkg/contract/contracttest"
)

// fatalT records a failure instead of ending the test, so the test can
// check that LifecycleMsg refuses what it must.
type fatalT struct {
	testing.TB
	failed string
}

func (f *fatalT) Helper() {}

func (f *fatalT) Fatalf(format string, args ...any) {
	if f.failed == "" {
		f.failed = format
	}
}

func TestLifecycleMsg(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 11, 27, 6, 0, 0, 0, time.UTC)
	for ev, data := range map[contract.Lifecycle]any{
		contract.Failed:    contract.FailedData{Kind: "job", ID: "j1", Attempt: 1, Error: contract.ErrorInfo{Class: "transient", Message: "boom"}},
		contract.Succeeded: contract.SucceededData{Kind: "job", ID: "j1", Attempt: 2},
		contract.Cancelled: contract.CancelledData{Kind: "job", ID: "j1", Attempt: 2, By: "operator"},
	} {
		msg := contracttest.LifecycleMsg(t, "test/owner", ev, data, at)
		require.Equal(t, contract.RetrySubject("job", ev, "j1"), msg.Subject)
		require.Equal(t, string(ev), msg.Header.Get(contract.HeaderEvent))
		got, err := contract.DecodeLifecycle(msg.Subject, msg.Data)
		require.NoError(t, err)
		require.Equal(t, "test/owner", got.Envelope.Source)
		require.Equal(t, at, got.Envelope.Time)
	}
}

func TestLifecycleMsgFailsOnWhatItCannotBuild(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		ev   contract.Lifecycle
		data any
	}{
		"not a data type":    {contract.Failed, struct{}{}},
		"a pointer":          {contract.Succeeded, &contract.SucceededData{Kind: "job", ID: "j1", Attempt: 1}},
		"data of another ev": {contract.Due, contract.SucceededData{Kind: "job", ID: "j1", Attempt: 1}},
		"invalid data":       {contract.Succeeded, contract.SucceededData{Kind: "job", Attempt: 1}},
	} {
		f := &fatalT{TB: t}
		contracttest.LifecycleMsg(f, "test/owner", tc.ev, tc.data, time.Now())
		require.NotEmpty(t, f.failed, name)
	}
}
