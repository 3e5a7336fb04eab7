package main

import (
	"cmp"
	"context"
	"fmt"
	"net/url"
	"slices"
	"sync"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/retryd/retryd/internal/dashboard"
	"github.com/retryd/retryd/pkg/contract"
	schedulersvc "github.com/retryd/retryd/services/scheduler"
)

// schedulerShardURLs parses the gateway's --scheduler values, one per
// scheduler shard in shard order.
func schedulerShardURLs(raws []string) ([]*url.URL, error) {
	if len(raws) == 0 || len(raws) > contract.MaxShards {
		return nil, fmt.Errorf("--scheduler: give 1 to %d scheduler URLs, one per shard, got %d", contract.MaxShards, len(raws))
	}
	out := make([]*url.URL, len(raws))
	for i, raw := range raws {
		p, err := url.Parse(raw)
		if err != nil || (p.Scheme != "http" && p.Scheme != "https") || p.Host == "" {
			if len(raws) == 1 {
				return nil, fmt.Errorf("--scheduler %q is not an http(s) URL", raw)
			}
			return nil, fmt.Errorf("--scheduler %q (shard %d) is not an http(s) URL", raw, i)
		}
		out[i] = p
	}
	return out, nil
}

// shardsSummary is the dashboard's counts of retries by kind and state,
// summed over the shards' databases (read at once).
func shardsSummary(ctx context.Context, pools []*pgxpool.Pool) (dashboard.Summary, error) {
	sums := make([]dashboard.Summary, len(pools))
	errs := make([]error, len(pools))
	var wg sync.WaitGroup
	for i, pool := range pools {
		wg.Go(func() { sums[i], errs[i] = schedulersvc.Summary(ctx, pool) })
	}
	wg.Wait()
	totals := map[[2]string]int64{}
	for i, err := range errs {
		if err != nil {
			return dashboard.Summary{}, fmt.Errorf("count retries of shard %d: %w", i, err)
		}
		for _, c := range sums[i].Counts {
			totals[[2]string{c.Kind, c.State}] += c.Count
		}
	}
	out := dashboard.Summary{Counts: make([]dashboard.Count, 0, len(totals))}
	for k, n := range totals {
		out.Counts = append(out.Counts, dashboard.Count{Kind: k[0], State: k[1], Count: n})
	}
	slices.SortFunc(out.Counts, func(a, b dashboard.Count) int {
		return cmp.Or(cmp.Compare(a.Kind, b.Kind), cmp.Compare(a.State, b.State))
	})
	return out, nil
}
