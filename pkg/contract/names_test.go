package contract

import (
	"regexp"
	"testing"
)

// The regular expressions the docs give for ids, tokens and types; the
// byte-by-byte matchers of ids.go must agree with them.
var namePatterns = []struct {
	name  string
	re    *regexp.Regexp
	match func(string) bool
}{
	{"id", regexp.MustCompile(`^[A-Za-z0-9_-]+$`), isID},
	{"token", regexp.MustCompile(`^[a-z0-9][a-z0-9_-]*$`), isToken},
	{"type", regexp.MustCompile(`^[a-z0-9][a-z0-9_-]*(\.[a-z0-9][a-z0-9_-]*)*$`), isType},
}

func TestNamePatterns(t *testing.T) {
	t.Parallel()
	for _, s := range nameSeeds {
		for _, p := range namePatterns {
			if got, want := p.match(s), p.re.MatchString(s); got != want {
				t.Errorf("%s %q: matcher says %v, pattern %v", p.name, s, got, want)
			}
		}
	}
}

var nameSeeds = []string{
	"", "a", "A", "0", "_", "-", "a_b-c", "Ab", "aB", "-a", "_a", "a.b", "a..b", ".a", "a.", "a.B", "a.-b", "a.0-_",
	"invoice.paid", "01JBENCH0000000000000000000", "a b", "a\n", "é", "a*", "a>", "a/b", "z9.y8.x7", "ab\x00",
}

func FuzzNamePatterns(f *testing.F) {
	for _, s := range nameSeeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		for _, p := range namePatterns {
			if got, want := p.match(s), p.re.MatchString(s); got != want {
				t.Fatalf("%s %q: matcher says %v, pattern %v", p.name, s, got, want)
			}
		}
	})
}
