package harness

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Packages built by Build, by binary name.
var Packages = map[string]string{
	"nats-server":      "github.com/nats-io/nats-server/v2",
	"retryd-scheduler": "github.com/retryd/retryd/services/scheduler/cmd/retryd-scheduler",
	"retryd-ingress":   "github.com/retryd/retryd/services/ingress/cmd/retryd-ingress",
	"retryd-triggers":  "github.com/retryd/retryd/services/triggers/cmd/retryd-triggers",
	"faultworker":      "github.com/retryd/retryd/faults/cmd/faultworker",
}

// Binaries holds the paths of the built binaries.
type Binaries struct {
	Dir string
}

// Path returns the path of a binary built by Build.
func (b *Binaries) Path(name string) string { return filepath.Join(b.Dir, name) }

var (
	buildOnce sync.Once
	built     *Binaries
	buildErr  error
)

// Build compiles every binary of Packages once per test process into a
// directory under the temporary directory (RETRYD_FAULTS_BIN overrides it), so every scenario runs the code of this checkout.
func Build(ctx context.Context) (*Binaries, error) {
	buildOnce.Do(func() {
		// One directory per user, reused by later runs: go build only
		// relinks what changed, and no run leaves 100 MB behind.
		dir := os.Getenv("RETRYD_FAULTS_BIN")
		if dir == "" {
			dir = filepath.Join(os.TempDir(), "retryd-faults-bin-"+strconv.Itoa(os.Getuid()))
		}
		if buildErr = os.MkdirAll(dir, 0o755); buildErr != nil {
			return
		}
		built = &Binaries{Dir: dir}
		start := time.Now()
		args := []string{"build", "-o", dir + string(os.PathSeparator)}
		for _, pkg := range Packages {
			args = append(args, pkg)
		}
		cmd := exec.CommandContext(ctx, "go", args...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build the service binaries: %w\n%s", err, strings.TrimSpace(string(out)))
			return
		}
		fmt.Fprintf(os.Stderr, "faults: built %d binaries in %s (%s)\n", len(Packages), dir, time.Since(start).Round(time.Millisecond))
	})
	return built, buildErr
}
