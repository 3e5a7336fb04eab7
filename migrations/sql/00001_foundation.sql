-- +goose Up
-- retryd foundation schema: the scheduler's retry projection and history,
-- retry policies, the transactional outbox and inbox every service uses,
-- and the tables of the owners of retries (workflow events, event ingress
-- retries, triggers and deliveries, runs and steps, jobs).

-- Retry policies per kind and job type ('' = the kind's default; kind '*' =
-- the fallback for kinds without a policy). Every change bumps version and
-- is copied to retry_policy_versions.
CREATE TABLE retry_policies (
    kind                  text        NOT NULL,
    job_type              text        NOT NULL DEFAULT '',
    name                  text        NOT NULL,
    version               integer     NOT NULL DEFAULT 1 CHECK (version >= 1),
    max_retries           integer     NOT NULL CHECK (max_retries BETWEEN 0 AND 1000),
    base_delay_ms         bigint      NOT NULL CHECK (base_delay_ms >= 0),
    multiplier            double precision NOT NULL DEFAULT 2 CHECK (multiplier >= 1),
    max_delay_ms          bigint      NOT NULL CHECK (max_delay_ms >= base_delay_ms),
    jitter                text        NOT NULL DEFAULT 'additive' CHECK (jitter IN ('none', 'full', 'equal', 'additive')),
    jitter_ms             bigint      NOT NULL DEFAULT 0 CHECK (jitter_ms >= 0),
    retryable_classes     text[]      NOT NULL DEFAULT '{}',
    non_retryable_classes text[]      NOT NULL DEFAULT '{}',
    enabled               boolean     NOT NULL DEFAULT true,
    updated_by            text        NOT NULL DEFAULT 'migration',
    created_at            timestamptz NOT NULL DEFAULT now(),
    updated_at            timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (kind, job_type)
);

CREATE TABLE retry_policy_versions (
    kind                  text        NOT NULL,
    job_type              text        NOT NULL,
    version               integer     NOT NULL,
    policy                jsonb       NOT NULL,
    changed_by            text        NOT NULL,
    changed_at            timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (kind, job_type, version)
);

-- Defaults: a 1 s base, x2, 5 min cap, up to 1 s jitter for every kind but
-- jobs, with 3 retries for workflow steps and unknown kinds; events and
-- trigger deliveries allow 20 retries because a throttle or a pause, not a
-- fault, holds them back. Jobs: 2 h base, x2, 24 h cap, 5 min jitter, 5
-- retries, and a few common job types of their own.
INSERT INTO retry_policies (kind, job_type, name, max_retries, base_delay_ms, multiplier, max_delay_ms, jitter, jitter_ms, non_retryable_classes) VALUES
    ('*',             '',                  'default',                3,  1000,     2,   300000,   'additive', 1000,   '{authentication,permission,validation}'),
    ('event',         '',                  'event-ingress',          20, 1000,     2,   300000,   'additive', 1000,   '{authentication,permission,validation}'),
    ('event-trigger', '',                  'event-trigger',          20, 1000,     2,   300000,   'additive', 1000,   '{authentication,permission,validation}'),
    ('job',           '',                  'job-default',            5,  7200000,  2,   86400000, 'additive', 300000, '{authentication,permission,validation}'),
    ('job',           'workflow_step',     'workflow-step',          3,  1000,     2,   300000,   'additive', 1000,   '{authentication,permission,validation}'),
    ('job',           'linkedin_outreach', 'linkedin-outreach',      3,  3600000,  1.5, 43200000, 'additive', 300000, '{authentication,permission,validation}'),
    ('job',           'email_campaign',    'email-campaign',         4,  1800000,  2,   21600000, 'additive', 300000, '{authentication,permission,validation}'),
    ('job',           'data_enrichment',   'data-enrichment',        5,  300000,   2,   3600000,  'additive', 60000,  '{authentication,permission,validation}');

INSERT INTO retry_policy_versions (kind, job_type, version, policy, changed_by)
SELECT kind, job_type, version, to_jsonb(p) - 'created_at' - 'updated_at', 'migration' FROM retry_policies p;

-- The scheduler's projection: one row per retried item (kind + id).
-- state: scheduled (waiting for next_attempt_at), due (due event published,
-- waiting for the owner's outcome), succeeded, exhausted, cancelled.
-- attempt is the attempt that runs next (scheduled/due) or that ran last.
-- retry_count counts retries used against max_retries; a manual retry with
-- reset sets budget_base so attempts stay monotonic (and due ids unique).
CREATE TABLE retries (
    kind               text        NOT NULL,
    item_id            text        NOT NULL,
    state              text        NOT NULL CHECK (state IN ('scheduled', 'due', 'succeeded', 'exhausted', 'cancelled')),
    attempt            integer     NOT NULL CHECK (attempt >= 0),
    retry_count        integer     NOT NULL DEFAULT 0,
    budget_base        integer     NOT NULL DEFAULT 0,
    max_retries        integer     NOT NULL,
    retry_enabled      boolean     NOT NULL DEFAULT true,
    max_retries_override integer,
    job_type           text        NOT NULL DEFAULT '',
    source             text        NOT NULL DEFAULT '',
    policy_name        text        NOT NULL DEFAULT '',
    policy_version     integer     NOT NULL DEFAULT 0,
    next_attempt_at    timestamptz,
    due_at             timestamptz,
    due_emissions      integer     NOT NULL DEFAULT 0,
    last_error_class   text        NOT NULL DEFAULT '',
    last_error_message text        NOT NULL DEFAULT '',
    last_error_at      timestamptz,
    last_reason        text        NOT NULL DEFAULT '',
    exhausted_reason   text        NOT NULL DEFAULT '',
    payload            json,
    checkpoint         json,
    metadata           jsonb       NOT NULL DEFAULT '{}',
    created_at         timestamptz NOT NULL DEFAULT now(),
    updated_at         timestamptz NOT NULL DEFAULT now(),
    resolved_at        timestamptz,
    PRIMARY KEY (kind, item_id)
);
CREATE INDEX retries_due_idx ON retries (next_attempt_at) WHERE state = 'scheduled';
CREATE INDEX retries_redue_idx ON retries (due_at) WHERE state = 'due';
CREATE INDEX retries_state_idx ON retries (kind, state, updated_at DESC);
CREATE INDEX retries_job_type_idx ON retries (job_type, state) WHERE job_type <> '';
CREATE INDEX retries_source_idx ON retries (source, state) WHERE source <> '';

-- Every lifecycle fact of every item, in order: "why did it retry?".
-- event: failed, scheduled, rescheduled, due, succeeded, exhausted, cancelled.
CREATE TABLE retry_history (
    id             bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    kind           text        NOT NULL,
    item_id        text        NOT NULL,
    attempt        integer     NOT NULL,
    event          text        NOT NULL,
    job_type       text        NOT NULL DEFAULT '',
    source         text        NOT NULL DEFAULT '',
    error_class    text        NOT NULL DEFAULT '',
    error_message  text        NOT NULL DEFAULT '',
    delay_ms       bigint,
    decided_by     text        NOT NULL DEFAULT '',
    policy_name    text        NOT NULL DEFAULT '',
    policy_version integer     NOT NULL DEFAULT 0,
    next_attempt_at timestamptz,
    detail         jsonb       NOT NULL DEFAULT '{}',
    msg_id         text        NOT NULL DEFAULT '',
    at             timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX retry_history_item_idx ON retry_history (kind, item_id, id);
CREATE INDEX retry_history_at_idx ON retry_history (at);
CREATE INDEX retry_history_job_type_idx ON retry_history (job_type, at) WHERE job_type <> '';

-- Transactional outbox: a service writes the messages it must publish in the
-- same transaction as its state change; its relay publishes them with
-- Nats-Msg-Id and deletes them after the PubAck. owner keeps each relay to
-- its own rows (NATS permissions are per service).
CREATE TABLE outbox (
    id         bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    owner      text        NOT NULL,
    subject    text        NOT NULL,
    msg_id     text        NOT NULL,
    headers    jsonb       NOT NULL DEFAULT '{}',
    payload    bytea       NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    attempts   integer     NOT NULL DEFAULT 0,
    last_error text        NOT NULL DEFAULT ''
);
CREATE INDEX outbox_owner_idx ON outbox (owner, id);

-- Inbox: the record that a consumer applied a message (by Nats-Msg-Id), so a
-- redelivered or republished message changes nothing. Pruned after the
-- retention the services are configured with.
CREATE TABLE inbox (
    consumer   text        NOT NULL,
    msg_id     text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, msg_id)
);
CREATE INDEX inbox_applied_idx ON inbox (applied_at);

-- Workflow events as ingress accepted them. status: received, admitted,
-- deferred, cancelled, exhausted.
CREATE TABLE workflow_events (
    event_id    text        PRIMARY KEY,
    source      text        NOT NULL,
    type        text        NOT NULL,
    status      text        NOT NULL DEFAULT 'received' CHECK (status IN ('received', 'admitted', 'deferred', 'cancelled', 'exhausted')),
    envelope    json        NOT NULL,
    received_at timestamptz NOT NULL DEFAULT now(),
    admitted_at timestamptz,
    updated_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX workflow_events_source_idx ON workflow_events (source, received_at);

-- Per-source gate: rate limit (events per window) and pause.
CREATE TABLE event_sources (
    source            text        PRIMARY KEY,
    rate_limit        integer     CHECK (rate_limit IS NULL OR rate_limit > 0),
    rate_window_ms    bigint      CHECK (rate_window_ms IS NULL OR rate_window_ms > 0),
    paused            boolean     NOT NULL DEFAULT false,
    paused_until      timestamptz,
    pause_reason      text        NOT NULL DEFAULT '',
    allowed_types     text[]      NOT NULL DEFAULT '{}',
    updated_by        text        NOT NULL DEFAULT '',
    created_at        timestamptz NOT NULL DEFAULT now(),
    updated_at        timestamptz NOT NULL DEFAULT now()
);

-- Admission counts per source and fixed window, locked per row so several
-- ingress instances agree.
CREATE TABLE event_source_windows (
    source       text        NOT NULL,
    window_start timestamptz NOT NULL,
    admitted     integer     NOT NULL DEFAULT 0,
    PRIMARY KEY (source, window_start)
);

-- Durable event ingress retries: events a source's gate deferred. retry_state: scheduled, due,
-- completed, cancelled, exhausted.
CREATE TABLE event_ingress_retries (
    event_id        text        PRIMARY KEY REFERENCES workflow_events (event_id) ON DELETE CASCADE,
    source          text        NOT NULL,
    retry_state     text        NOT NULL DEFAULT 'scheduled',
    attempts        integer     NOT NULL DEFAULT 0,
    next_attempt_at timestamptz,
    last_error      text        NOT NULL DEFAULT '',
    metadata        jsonb       NOT NULL DEFAULT '{}',
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX event_ingress_retries_state_idx ON event_ingress_retries (retry_state, next_attempt_at);

-- Triggers and their deliveries. A trigger's current definition;
-- every change bumps version and is kept in workflow_trigger_versions.
CREATE TABLE workflow_triggers (
    trigger_id         text        PRIMARY KEY,
    name               text        NOT NULL,
    source             text        NOT NULL,
    event_type         text        NOT NULL,
    predicate          text        NOT NULL DEFAULT '',
    throttle_limit     integer     CHECK (throttle_limit IS NULL OR throttle_limit > 0),
    throttle_window_ms bigint      CHECK (throttle_window_ms IS NULL OR throttle_window_ms > 0),
    throttle_key       text        NOT NULL DEFAULT '',
    max_concurrency    integer     CHECK (max_concurrency IS NULL OR max_concurrency > 0),
    workflow           text        NOT NULL,
    enabled            boolean     NOT NULL DEFAULT true,
    version            integer     NOT NULL DEFAULT 1,
    deleted_at         timestamptz,
    created_at         timestamptz NOT NULL DEFAULT now(),
    updated_at         timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX workflow_triggers_match_idx ON workflow_triggers (source, event_type) WHERE deleted_at IS NULL;

CREATE TABLE workflow_trigger_versions (
    trigger_id text        NOT NULL REFERENCES workflow_triggers (trigger_id) ON DELETE CASCADE,
    version    integer     NOT NULL,
    definition jsonb       NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (trigger_id, version)
);

-- status: launched, filtered, throttled, concurrency_limited, cancelled,
-- exhausted. retry_state: none, scheduled, due, completed, cancelled,
-- exhausted.
CREATE TABLE workflow_trigger_deliveries (
    delivery_id     text        PRIMARY KEY,
    trigger_id      text        NOT NULL,
    trigger_version integer     NOT NULL,
    event_id        text        NOT NULL,
    source          text        NOT NULL,
    event_type      text        NOT NULL,
    throttle_key    text        NOT NULL DEFAULT '',
    status          text        NOT NULL,
    run_id          text,
    retry_state     text        NOT NULL DEFAULT 'none',
    next_attempt_at timestamptz,
    retry_attempts  integer     NOT NULL DEFAULT 0,
    retry_metadata  jsonb       NOT NULL DEFAULT '{}',
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    launched_at     timestamptz,
    UNIQUE (event_id, trigger_id)
);
CREATE UNIQUE INDEX workflow_trigger_deliveries_run_idx ON workflow_trigger_deliveries (run_id) WHERE run_id IS NOT NULL;
CREATE INDEX workflow_trigger_deliveries_throttle_idx ON workflow_trigger_deliveries (trigger_id, throttle_key, launched_at) WHERE status = 'launched';
CREATE INDEX workflow_trigger_deliveries_retry_idx ON workflow_trigger_deliveries (retry_state, next_attempt_at);

-- Workflow runs launched by deliveries (one per delivery) and their steps.
-- status: requested, running, completed, failed.
CREATE TABLE workflow_runs (
    run_id       text        PRIMARY KEY,
    workflow     text        NOT NULL,
    delivery_id  text        UNIQUE,
    trigger_id   text,
    event_id     text,
    status       text        NOT NULL DEFAULT 'requested',
    error        text        NOT NULL DEFAULT '',
    requested_at timestamptz NOT NULL DEFAULT now(),
    finished_at  timestamptz,
    updated_at   timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX workflow_runs_inflight_idx ON workflow_runs (trigger_id) WHERE status IN ('requested', 'running');

CREATE TABLE workflow_run_steps (
    run_id          text        NOT NULL REFERENCES workflow_runs (run_id) ON DELETE CASCADE,
    step_id         text        NOT NULL,
    status          text        NOT NULL DEFAULT 'in_progress',
    retry_state     text        NOT NULL DEFAULT 'none',
    next_attempt_at timestamptz,
    retry_attempts  integer     NOT NULL DEFAULT 0,
    retry_metadata  jsonb       NOT NULL DEFAULT '{}',
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (run_id, step_id)
);

-- Jobs done by workers, with the statuses and fields job-queue users know.
-- status: in_progress, completed, failed, retrying, failed_max_retries,
-- cancelled.
CREATE TABLE jobs (
    job_id               text        PRIMARY KEY,
    job_type             text        NOT NULL,
    status               text        NOT NULL DEFAULT 'in_progress',
    retry_count          integer     NOT NULL DEFAULT 0,
    max_retries          integer,
    retry_enabled        boolean     NOT NULL DEFAULT true,
    attempt              integer     NOT NULL DEFAULT 1,
    current_step         text        NOT NULL DEFAULT '',
    last_error_message   text        NOT NULL DEFAULT '',
    last_error_class     text        NOT NULL DEFAULT '',
    last_error_timestamp timestamptz,
    last_attempt_at      timestamptz,
    next_retry_at        timestamptz,
    created_at           timestamptz NOT NULL DEFAULT now(),
    updated_at           timestamptz NOT NULL DEFAULT now(),
    completed_at         timestamptz
);
CREATE INDEX jobs_status_idx ON jobs (job_type, status);
CREATE INDEX jobs_next_retry_idx ON jobs (next_retry_at) WHERE status = 'retrying';

-- +goose Down
DROP TABLE IF EXISTS jobs;
DROP TABLE IF EXISTS workflow_run_steps;
DROP TABLE IF EXISTS workflow_runs;
DROP TABLE IF EXISTS workflow_trigger_deliveries;
DROP TABLE IF EXISTS workflow_trigger_versions;
DROP TABLE IF EXISTS workflow_triggers;
DROP TABLE IF EXISTS event_ingress_retries;
DROP TABLE IF EXISTS event_source_windows;
DROP TABLE IF EXISTS event_sources;
DROP TABLE IF EXISTS workflow_events;
DROP TABLE IF EXISTS inbox;
DROP TABLE IF EXISTS outbox;
DROP TABLE IF EXISTS retry_history;
DROP TABLE IF EXISTS retries;
DROP TABLE IF EXISTS retry_policy_versions;
DROP TABLE IF EXISTS retry_policies;
