// Package migrations holds retryd's Postgres schema as embedded goose SQL
// migrations and applies them.
//
// Up may run from several processes at once (every service, `retryd
// migrate`, test binaries): goose takes a session-level advisory lock
// before it reads the version table, so one process applies a migration
// and the others wait and then find nothing left to do. Each migration runs
// in its own transaction, so a failed one leaves the schema at the
// previous version.
package migrations

import (
	"context"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"
	"github.com/rs/zerolog"
)

//go:embed sql/*.sql
var embedded embed.FS

// lockPoll is how often a process waiting for another one's migration
// lock retries; lockPolls bounds the wait (10 minutes).
const (
	lockPoll  = 1 // seconds, the minimum goose allows
	lockPolls = 600
)

// MigrationStatus is one migration and whether the database has it.
type MigrationStatus struct {
	Version   int64
	Name      string // file name, e.g. 00001_foundation.sql
	Applied   bool
	AppliedAt time.Time // zero when not applied
}

// FS returns the migration files (NNNNN_name.sql at the root).
func FS() fs.FS {
	sub, err := fs.Sub(embedded, "sql")
	if err != nil {
		panic(err) // the directory is embedded at build time
	}
	return sub
}

// Fingerprint is a short hash of every migration's name and content. Two
// binaries with the same fingerprint build the same schema; pgtest names
// its template database after it.
func Fingerprint() string {
	h := sha256.New()
	names, err := fs.Glob(FS(), "*.sql")
	if err != nil {
		panic(err)
	}
	for _, name := range names { // Glob returns names sorted
		b, err := fs.ReadFile(FS(), name)
		if err != nil {
			panic(err)
		}
		fmt.Fprintf(h, "%s\x00%d\x00", name, len(b))
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}

// Latest is the highest migration version embedded in this binary.
func Latest() int64 {
	var latest int64
	names, _ := fs.Glob(FS(), "*.sql")
	for _, name := range names {
		if v, err := goose.NumericComponent(name); err == nil && v > latest {
			latest = v
		}
	}
	return latest
}

// Up applies every pending migration, one at a time, each in its own
// transaction and under goose's advisory lock. Running it on an up-to-date
// database changes nothing.
func Up(ctx context.Context, databaseURL string, log zerolog.Logger) error {
	return up(ctx, databaseURL, FS(), log)
}

func up(ctx context.Context, databaseURL string, fsys fs.FS, log zerolog.Logger) error {
	p, err := newProvider(databaseURL, fsys)
	if err != nil {
		return err
	}
	defer p.Close()
	applied := 0
	for {
		res, err := p.UpByOne(ctx)
		if errors.Is(err, goose.ErrNoNextVersion) {
			break
		}
		var partial *goose.PartialError
		if errors.As(err, &partial) {
			res = partial.Failed
		}
		logResult(log, res)
		if err != nil {
			return fmt.Errorf("apply migrations: %w", err)
		}
		applied++
	}
	version, err := p.GetDBVersion(ctx)
	if err != nil {
		return fmt.Errorf("read schema version: %w", err)
	}
	log.Info().Int64("version", version).Int("applied", applied).Msg("schema up to date")
	return nil
}

// Down rolls back applied migrations, newest first, until the schema is at
// toVersion (0 removes every table). Each migration's Down section runs in
// its own transaction under the advisory lock.
func Down(ctx context.Context, databaseURL string, toVersion int64, log zerolog.Logger) error {
	if toVersion < 0 {
		return fmt.Errorf("roll back migrations: toVersion %d is negative", toVersion)
	}
	p, err := newProvider(databaseURL, FS())
	if err != nil {
		return err
	}
	defer p.Close()
	results, err := p.DownTo(ctx, toVersion)
	var partial *goose.PartialError
	if errors.As(err, &partial) {
		results = append(partial.Applied, partial.Failed)
	}
	for _, res := range results {
		logResult(log, res)
	}
	if err != nil {
		return fmt.Errorf("roll back migrations to %d: %w", toVersion, err)
	}
	log.Info().Int64("version", toVersion).Int("rolled_back", len(results)).Msg("schema rolled back")
	return nil
}

// Status lists every embedded migration, oldest first, and whether the
// database has applied it.
func Status(ctx context.Context, databaseURL string) ([]MigrationStatus, error) {
	p, err := newProvider(databaseURL, FS())
	if err != nil {
		return nil, err
	}
	defer p.Close()
	list, err := p.Status(ctx)
	if err != nil {
		return nil, fmt.Errorf("read migration status: %w", err)
	}
	out := make([]MigrationStatus, 0, len(list))
	for _, s := range list {
		out = append(out, MigrationStatus{
			Version:   s.Source.Version,
			Name:      path.Base(s.Source.Path),
			Applied:   s.State == goose.StateApplied,
			AppliedAt: s.AppliedAt,
		})
	}
	return out, nil
}

func newProvider(databaseURL string, fsys fs.FS) (*goose.Provider, error) {
	cfg, err := pgx.ParseConfig(databaseURL)
	if err != nil {
		return nil, fmt.Errorf("parse database URL: %w", err)
	}
	db := stdlib.OpenDB(*cfg)
	locker, err := lock.NewPostgresSessionLocker(lock.WithLockTimeout(lockPoll, lockPolls))
	if err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("create migration lock: %w", err)
	}
	p, err := goose.NewProvider(goose.DialectPostgres, db, fsys,
		goose.WithSessionLocker(locker),
		goose.WithDisableGlobalRegistry(true),
		// Each part of retryd numbers its migrations in its own block
		// (docs/design.md), so a release can add 00101 to a database that
		// already has 00200; goose applies such a missing migration first
		// instead of refusing.
		goose.WithAllowOutofOrder(true),
	)
	if err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("create migration provider: %w", err)
	}
	return p, nil
}

func logResult(log zerolog.Logger, res *goose.MigrationResult) {
	if res == nil || res.Source == nil {
		return
	}
	ev := log.Info()
	if res.Error != nil {
		ev = log.Error().Err(res.Error)
	}
	ev.Int64("version", res.Source.Version).
		Str("name", path.Base(res.Source.Path)).
		Str("direction", res.Direction).
		Dur("duration", res.Duration).
		Msg("migration")
}
