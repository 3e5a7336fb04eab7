package main

import (
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// The wrapping the READMEs quote is the code main.go runs, between its
// retryd markers, so that what a reader copies is what the tests ran.
func TestREADMEsQuoteTheWrapping(t *testing.T) {
	t.Parallel()
	src, err := os.ReadFile("main.go")
	require.NoError(t, err)
	_, block, ok := strings.Cut(string(src), "// --- retryd: the wrapping (quoted in README.md) -------------------\n")
	require.True(t, ok, "main.go has no start marker")
	block, _, ok = strings.Cut(block, "\t// --- end of the wrapping")
	require.True(t, ok, "main.go has no end marker")
	var want strings.Builder
	for line := range strings.Lines(block) {
		want.WriteString(strings.TrimPrefix(line, "\t"))
	}

	for path, heading := range map[string]string{"README.md": "## The wrapping", "../../README.md": "## Extend retryd"} {
		doc, err := os.ReadFile(path)
		require.NoError(t, err)
		_, section, ok := strings.Cut(string(doc), "\n"+heading+"\n")
		require.True(t, ok, "%s has no %q", path, heading)
		_, quote, ok := strings.Cut(section, "```go\n")
		require.True(t, ok, "%s: no go block under %q", path, heading)
		quote, _, _ = strings.Cut(quote, "```")
		require.Equal(t, want.String(), quote, "%s quotes main.go's wrapping", path)
	}
}
