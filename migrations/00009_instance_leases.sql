-- instance:<HERMES_INSTANCE> leases: a running dispatcher holds its instance's, so that a
-- second one started under the same name refuses to start (it would adopt and remove the
-- first's containers), and a runtime can tell a live instance's containers from a dead one's.
-- +goose Up
ALTER TABLE leases DROP CONSTRAINT leases_key_check;
ALTER TABLE leases ADD CONSTRAINT leases_key_check CHECK (key ~ '^(session|home|org|instance):[A-Za-z0-9._-]{1,200}$');

-- +goose Down
DELETE FROM leases WHERE key LIKE 'instance:%';
ALTER TABLE leases DROP CONSTRAINT leases_key_check;
ALTER TABLE leases ADD CONSTRAINT leases_key_check CHECK (key ~ '^(session|home|org):[A-Za-z0-9._-]{1,200}$');
