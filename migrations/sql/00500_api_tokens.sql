-- +goose Up
-- API tokens: who may call the HTTP APIs, with which role
-- (docs/security.md). Only the SHA-256 of a token is stored, so a copy of
-- the database does not hand out credentials; the token itself is shown
-- once, when it is created. A revoked token's row stays, for audit.
CREATE TABLE api_tokens (
    id           text        PRIMARY KEY,
    name         text        NOT NULL CHECK (length(name) BETWEEN 1 AND 100),
    role         text        NOT NULL CHECK (role IN ('producer', 'viewer', 'operator', 'admin')),
    hash         bytea       NOT NULL UNIQUE CHECK (length(hash) = 32),
    created_at   timestamptz NOT NULL DEFAULT now(),
    expires_at   timestamptz,
    last_used_at timestamptz,
    revoked_at   timestamptz
);

-- A name is what audit records (updated_by, by) carry, so two live tokens
-- may not share one; a revoked token's name can be used again. The
-- bootstrap token is ensured through this index.
CREATE UNIQUE INDEX api_tokens_live_name_idx ON api_tokens (name) WHERE revoked_at IS NULL;

-- +goose Down
DROP TABLE IF EXISTS api_tokens;
