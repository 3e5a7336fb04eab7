package ingressstore

import "github.com/retryd/retryd/stores/pgdb"

// DB is what the store needs from a connection: pgx.Tx, *pgx.Conn and
// *pgxpool.Pool satisfy it.
type DB = pgdb.DB
