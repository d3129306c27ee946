-- Login throttling per (name, client address): refused tries since the last good login
-- from that address, counted before the password is checked (a try reserves its place in
-- the same statement that checks the limit), so parallel tries get no more checks than
-- the limit, and tries from one address never lock the name out from another.
-- +goose Up
CREATE TABLE login_throttle (
    name     text NOT NULL,
    client   text NOT NULL,
    failures integer NOT NULL CHECK (failures >= 0),
    last_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (name, client)
);
CREATE INDEX login_throttle_last_idx ON login_throttle (last_at);

-- +goose Down
DROP TABLE login_throttle;
