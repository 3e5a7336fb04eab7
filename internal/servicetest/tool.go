package servicetest

import (
	"os"
	"testing"
)

// CI reports whether the tests run in CI, by the CI variable CI systems
// set (and .ci/run's callers do): anything but empty, "false" or "0".
// scripts/lint reads it the same way.
func CI() bool {
	ci := os.Getenv("CI")
	return ci != "" && ci != "false" && ci != "0"
}

// NeedTool is the one rule for a test that runs an external tool
// (chromium, node, psql, helm, libfaketime) that a newcomer may not have:
// when found is false it skips the test, saying what is missing and how
// to install it; in CI, which installs every such tool, it fails the test
// instead, since a missing tool there is a broken CI, not a reason to
// test less.
func NeedTool(t testing.TB, found bool, what, install string) {
	t.Helper()
	if found {
		return
	}
	if CI() {
		t.Fatalf("%s not found and CI is set: %s (.ci/run installs it)", what, install)
	}
	t.Skipf("%s not found: %s to run this test (CI runs it)", what, install)
}
