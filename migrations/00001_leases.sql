-- Turn leases: who owns a session, a home or an organization, fenced by an epoch that
-- only grows. Rows are kept on release so the epoch is never reset.
-- +goose Up
CREATE TABLE leases (
    key         text PRIMARY KEY CHECK (key ~ '^(session|home|org):[A-Za-z0-9._-]{1,200}$'),
    holder      text CHECK (holder IS NULL OR length(holder) BETWEEN 1 AND 200),
    epoch       bigint NOT NULL CHECK (epoch > 0),
    acquired_at timestamptz,
    expires_at  timestamptz,
    updated_at  timestamptz NOT NULL DEFAULT now(),
    CHECK ((holder IS NULL) = (expires_at IS NULL))
);
CREATE INDEX leases_expires_idx ON leases (expires_at) WHERE holder IS NOT NULL;

-- Every acquire, takeover, refresh, release, expiry and forced release.
CREATE TABLE lease_events (
    id     bigserial PRIMARY KEY,
    key    text NOT NULL,
    kind   text NOT NULL CHECK (kind IN ('acquire', 'takeover', 'refresh', 'release', 'expire', 'force_release')),
    holder text NOT NULL,
    epoch  bigint NOT NULL,
    actor  text,
    at     timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX lease_events_key_idx ON lease_events (key, id);

-- +goose Down
DROP TABLE lease_events;
DROP TABLE leases;
