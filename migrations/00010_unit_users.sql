-- Each org's own uid (UNIT_UIDS): its units run as it, and its home and workspaces are
-- its. Allocated once from the configured range by whichever dispatcher first starts a
-- unit of the org, and kept, so that every replica gives an org the same uid and no two
-- orgs share one.
-- +goose Up
CREATE TABLE unit_users (
    org        text PRIMARY KEY,
    uid        integer NOT NULL UNIQUE CHECK (uid > 0 AND uid <> 65534),
    created_at timestamptz NOT NULL DEFAULT now()
);

-- +goose Down
DROP TABLE unit_users;
