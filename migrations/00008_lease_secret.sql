-- A holding's secret: Acquire hands the holder a random secret and keeps only its SHA-256
-- here; Refresh and Release need it, so a process that only read the key, the holder and
-- the epoch (with the org's control key, say) cannot end or extend the holding. Holdings
-- taken before this migration have none, and are refreshed and released as before until
-- they end. Force release needs no secret: it is an operator's, recorded with its actor.
-- +goose Up
ALTER TABLE leases ADD COLUMN secret_hash bytea;

-- +goose Down
ALTER TABLE leases DROP COLUMN secret_hash;
