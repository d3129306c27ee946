-- The reference Sartiq backend's tables. Times are written by the server's clock (passed
-- as parameters, never now()), so tests can move time forward without sleeping.
-- +goose Up
CREATE TABLE organizations (
    id         text PRIMARY KEY CHECK (id ~ '^[a-z0-9][a-z0-9-]{0,62}$'),
    name       text NOT NULL,
    created_at timestamptz NOT NULL
);

-- One row per job. The live job token is the one whose hash is token_hash: claim and
-- re-claim replace it and terminal transitions clear it in the same statement as the
-- status change, so a superseded token can never match again.
CREATE TABLE agent_jobs (
    id                uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    type              text NOT NULL CHECK (type IN ('product_ingest', 'guidelines_extraction')),
    organization_id   text NOT NULL REFERENCES organizations (id),
    status            text NOT NULL DEFAULT 'QUEUED'
                      CHECK (status IN ('QUEUED', 'CLAIMED', 'RUNNING', 'COMPLETED', 'FAILED')),
    attempt           integer NOT NULL DEFAULT 0 CHECK (attempt >= 0),
    manifest          jsonb NOT NULL,
    seed_key          text UNIQUE,
    created_at        timestamptz NOT NULL,
    claimed_at        timestamptz,
    last_heartbeat_at timestamptz,
    finished_at       timestamptz,
    progress          jsonb,
    result            jsonb,
    error             text,
    token_hash        bytea,
    token_expires_at  timestamptz,
    CHECK ((token_hash IS NULL) = (token_expires_at IS NULL)),
    CHECK ((status IN ('CLAIMED', 'RUNNING')) = (token_hash IS NOT NULL))
);
CREATE INDEX agent_jobs_list_idx ON agent_jobs (type, status, created_at, id);

-- Every job token ever minted, so that a superseded token is recognised as revoked (409)
-- rather than unknown (401). Which token is live is decided by agent_jobs.token_hash.
CREATE TABLE job_tokens (
    hash            bytea PRIMARY KEY,
    job_id          uuid NOT NULL REFERENCES agent_jobs (id),
    organization_id text NOT NULL,
    capability      text NOT NULL,
    attempt         integer NOT NULL,
    issued_at       timestamptz NOT NULL,
    revoked_at      timestamptz,
    revoked_reason  text
);
CREATE INDEX job_tokens_job_idx ON job_tokens (job_id) WHERE revoked_at IS NULL;

-- The job's log: every transition and every event a worker adds. Attempts are counted here.
CREATE TABLE agent_job_events (
    id      bigserial PRIMARY KEY,
    job_id  uuid NOT NULL REFERENCES agent_jobs (id),
    attempt integer NOT NULL,
    kind    text NOT NULL,
    message text NOT NULL DEFAULT '',
    data    jsonb,
    at      timestamptz NOT NULL
);
CREATE INDEX agent_job_events_job_idx ON agent_job_events (job_id, id);

CREATE TABLE products (
    id              uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    organization_id text NOT NULL REFERENCES organizations (id),
    sku             text NOT NULL,
    name            text NOT NULL,
    description     text NOT NULL DEFAULT '',
    attributes      jsonb NOT NULL DEFAULT '{}',
    created_at      timestamptz NOT NULL,
    UNIQUE (organization_id, sku)
);

-- Write surfaces: what agents propose, awaiting a person's review. A job proposing the
-- same SKU (or the same guidelines category) again replaces its own earlier proposal and
-- bumps its revision, so a resumed or re-claimed run is idempotent.
CREATE TABLE product_proposals (
    id              uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    organization_id text NOT NULL REFERENCES organizations (id),
    job_id          uuid NOT NULL REFERENCES agent_jobs (id),
    attempt         integer NOT NULL,
    sku             text NOT NULL,
    name            text NOT NULL,
    description     text NOT NULL DEFAULT '',
    attributes      jsonb NOT NULL DEFAULT '{}',
    status          text NOT NULL DEFAULT 'pending_review' CHECK (status IN ('pending_review', 'accepted', 'rejected')),
    revision        integer NOT NULL DEFAULT 1,
    created_at      timestamptz NOT NULL,
    updated_at      timestamptz NOT NULL,
    UNIQUE (job_id, sku)
);

CREATE TABLE guidelines_proposals (
    id              uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    organization_id text NOT NULL REFERENCES organizations (id),
    job_id          uuid NOT NULL REFERENCES agent_jobs (id),
    attempt         integer NOT NULL,
    category        text NOT NULL CHECK (category ~ '^[a-z0-9][a-z0-9-]{0,62}$'),
    content         text NOT NULL,
    sources         jsonb NOT NULL DEFAULT '[]',
    status          text NOT NULL DEFAULT 'pending_review' CHECK (status IN ('pending_review', 'accepted', 'rejected')),
    revision        integer NOT NULL DEFAULT 1,
    created_at      timestamptz NOT NULL,
    updated_at      timestamptz NOT NULL,
    UNIQUE (job_id, category)
);

-- Presigned upload slots: the random key in the URL is the credential (stored hashed).
CREATE TABLE uploads (
    key_hash        bytea PRIMARY KEY,
    organization_id text NOT NULL,
    job_id          uuid NOT NULL REFERENCES agent_jobs (id),
    filename        text NOT NULL,
    content_type    text NOT NULL,
    max_bytes       bigint NOT NULL,
    expires_at      timestamptz NOT NULL,
    size            bigint,
    sha256          text,
    data            bytea,
    uploaded_at     timestamptz
);

-- +goose Down
DROP TABLE uploads;
DROP TABLE guidelines_proposals;
DROP TABLE product_proposals;
DROP TABLE products;
DROP TABLE agent_job_events;
DROP TABLE job_tokens;
DROP TABLE agent_jobs;
DROP TABLE organizations;
