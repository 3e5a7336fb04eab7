package contract_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/pkg/contract"
)

// A NUL character cannot be stored in Postgres text: a message carrying
// one in a field that ends up in a column would be redelivered forever, so
// decoding refuses it. Raw JSON (payload, checkpoint, data) keeps \u0000 as
// an escape and is accepted.
func TestDecodeRejectsNULInStoredFields(t *testing.T) {
	t.Parallel()
	build := func(data string) []byte {
		return []byte(`{"specversion":"1.0","id":"job-failed:j1:1","source":"test","type":"retry.failed",` +
			`"time":"2026-11-21T10:00:00Z","data":` + data + `}`)
	}
	cases := map[string]string{
		"error.message":    `{"kind":"job","id":"j1","attempt":1,"error":{"message":"boom\u0000"}}`,
		"reason":           `{"kind":"job","id":"j1","attempt":1,"error":{"message":"boom"},"reason":"x\u0000"}`,
		"metadata.tenant":  `{"kind":"job","id":"j1","attempt":1,"error":{"message":"boom"},"metadata":{"tenant":"a\u0000b"}}`,
		"metadata (a key)": `{"kind":"job","id":"j1","attempt":1,"error":{"message":"boom"},"metadata":{"a\u0000":"b"}}`,
	}
	for name, data := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := contract.DecodeLifecycle("retry.job.failed.j1", build(data))
			require.ErrorIs(t, err, contract.ErrInvalid)
			require.Contains(t, err.Error(), "NUL")
		})
	}

	ok := `{"kind":"job","id":"j1","attempt":1,"error":{"message":"boom"},"payload":{"s":"a\u0000b"},"checkpoint":["\u0000"]}`
	ev, err := contract.DecodeLifecycle("retry.job.failed.j1", build(ok))
	require.NoError(t, err)
	require.JSONEq(t, `{"s":"a\u0000b"}`, string(ev.Failed.Payload))

	_, err = contract.DecodeProducerEvent([]byte(`{"source":"shop","type":"order.created","subject":"x\u0000"}`))
	require.ErrorIs(t, err, contract.ErrInvalid)
	_, err = contract.DecodeProducerEvent([]byte(`{"source":"shop","type":"order.created","data":{"note":"\u0000"}}`))
	require.NoError(t, err)

}
