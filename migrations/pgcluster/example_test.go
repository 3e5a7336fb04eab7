package pgcluster_test

import (
	"context"
	"fmt"
	"os"

	"github.com/rs/zerolog"

	"github.com/retryd/retryd/migrations"
	"github.com/retryd/retryd/migrations/pgcluster"
)

// A dev runner without DATABASE_URL keeps a local cluster in a directory
// of its own and migrates it.
func Example() {
	ctx := context.Background()
	c, err := pgcluster.Start(ctx, pgcluster.Options{DataDir: ".retryd/pgdata", Log: os.Stderr})
	if err != nil {
		fmt.Println(err) // ErrNoPostgres says what to install
		return
	}
	defer c.Stop(ctx)
	if err := migrations.Up(ctx, c.URL("postgres"), zerolog.New(os.Stderr)); err != nil {
		fmt.Println(err)
	}
}
