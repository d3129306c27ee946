-- Turn leases: who owns a session, a home or an organization, fenced by an epoch that
-- only grows. Rows are kept on release so the epoch is never reset.
-- +goose Up
CREATE TABLE leases (
    key         text PRIMARY KEY CHECK (key ~ '^(session|home|org):[A-Za-z0-9._-]{1,200}$'),
    holder      text CHECK (holder IS NULL OR length(holder) BETWEEN 1 AND 200),
    epoch       bigint NOT NULL CHECK (epoch > 0),
    acquired_at timestamptz,
    expires_at  timestamptz,
    -- the holder this lease was last taken from after it expired, for the takeover event
    taken_from  text,
    -- someone waits for this key until then: a release notifies only when someone waits
    waiting_until timestamptz,
    updated_at  timestamptz NOT NULL DEFAULT now(),
    CHECK ((holder IS NULL) = (expires_at IS NULL))
) WITH (fillfactor = 50);
-- No index beyond the key: updates stay heap-only (HOT), which is most of a lease's cost;
-- the sweeper's scan of a table of one row per key is cheap.

-- Every acquire, takeover, refresh, release, expiry and forced release.
CREATE TABLE lease_events (
    id              bigserial,
    key             text NOT NULL,
    kind            text NOT NULL CHECK (kind IN ('acquire', 'takeover', 'refresh', 'release', 'expire', 'force_release')),
    holder          text NOT NULL,
    epoch           bigint NOT NULL,
    -- takeover: whose expired lease was taken
    previous_holder text,
    -- force_release: who forced it, and why
    actor           text,
    reason          text,
    at              timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (key, id)
);

-- +goose Down
DROP TABLE lease_events;
DROP TABLE leases;
