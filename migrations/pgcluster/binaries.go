package pgcluster

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
)

// ErrNoPostgres is returned by Start when the PostgreSQL server binaries
// (initdb, pg_ctl) are neither in PATH nor under /usr/lib/postgresql/*/bin.
var ErrNoPostgres = errors.New("PostgreSQL server binaries (initdb, pg_ctl) not found in PATH or /usr/lib/postgresql/*/bin: " +
	"install PostgreSQL 15 (Debian/Ubuntu: apt-get install postgresql-15) or point TEST_DATABASE_URL / DATABASE_URL at a running server")

// debianRoot is where Debian and Ubuntu install one directory per major
// version; the server binaries are not in PATH there.
const debianRoot = "/usr/lib/postgresql"

// FindBinDir returns the directory holding initdb and pg_ctl: dir if set,
// else the one found in PATH, else the newest /usr/lib/postgresql/<major>/bin.
// Start uses it for Options.BinDir; the fault suite, which runs a server
// it stops and restarts itself, for its own.
func FindBinDir(dir string) (string, error) {
	if dir != "" {
		if !hasBinaries(dir) {
			return "", fmt.Errorf("find postgres binaries in %s: %w", dir, ErrNoPostgres)
		}
		return dir, nil
	}
	if initdb, err := exec.LookPath("initdb"); err == nil {
		// Resolve symlinks so pg_ctl and postgres come from the same install.
		if real, err := filepath.EvalSymlinks(initdb); err == nil {
			initdb = real
		}
		if d := filepath.Dir(initdb); hasBinaries(d) {
			return d, nil
		}
	}
	if d := newestDebianBinDir(debianRoot); d != "" {
		return d, nil
	}
	return "", ErrNoPostgres
}

func newestDebianBinDir(root string) string {
	entries, err := os.ReadDir(root)
	if err != nil {
		return ""
	}
	type install struct {
		major float64
		dir   string
	}
	var found []install
	for _, e := range entries {
		major, err := strconv.ParseFloat(e.Name(), 64) // "15", or "9.6" for old installs
		if err != nil {
			continue
		}
		d := filepath.Join(root, e.Name(), "bin")
		if hasBinaries(d) {
			found = append(found, install{major, d})
		}
	}
	if len(found) == 0 {
		return ""
	}
	sort.Slice(found, func(i, j int) bool { return found[i].major > found[j].major })
	return found[0].dir
}

func hasBinaries(dir string) bool {
	for _, name := range []string{"initdb", "pg_ctl", "postgres"} {
		fi, err := os.Stat(filepath.Join(dir, name))
		if err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
			return false
		}
	}
	return true
}
