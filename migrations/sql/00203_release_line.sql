-- +goose Up
-- A release (a resume, a limit change) puts the source's deferred events
-- in a line that ingress admits itself, in slot order, each at its slot:
-- released marks those holds. The scheduler emits no due for them (the
-- released fact says owner_admits); ingress's releaser reads each line
-- through the partial index, oldest slot first.
ALTER TABLE event_source_holds ADD COLUMN released boolean NOT NULL DEFAULT false;
CREATE INDEX event_source_holds_release_line ON event_source_holds (source, slot_at, event_id) WHERE released;

-- +goose Down
DROP INDEX IF EXISTS event_source_holds_release_line;
ALTER TABLE event_source_holds DROP COLUMN IF EXISTS released;
