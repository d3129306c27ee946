-- Org dashboards: the launcher (which holds no runtime) asks for one by making its row
-- requested, and the store notifies hermes_dashboards with the org in the same statement;
-- the dispatcher that owns the org starts it, records where it answers and stops it when
-- idle. One row per org, kept across runs, so the table stays as small as the org list and
-- needs no index beyond its key.
-- +goose Up
CREATE TABLE dashboards (
    org          text PRIMARY KEY CHECK (org ~ '^[a-z0-9][a-z0-9-]{0,62}$'),
    state        text NOT NULL CHECK (state IN ('requested', 'starting', 'running', 'failed', 'stopped')),
    -- where the running dashboard answers (loopback, for the launcher's proxy)
    url          text,
    -- the dispatcher instance that starts or runs it (kept on failed and stopped rows, for
    -- the record; a request clears it)
    instance     text,
    -- why it failed, shown to the operator; never a secret
    error        text,
    requested_by text,
    requested_at timestamptz NOT NULL DEFAULT now(),
    updated_at   timestamptz NOT NULL DEFAULT now(),
    started_at   timestamptz,
    -- the launcher's last proxied use; the idle timeout counts from it
    last_seen_at timestamptz,
    CHECK ((url IS NOT NULL) = (state = 'running')),
    CHECK (instance IS NOT NULL OR state NOT IN ('starting', 'running'))
);

-- +goose Down
DROP TABLE dashboards;
