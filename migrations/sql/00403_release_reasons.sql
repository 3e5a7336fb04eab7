-- +goose Up
-- Releases are recorded per hold reason: a freed concurrency slot (a
-- release of reason concurrency) must not release a throttle hold of the
-- same trigger that was decided before it and applied after it. A release
-- of every reason (a resume) is recorded with hold_reason ''; rows from
-- before this migration are such releases.
ALTER TABLE retry_hold_releases ADD COLUMN hold_reason text NOT NULL DEFAULT '';
ALTER TABLE retry_hold_releases DROP CONSTRAINT retry_hold_releases_pkey;
ALTER TABLE retry_hold_releases ADD PRIMARY KEY (kind, hold_key, hold_reason);

-- +goose Down
DELETE FROM retry_hold_releases r WHERE hold_reason <> ''
    AND EXISTS (SELECT 1 FROM retry_hold_releases o WHERE o.kind = r.kind AND o.hold_key = r.hold_key AND o.hold_reason = '');
DELETE FROM retry_hold_releases r WHERE hold_reason <> '' AND EXISTS (
    SELECT 1 FROM retry_hold_releases o WHERE o.kind = r.kind AND o.hold_key = r.hold_key AND o.hold_reason <> ''
      AND (o.released_at, o.hold_reason) > (r.released_at, r.hold_reason));
ALTER TABLE retry_hold_releases DROP CONSTRAINT retry_hold_releases_pkey;
ALTER TABLE retry_hold_releases DROP COLUMN hold_reason;
ALTER TABLE retry_hold_releases ADD PRIMARY KEY (kind, hold_key);
