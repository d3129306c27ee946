-- Every lease event notifies its organization's watchers (a dashboard's leases page, through
-- the control API's GET /v1/leases/changes): on the schema's channel, with the org the key
-- belongs to (home:<org>, session:<org>.<id>, org:<org>) as the payload.
-- +goose Up
-- +goose StatementBegin
CREATE FUNCTION lease_event_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('hermes_lease_events_' || left(current_setting('search_path'), 40),
                      split_part(split_part(NEW.key, ':', 2), '.', 1));
    RETURN NULL;
END
$$;
-- +goose StatementEnd
CREATE TRIGGER lease_events_notify AFTER INSERT ON lease_events FOR EACH ROW EXECUTE FUNCTION lease_event_notify();

-- +goose Down
DROP TRIGGER lease_events_notify ON lease_events;
DROP FUNCTION lease_event_notify();
