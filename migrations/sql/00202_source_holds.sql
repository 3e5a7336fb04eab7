-- +goose Up
-- One row per throttled event holding a slot, until its due is evaluated
-- at the gate. While a source has any, a newcomer queues behind them even
-- when the current window has room: a holder whose due is late (the
-- scheduler or the gate behind, a crash) keeps its place instead of
-- losing its window to events that arrived after it. A holder's slot is
-- counted in its window's event_source_windows row when it is taken, so
-- the window's direct admissions and its slot holders together stay
-- within the limit.
CREATE TABLE event_source_holds (
    event_id text        PRIMARY KEY,
    source   text        NOT NULL,
    slot_at  timestamptz NOT NULL
);
CREATE INDEX event_source_holds_source_slot ON event_source_holds (source, slot_at);

-- +goose Down
DROP TABLE IF EXISTS event_source_holds;
