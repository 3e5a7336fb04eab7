package shards

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/retryd/retryd/services/scheduler"
)

// copyReleases gives each new shard what its parent knows of releases,
// which are not items: every shard takes every release fact (the items
// held under one key live on every shard). A new shard's consumer reads
// RETRIES from its start, releases included; with the inbox claims of the
// releases its parent finished it takes those as the duplicates they are,
// instead of releasing the moved holds again. A release still applied in
// parts (retry_release_parts) is left unclaimed: the new shard applies it
// to the rows it took over. And the last release of each key
// (retry_hold_releases) releases, there too, a hold decided before it and
// applied after it.
func copyReleases(ctx context.Context, src *pgx.Conn, targets map[int]*pgx.Conn) error {
	var releases, claims string
	if err := src.QueryRow(ctx, `SELECT coalesce(json_agg(row_to_json(r)), '[]') FROM retry_hold_releases r`).Scan(&releases); err != nil {
		return fmt.Errorf("read retry_hold_releases: %w", err)
	}
	if err := src.QueryRow(ctx, `SELECT coalesce(json_agg(row_to_json(i)), '[]') FROM inbox i
WHERE consumer = $1 AND msg_id LIKE '%-released:%' AND NOT EXISTS (SELECT 1 FROM retry_release_parts p WHERE p.msg_id = i.msg_id)`,
		scheduler.Owner).Scan(&claims); err != nil {
		return fmt.Errorf("read release claims: %w", err)
	}
	for _, t := range sortedKeys(targets) {
		c := targets[t]
		if _, err := c.Exec(ctx, `INSERT INTO retry_hold_releases SELECT * FROM json_populate_recordset(NULL::retry_hold_releases, $1::json)
ON CONFLICT (kind, hold_key, hold_reason) DO UPDATE SET released_at = greatest(retry_hold_releases.released_at, EXCLUDED.released_at)`, releases); err != nil {
			return fmt.Errorf("write retry_hold_releases of shard %d: %w", t, err)
		}
		if _, err := c.Exec(ctx, `INSERT INTO inbox SELECT * FROM json_populate_recordset(NULL::inbox, $1::json) ON CONFLICT DO NOTHING`, claims); err != nil {
			return fmt.Errorf("write release claims of shard %d: %w", t, err)
		}
	}
	return nil
}
