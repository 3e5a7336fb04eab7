-- +goose Up
-- A release of every hold of a key is applied in parts (docs/ingress.md,
-- Releases), each part in its own transaction, by the scheduler's release
-- loop: a little before its rows' slots, or, for a release whose owner
-- admits the items itself, after them, as the fallback of the rows the
-- owner has not closed by then. Applying 100,000 holds in one statement
-- took one Postgres backend for seconds and slowed the owner's own
-- admissions. A row here is a release with rows left: where it stopped
-- (the rank numbered so far and the hold order of the last row) and when
-- the next part is due. The row and the part it records commit together,
-- so a crash resumes where it stopped.
CREATE TABLE retry_release_parts (
    msg_id           text        PRIMARY KEY,
    kind             text        NOT NULL,
    hold_key         text        NOT NULL,
    hold_reason      text        NOT NULL DEFAULT '',
    release          jsonb       NOT NULL,
    numbered         bigint      NOT NULL CHECK (numbered >= 0),
    after_held_since timestamptz NOT NULL,
    after_created_at timestamptz NOT NULL,
    after_item_id    text        NOT NULL,
    -- behind: the parts run after the owner admitted their rows (a
    -- release the owner admits itself), as fallbacks only.
    behind           boolean     NOT NULL DEFAULT false,
    next_at          timestamptz NOT NULL,
    created_at       timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX retry_release_parts_next_idx ON retry_release_parts (next_at);
CREATE INDEX retry_release_parts_key_idx ON retry_release_parts (kind, hold_key);

-- +goose Down
DROP TABLE IF EXISTS retry_release_parts;
