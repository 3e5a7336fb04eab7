package shards

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/migrations/pgtest"
)

// A new shard gets its parent's last release of each key (kept at the
// later of two) and the claims of the releases it finished, not the
// claim of a release still applied in parts, nor any other claim.
func TestCopyReleases(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	src, dst := pgtest.NewConn(t), pgtest.NewConn(t)
	_, err := src.Exec(ctx, `INSERT INTO retry_hold_releases (kind, hold_key, hold_reason, released_at) VALUES ('alpha', 'src', '', '2026-11-02T00:00:00Z');
INSERT INTO inbox (consumer, msg_id) VALUES ('scheduler', 'alpha-released:src:1'), ('scheduler', 'alpha-released:src:2'), ('scheduler', 'alpha-failed:x:1'), ('ingress-gate', 'alpha-released:src:3');
INSERT INTO retry_release_parts (msg_id, kind, hold_key, release, numbered, after_held_since, after_created_at, after_item_id, next_at)
VALUES ('alpha-released:src:2', 'alpha', 'src', '{}', 0, now(), now(), '', now())`)
	require.NoError(t, err)
	_, err = dst.Exec(ctx, `INSERT INTO retry_hold_releases (kind, hold_key, hold_reason, released_at) VALUES ('alpha', 'src', '', '2026-11-01T00:00:00Z')`)
	require.NoError(t, err)

	for range 2 { // a rerun changes nothing more
		require.NoError(t, copyReleases(ctx, src, map[int]*pgx.Conn{1: dst}))
	}
	claims := pgtest.Strings(t, dst, `SELECT consumer || '/' || msg_id FROM inbox ORDER BY 1`)
	require.Equal(t, []string{"scheduler/alpha-released:src:1"}, claims)
	var at string
	require.NoError(t, dst.QueryRow(ctx, `SELECT to_char(released_at AT TIME ZONE 'UTC', 'YYYY-MM-DD') FROM retry_hold_releases WHERE kind = 'alpha' AND hold_key = 'src'`).Scan(&at))
	require.Equal(t, "2026-11-02", at, "the later release wins")
}
