package servicetest

import (
	"fmt"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"
)

// FillUp sends requests until refusals of them are refused with 503, the
// answer to a request whose stream is full (it discards new messages), for
// a test of what an API answers and stores then. send sends the
// request of an id (full-0, full-1, …); checkRefusal checks a 503's
// headers and body. The test fails on any other answer than 202 or 503,
// on a 202 after a refusal (nothing frees room meanwhile), when the first
// request is refused and when 200 requests do not fill the stream. It
// returns the ids accepted and refused, in the order sent.
func FillUp(t testing.TB, refusals int, send func(id string) (*http.Response, []byte),
	checkRefusal func(resp *http.Response, body []byte)) (accepted, refused []string) {
	t.Helper()
	for i := 0; len(refused) < refusals && i < 200; i++ {
		id := fmt.Sprintf("full-%d", i)
		resp, raw := send(id)
		switch resp.StatusCode {
		case http.StatusAccepted:
			require.Empty(t, refused, "%s accepted after a refusal: nothing was freed", id)
			accepted = append(accepted, id)
		case http.StatusServiceUnavailable:
			checkRefusal(resp, raw)
			refused = append(refused, id)
		default:
			t.Fatalf("%s: status %d: %s", id, resp.StatusCode, raw)
		}
	}
	require.NotEmpty(t, accepted)
	require.Len(t, refused, refusals, "the stream filled up")
	return accepted, refused
}
