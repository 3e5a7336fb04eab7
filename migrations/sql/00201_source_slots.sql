-- +goose Up
-- Ordered, paced release of throttled events: each event a source's rate
-- limit holds back takes the next free slot, in arrival order:
-- window_start is the window the reservation tail is in, taken how many of
-- its rate_limit slots are reserved. Slot k of a window
-- is due at window_start + k * rate_window / rate_limit, so each held event
-- comes back once, at its own time, instead of every held event at every
-- window edge. One row per throttled source, updated in place.
CREATE TABLE event_source_slots (
    source       text        PRIMARY KEY,
    window_start timestamptz NOT NULL,
    taken        integer     NOT NULL CHECK (taken >= 1)
);

-- +goose Down
DROP TABLE IF EXISTS event_source_slots;
