package errclass_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/pkg/errclass"
)

func TestParse(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in   string
		want errclass.Class
		ok   bool
	}{
		{"timeout", errclass.Timeout, true},
		{"network", errclass.Network, true},
		{"rate_limit", errclass.RateLimit, true},
		{"temporary", errclass.Temporary, true},
		{"authentication", errclass.Authentication, true},
		{"permission", errclass.Permission, true},
		{"validation", errclass.Validation, true},
		{"unknown", errclass.Unknown, true},
		{"temporary_error", errclass.Temporary, true},
		{"validation_error", errclass.Validation, true},
		{" Rate_Limit\n", errclass.RateLimit, true},
		{"TEMPORARY_ERROR", errclass.Temporary, true},
		{"", errclass.Unknown, false},
		{"manual_intervention", errclass.Unknown, false},
		{"rate limit", errclass.Unknown, false},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			t.Parallel()
			got, err := errclass.Parse(tt.in)
			require.Equal(t, tt.want, got)
			if tt.ok {
				require.NoError(t, err)
			} else {
				require.ErrorIs(t, err, errclass.ErrUnknownClass)
			}
		})
	}
}

func TestRetryable(t *testing.T) {
	t.Parallel()
	want := map[errclass.Class]bool{
		errclass.Timeout: true, errclass.Network: true, errclass.RateLimit: true, errclass.Temporary: true,
		errclass.Authentication: false, errclass.Permission: false, errclass.Validation: false,
		errclass.Unknown: true, "": true, "made_up": true,
	}
	for class, retryable := range want {
		require.Equal(t, retryable, class.Retryable(), "class %q", class)
	}
	for _, class := range errclass.Classes() {
		require.True(t, class.Valid(), "class %q", class)
		_, known := want[class]
		require.True(t, known, "class %q has no expectation", class)
	}
	require.False(t, errclass.Class("made_up").Valid())
}
