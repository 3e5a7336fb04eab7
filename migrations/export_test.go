package migrations

// UpFS applies the migrations in fsys, for tests of Up's behaviour on
// migrations that fail.
var UpFS = up
