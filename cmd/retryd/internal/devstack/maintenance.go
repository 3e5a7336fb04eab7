package devstack

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/retryd/retryd/stores/retention"
)

// maintenanceEvery is how often the dev stack runs retention, as the Helm
// chart's CronJob does in a deployment.
const maintenanceEvery = time.Hour

// startMaintenance runs retention with its defaults once before the
// services start (so today's partitions exist) and then every
// maintenanceEvery until Stop. The dev stack connects as the tables'
// owner, which `retryd maintenance` needs too.
func (s *Stack) startMaintenance(ctx context.Context) error {
	if err := s.maintain(ctx); err != nil {
		return err
	}
	loopCtx, stop := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(maintenanceEvery)
		defer tick.Stop()
		for {
			select {
			case <-loopCtx.Done():
				return
			case <-tick.C:
				// A failed run is retried at the next tick; inserts meanwhile
				// land in the DEFAULT partition.
				if err := s.maintain(loopCtx); err != nil && loopCtx.Err() == nil {
					s.log.Warn().Err(err).Msg("maintenance")
				}
			}
		}
	}()
	s.onStop("maintenance", func(context.Context) error { stop(); <-done; return nil })
	return nil
}

func (s *Stack) maintain(ctx context.Context) error {
	conn, err := pgx.Connect(ctx, s.databaseURL)
	if err != nil {
		return fmt.Errorf("maintenance: connect: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	opts := retention.Options{Ahead: retention.DefaultAhead}
	if _, err := retention.Run(ctx, conn, opts, s.log.With().Str("component", "maintenance").Logger()); err != nil {
		return fmt.Errorf("maintenance: %w", err)
	}
	return nil
}
