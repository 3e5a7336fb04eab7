package shards

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/services/scheduler"
)

// ShardStatus is one shard as the stream and its database see it.
type ShardStatus struct {
	Shard    int    `json:"shard"`
	Consumer string `json:"consumer"`
	// Exists: the shard's durable consumer exists (its scheduler started).
	Exists     bool   `json:"exists"`
	Pending    uint64 `json:"pending"`
	AckPending int    `json:"ack_pending"`
	AckFloor   uint64 `json:"ack_floor"`
	// Rows are read when the shard's database is given.
	Rows *RowStatus `json:"rows,omitempty"`
}

// RowStatus counts a shard database's rows.
type RowStatus struct {
	// Pending rows are scheduled or due.
	Pending int64 `json:"pending"`
	Total   int64 `json:"total"`
	// Elsewhere rows belong to another shard under the stream's count:
	// not moved yet (a split in progress or stopped).
	Elsewhere int64 `json:"elsewhere"`
}

// Status is the stream's split and every shard.
type Status struct {
	Shards   int           `json:"shards"`
	LastSeq  uint64        `json:"last_sequence"`
	PerShard []ShardStatus `json:"per_shard"`
}

// ReadStatus reads the stream, each shard's consumer and, for the
// databases given (shard i's at urls[i]; fewer than the count is fine),
// their rows.
func ReadStatus(ctx context.Context, js jetstream.JetStream, urls []string) (Status, error) {
	var st Status
	info, n, err := retriesShards(ctx, js)
	if err != nil {
		return st, err
	}
	if len(urls) > n {
		return st, fmt.Errorf("%w: --database-url: the stream has %d shard(s), got %d databases", ErrLayout, n, len(urls))
	}
	st.Shards, st.LastSeq = n, info.State.LastSeq
	for k := range n {
		s := ShardStatus{Shard: k, Consumer: scheduler.ConsumerNameOf(k)}
		c, err := js.Consumer(ctx, contract.StreamRetries, s.Consumer)
		switch {
		case errors.Is(err, jetstream.ErrConsumerNotFound):
		case err != nil:
			return st, fmt.Errorf("read consumer %s: %w", s.Consumer, err)
		default:
			ci := c.CachedInfo()
			s.Exists, s.Pending, s.AckPending, s.AckFloor = true, ci.NumPending, ci.NumAckPending, ci.AckFloor.Stream
		}
		if k < len(urls) {
			if s.Rows, err = countRows(ctx, urls[k], k, n); err != nil {
				return st, err
			}
		}
		st.PerShard = append(st.PerShard, s)
	}
	return st, nil
}

func countRows(ctx context.Context, url string, shard, n int) (*RowStatus, error) {
	c, err := pgx.Connect(ctx, url)
	if err != nil {
		return nil, fmt.Errorf("connect to shard %d's database: %w", shard, err)
	}
	defer c.Close(context.WithoutCancel(ctx))
	var r RowStatus
	var after itemKey
	for {
		rows, err := c.Query(ctx, `SELECT kind, item_id, state IN ('scheduled', 'due') FROM retries
WHERE (kind, item_id) > ($1, $2) ORDER BY kind, item_id LIMIT 5000`, after.kind, after.id)
		if err != nil {
			return nil, fmt.Errorf("count rows of shard %d: %w", shard, err)
		}
		read := 0
		var pending bool
		_, err = pgx.ForEachRow(rows, []any{&after.kind, &after.id, &pending}, func() error {
			read++
			r.Total++
			if pending {
				r.Pending++
			}
			if contract.Shard(after.kind, after.id, n) != shard {
				r.Elsewhere++
			}
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("count rows of shard %d: %w", shard, err)
		}
		if read < 5000 {
			return &r, nil
		}
	}
}
