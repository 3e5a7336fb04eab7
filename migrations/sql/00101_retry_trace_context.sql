-- +goose Up
-- The W3C traceparent of the decision that scheduled the retry (the
-- policy stage's consumer span, or the operator's request), so the due
-- event continues that trace. Empty when tracing is off.
ALTER TABLE retries ADD COLUMN trace_context text NOT NULL DEFAULT '';

-- +goose Down
ALTER TABLE retries DROP COLUMN IF EXISTS trace_context;
