-- +goose Up
-- The audit trail: who did which operator or admin action, as named by
-- the token the request carried, never by its body (docs/security.md).
-- Each service writes its own actions' rows in the transaction of the
-- action, so an action that fails or rolls back leaves none. Rows hold no
-- payloads and no tokens: detail is a few small fields (reason, until,
-- version).
CREATE TABLE audit_log (
    -- An identity rather than bigserial: inserting needs no grant on a
    -- sequence, only INSERT on the table (migrations/grants.go).
    id         bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at         timestamptz NOT NULL DEFAULT now(),
    principal  text        NOT NULL CHECK (length(principal) BETWEEN 1 AND 200),
    role       text        NOT NULL CHECK (length(role) <= 20),
    action     text        NOT NULL CHECK (length(action) BETWEEN 1 AND 100),
    target     text        NOT NULL CHECK (length(target) <= 600),
    detail     jsonb       NOT NULL DEFAULT '{}'::jsonb CHECK (octet_length(detail::text) <= 4096),
    request_id text        CHECK (length(request_id) <= 100)
);

-- GET /v1/audit pages newest first, by principal or action.
CREATE INDEX audit_log_at_idx ON audit_log (at DESC, id DESC);
CREATE INDEX audit_log_principal_idx ON audit_log (principal, id DESC);
CREATE INDEX audit_log_action_idx ON audit_log (action, id DESC);

-- +goose Down
DROP TABLE IF EXISTS audit_log;
