package devstack

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
)

// postgresDir is where the local cluster lives: DataDir/postgres, unless
// the process runs as root and the postgres OS user, which runs the server,
// cannot reach it (a home directory of mode 0700, say). Then it is a
// directory of its own under /var/tmp, named after the data directory, and
// note says so.
func postgresDir(dataDir string) (dir, note string, err error) {
	abs, err := filepath.Abs(dataDir)
	if err != nil {
		return "", "", fmt.Errorf("resolve data directory: %w", err)
	}
	dir = filepath.Join(abs, "postgres")
	if os.Geteuid() != 0 || othersCanEnter(abs) {
		return dir, "", nil
	}
	sum := sha256.Sum256([]byte(abs))
	alt := filepath.Join(os.TempDir(), "retryd-dev-"+hex.EncodeToString(sum[:6]), "postgres")
	if _, err := os.Stat("/var/tmp"); err == nil {
		alt = filepath.Join("/var/tmp", "retryd-dev-"+hex.EncodeToString(sum[:6]), "postgres")
	}
	if err := os.MkdirAll(filepath.Dir(alt), 0o755); err != nil {
		return "", "", fmt.Errorf("create %s: %w", filepath.Dir(alt), err)
	}
	return alt, "the postgres OS user cannot enter the data directory (a parent directory is not world-executable); the local Postgres cluster lives here instead", nil
}

// othersCanEnter reports whether every directory from / to dir lets
// other users traverse it (mode o+x).
func othersCanEnter(dir string) bool {
	for d := dir; ; d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if err != nil || fi.Mode().Perm()&0o001 == 0 {
			return false
		}
		if d == filepath.Dir(d) {
			return true
		}
	}
}
