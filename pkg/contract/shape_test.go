package contract

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"
)

// FuzzShapeFastPath holds the allocation-free path of checkShape to the
// token walk it replaced, and jsonValid to json.Valid: each pair accepts
// and refuses the same inputs.
func FuzzShapeFastPath(f *testing.F) {
	for _, s := range []string{
		`{}`, `[]`, `"a"`, `1`, `{"a":[1,{"b":"]]]"}]}`, `{"a":"\"}"}`, `{"a":1}{}`, `{"a":1`, `[1,]`,
		`{"a" 1}`, ` `, `{"a":"\\"}`, strings.Repeat("[", MaxDepth) + strings.Repeat("]", MaxDepth),
		strings.Repeat("[", MaxDepth+1) + strings.Repeat("]", MaxDepth+1), `nul`, `1 2`, `"\u00"`, `{"a":"x\u0000"}`, `["\\u0000"]`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) == 0 || !utf8.Valid(b) {
			return
		}
		if jsonValid(b) != json.Valid(b) {
			t.Fatalf("jsonValid says %v, json.Valid %v for %q", jsonValid(b), json.Valid(b), b)
		}
		fast := maxDepth(b) <= MaxDepth && jsonValid(b)
		err := explainShape("x", b)
		walked := err == nil
		if fast != walked {
			t.Fatalf("fast path says %v, token walk says %v for %q", fast, err, b)
		}
		// decodeShaped skips the NUL walk when the escape is absent: no
		// decoded string may hold a NUL then.
		var v any
		if fast && json.Unmarshal(b, &v) == nil && CheckStorable("", v) != nil && !bytes.Contains(b, nulEscape) {
			t.Fatalf("a decoded string holds a NUL but the input has no %s: %q", nulEscape, b)
		}
	})
}

func TestShapeDepthIgnoresStrings(t *testing.T) {
	t.Parallel()
	deepInString := `{"a":"` + strings.Repeat("[", 100) + `\"` + strings.Repeat("{", 100) + `"}`
	if err := checkShape("x", []byte(deepInString), MaxDataBytes); err != nil {
		t.Fatalf("brackets inside a string counted as nesting: %v", err)
	}
	if got := maxDepth([]byte(`[{"a":[1]}]`)); got != 3 {
		t.Fatalf("maxDepth = %d, want 3", got)
	}
}

func BenchmarkCheckShape(b *testing.B) {
	body := []byte(`{"specversion":"1.0","id":"retry.due:event:ev-1:1","source":"retryd/scheduler","type":"retry.due","time":"2026-11-22T02:20:26Z","datacontenttype":"application/json","data":{"kind":"event","id":"ev-1","attempt":1,"next_attempt_at":"2026-11-22T02:20:26Z","payload":{"order":"A-1001","lines":[{"sku":"X","qty":2}]}}}`)
	b.ReportAllocs()
	for b.Loop() {
		if err := checkShape("envelope", body, MaxEnvelopeBytes); err != nil {
			b.Fatal(err)
		}
	}
}
