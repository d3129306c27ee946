-- The dispatcher's durable record: one row per claim or re-claim, and the job mirror the UIs
-- read instead of the backend (they hold no backend token).
-- +goose Up
CREATE TABLE claim_attempts (
    id          bigserial PRIMARY KEY,
    job_id      text NOT NULL,
    org         text NOT NULL,
    attempt     int NOT NULL CHECK (attempt > 0),
    instance    text NOT NULL,
    kind        text NOT NULL CHECK (kind IN ('claim', 'reclaim')),
    claimed_at  timestamptz NOT NULL DEFAULT now(),
    outcome     text,
    reason      text,
    finished_at timestamptz,
    UNIQUE (job_id, attempt)
);
CREATE INDEX claim_attempts_org_idx ON claim_attempts (org, claimed_at DESC);

CREATE TABLE mirror_jobs (
    job_id     text PRIMARY KEY,
    org        text NOT NULL,
    type       text NOT NULL,
    status     text NOT NULL,
    attempt    int NOT NULL,
    result     jsonb,
    error      text,
    updated_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX mirror_jobs_org_idx ON mirror_jobs (org, updated_at DESC);

CREATE TABLE mirror_job_events (
    id      bigserial PRIMARY KEY,
    job_id  text NOT NULL REFERENCES mirror_jobs (job_id),
    attempt int NOT NULL,
    kind    text NOT NULL,
    data    jsonb NOT NULL DEFAULT '{}',
    at      timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX mirror_job_events_job_idx ON mirror_job_events (job_id, id);

-- +goose Down
DROP TABLE mirror_job_events;
DROP TABLE mirror_jobs;
DROP TABLE claim_attempts;
