-- Operator accounts and their per-org grants: who may open which org's dashboard through
-- the launcher. Passwords are kept only as bcrypt hashes. Every change is an event row.
-- The launcher's login sessions live here too.
-- +goose Up
CREATE TABLE operators (
    name          text PRIMARY KEY CHECK (name ~ '^[a-z0-9][a-z0-9._-]{0,63}$'),
    password_hash text NOT NULL CHECK (password_hash LIKE '$2%'),
    -- a disabled operator cannot log in; the account and its grants are kept
    disabled_at   timestamptz,
    created_at    timestamptz NOT NULL DEFAULT now(),
    password_at   timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE operator_grants (
    operator   text NOT NULL REFERENCES operators (name) ON DELETE CASCADE,
    org        text NOT NULL CHECK (org ~ '^[a-z0-9][a-z0-9-]{0,62}$'),
    granted_by text NOT NULL,
    granted_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (operator, org)
);
CREATE INDEX operator_grants_org_idx ON operator_grants (org);

CREATE TABLE operator_events (
    id       bigserial PRIMARY KEY,
    operator text NOT NULL,
    kind     text NOT NULL CHECK (kind IN ('add', 'password', 'disable', 'enable', 'remove', 'grant', 'revoke', 'login', 'login_refused')),
    org      text,
    actor    text NOT NULL,
    at       timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX operator_events_operator_idx ON operator_events (operator, id);

-- The launcher's login sessions (scs's pgxstore names the table and its columns).
CREATE TABLE sessions (
    token  text PRIMARY KEY,
    data   bytea NOT NULL,
    expiry timestamptz NOT NULL
);
CREATE INDEX sessions_expiry_idx ON sessions (expiry);

-- +goose Down
DROP TABLE sessions;
DROP TABLE operator_events;
DROP TABLE operator_grants;
DROP TABLE operators;
