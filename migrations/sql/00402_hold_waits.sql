-- +goose Up
-- A slot holder whose due came when its turn had not (its window full,
-- holders ahead of it) is handed back to wait; waits_until is its turn.
-- A holder behind it that comes in the meantime, at the start of a new
-- window say, waits behind it instead of passing it.
ALTER TABLE event_source_holds ADD COLUMN waits_until timestamptz;

-- +goose Down
ALTER TABLE event_source_holds DROP COLUMN IF EXISTS waits_until;
