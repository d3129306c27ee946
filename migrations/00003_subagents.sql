-- Subagent handles: one row per child an agent starts (Hermes' subagent_start and
-- subagent_stop hooks reach them through the control API), and each child's mailbox.
-- Ids are Hermes' own and unique only within an org, so the org is part of every key:
-- one org's caller can never name another org's child.
-- +goose Up
CREATE TABLE subagents (
    org             text NOT NULL,
    id              text NOT NULL,
    job_id          text,
    session_id      text,
    parent_session  text,
    parent_subagent text,
    goal            text NOT NULL,
    role            text NOT NULL DEFAULT '',
    status          text NOT NULL CHECK (status IN ('running', 'done', 'failed', 'cancelling', 'cancelled')),
    summary         text NOT NULL DEFAULT '',
    -- who asked for a cancel, and why
    cancelled_by    text,
    cancel_reason   text,
    started_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    ended_at        timestamptz,
    PRIMARY KEY (org, id),
    CHECK ((ended_at IS NULL) = (status IN ('running', 'cancelling')))
);
CREATE INDEX subagents_org_started_idx ON subagents (org, started_at DESC, id DESC);
-- a job's live children, failed together when its worker dies
CREATE INDEX subagents_live_job_idx ON subagents (org, job_id) WHERE status IN ('running', 'cancelling');

-- A message stays in the mailbox until the child acknowledges it; every drain hands out
-- all unacknowledged ones again, and the child drops the ids it has seen.
CREATE TABLE subagent_messages (
    id           bigserial PRIMARY KEY,
    org          text NOT NULL,
    subagent_id  text NOT NULL,
    sender       text NOT NULL,
    body         text NOT NULL,
    sent_at      timestamptz NOT NULL DEFAULT now(),
    deliveries   int NOT NULL DEFAULT 0,
    delivered_at timestamptz,
    acked_at     timestamptz,
    FOREIGN KEY (org, subagent_id) REFERENCES subagents (org, id) ON DELETE CASCADE
);
CREATE INDEX subagent_messages_box_idx ON subagent_messages (org, subagent_id, id);

-- +goose Down
DROP TABLE subagent_messages;
DROP TABLE subagents;
