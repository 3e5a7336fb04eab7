package worker_test

import (
	"fmt"
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// sdkPackages are the packages a program imports to run or submit jobs
// (docs/worker-sdk.md, "SDK stability").
var sdkPackages = []string{
	"github.com/retryd/retryd/pkg/contract",
	"github.com/retryd/retryd/pkg/worker",
	"github.com/retryd/retryd/pkg/errclass",
	"github.com/retryd/retryd/pkg/backoff",
	"github.com/retryd/retryd/pkg/policy",
	"github.com/retryd/retryd/pkg/owner",
}

// heavyDependency names why path must stay out of the SDK, or returns "".
// A program embedding a worker pays for every package the SDK links: the
// OpenTelemetry SDK, exporters and gRPC belong to the program's own choice
// of telemetry, the NATS server and test helpers to tests, zerolog to
// retryd's services.
func heavyDependency(path string) string {
	under := func(prefix string) bool { return path == prefix || strings.HasPrefix(path, prefix+"/") }
	switch {
	case under("github.com/nats-io/nats-server"):
		return "the NATS server"
	case under("go.opentelemetry.io/otel/sdk"):
		return "the OpenTelemetry SDK; use the API"
	case under("go.opentelemetry.io/otel/exporters"), strings.Contains(path, "otlp"):
		return "an OpenTelemetry exporter or OTLP"
	case under("google.golang.org/grpc"):
		return "gRPC"
	case under("github.com/rs/zerolog"):
		return "zerolog; the SDK logs through log/slog"
	case under("github.com/retryd/retryd/internal/natstest"), under("github.com/retryd/retryd/pkg/contract/contracttest"), under("testing"):
		return "test support"
	case strings.HasPrefix(path, "github.com/retryd/retryd/") && !under("github.com/retryd/retryd/pkg"):
		return "a package of the server module; the SDK module stands alone"
	}
	return ""
}

// TestSDKDependenciesStayLight fails when a non-test file of an SDK
// package brings back a heavy dependency, directly or through anything it
// imports, and names the packages that import it.
func TestSDKDependenciesStayLight(t *testing.T) {
	t.Parallel()
	goCmd, err := exec.LookPath("go")
	require.NoError(t, err, "the check runs go list")
	args := append([]string{"list", "-deps", "-f", "{{.ImportPath}}{{range .Imports}} {{.}}{{end}}"}, sdkPackages...)
	out, err := exec.Command(goCmd, args...).CombinedOutput()
	require.NoError(t, err, "go list -deps: %s", out)

	var deps []string
	importers := map[string][]string{}
	for line := range strings.Lines(string(out)) {
		fields := strings.Fields(line)
		if len(fields) == 0 {
			continue
		}
		deps = append(deps, fields[0])
		for _, imp := range fields[1:] {
			importers[imp] = append(importers[imp], fields[0])
		}
	}
	// A listing that missed the SDK would pass for the wrong reason.
	require.Contains(t, deps, "github.com/retryd/retryd/pkg/worker")
	require.Contains(t, deps, "github.com/nats-io/nats.go")
	require.Contains(t, deps, "go.opentelemetry.io/otel/trace")

	var heavy []string
	for _, d := range deps {
		if why := heavyDependency(d); why != "" {
			heavy = append(heavy, fmt.Sprintf("%s (%s), imported by %s", d, why, strings.Join(importers[d], ", ")))
		}
	}
	require.Empty(t, heavy, "the SDK packages must depend on nats.go and the OpenTelemetry API, nothing heavier:\n%s", strings.Join(heavy, "\n"))
}

// TestPublicPackagesAreTheSDK fails when a package is added to the pkg
// module without being made supported API (docs/worker-sdk.md, "SDK
// stability"): plumbing goes under internal/ instead.
func TestPublicPackagesAreTheSDK(t *testing.T) {
	t.Parallel()
	goCmd, err := exec.LookPath("go")
	require.NoError(t, err, "the check runs go list")
	out, err := exec.Command(goCmd, "list", "github.com/retryd/retryd/pkg/...").CombinedOutput()
	require.NoError(t, err, "go list: %s", out)
	var got []string
	for line := range strings.Lines(string(out)) {
		// pkg/internal is the SDK's own plumbing, which Go lets no
		// program outside pkg import.
		if p := strings.TrimSpace(line); p != "" && !strings.HasPrefix(p, "github.com/retryd/retryd/pkg/internal/") {
			got = append(got, p)
		}
	}
	// tracing and contracttest are SDK packages too, outside sdkPackages:
	// tracing is the SDK's one link to OpenTelemetry's API, contracttest
	// is for tests and imports package testing.
	want := append([]string{"github.com/retryd/retryd/pkg/tracing", "github.com/retryd/retryd/pkg/contract/contracttest"}, sdkPackages...)
	require.ElementsMatch(t, want, got, "pkg holds exactly the supported SDK packages")
}
