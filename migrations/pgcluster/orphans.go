package pgcluster

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// A throwaway cluster records the pid of the process that started it in
// ownerFile. pg_ctl detaches the server, so a test binary that is killed or
// times out (and never calls Stop) leaves its server running; the next
// throwaway Start stops such orphans and removes their directories.
const (
	tempPrefix = "retryd-pg-"
	ownerFile  = "owner.pid"
)

func writeOwner(base string) error {
	return os.WriteFile(filepath.Join(base, ownerFile), []byte(strconv.Itoa(os.Getpid())), 0o644)
}

// reapOrphans stops the throwaway clusters whose owner process is gone.
// It is best effort: errors only mean an orphan survives a while longer.
func (c *Cluster) reapOrphans(ctx context.Context) {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), tempPrefix+"*"))
	for _, base := range dirs {
		if base == c.tempDir {
			continue
		}
		b, err := os.ReadFile(filepath.Join(base, ownerFile))
		if err != nil {
			continue // being created right now, or not ours
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil || pid <= 0 || processAlive(pid) {
			continue
		}
		orphan := &Cluster{binDir: c.binDir, cred: c.cred, log: c.log, dataDir: filepath.Join(base, "data"), tempDir: base}
		if _, err := os.Stat(filepath.Join(orphan.dataDir, "postmaster.pid")); err == nil {
			_ = orphan.pgctlStop(ctx, "immediate")
		}
		_ = os.RemoveAll(base)
	}
}

func processAlive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}
