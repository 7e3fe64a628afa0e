-- The durable workflow agent delivery machine.

-- The database clock is the authority. lp_now() is the only clock every
-- statement reads: the transaction timestamp, unless an operator (or a
-- test) has pinned the clock in lp_clock. Production leaves the table
-- empty; tests pin it, and run exactly the statements production runs.
CREATE TABLE lp_clock (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    pinned_at timestamptz NOT NULL
);

CREATE FUNCTION lp_now() RETURNS timestamptz
LANGUAGE sql STABLE AS $$
    SELECT coalesce((SELECT pinned_at FROM lp_clock), now())
$$;

CREATE TYPE community_state AS ENUM ('active', 'quiescing', 'fenced', 'deleted');

CREATE TABLE communities (
    id uuid PRIMARY KEY,
    state community_state NOT NULL DEFAULT 'active'
);

-- The community write fence, enforced by the database itself: rows of a
-- community that is not active accept no insert, update or delete. The one
-- exception is the purge of a deleted community.
CREATE FUNCTION lp_community_write_fence() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    target uuid := CASE WHEN TG_OP = 'DELETE' THEN OLD.community_id ELSE NEW.community_id END;
    current community_state;
BEGIN
    SELECT state INTO current FROM communities WHERE id = target;
    IF current = 'active' OR (TG_OP = 'DELETE' AND current = 'deleted') THEN
        RETURN CASE WHEN TG_OP = 'DELETE' THEN OLD ELSE NEW END;
    END IF;
    RAISE EXCEPTION 'community % is not writable', target
        USING ERRCODE = 'LP001', DETAIL = coalesce(current::text, 'unknown'), TABLE = TG_TABLE_NAME;
END
$$;

CREATE TABLE workflows (
    community_id uuid NOT NULL REFERENCES communities ON DELETE CASCADE,
    id uuid NOT NULL,
    PRIMARY KEY (community_id, id)
);

CREATE TABLE workflow_runs (
    community_id uuid NOT NULL,
    workflow_id uuid NOT NULL,
    id uuid NOT NULL,
    PRIMARY KEY (community_id, id),
    UNIQUE (community_id, workflow_id, id),
    FOREIGN KEY (community_id, workflow_id) REFERENCES workflows ON DELETE CASCADE
);

CREATE TABLE events (
    community_id uuid NOT NULL REFERENCES communities ON DELETE CASCADE,
    id bytea NOT NULL CHECK (octet_length(id) = 32),
    PRIMARY KEY (community_id, id)
);

CREATE TYPE delivery_status AS ENUM ('pending', 'claimed', 'finished', 'failed');
CREATE TYPE delivery_cause_kind AS ENUM ('event', 'schedule', 'webhook');

CREATE TABLE workflow_agent_deliveries (
    community_id uuid NOT NULL,
    id uuid NOT NULL,
    workflow_id uuid NOT NULL,
    run_id uuid NOT NULL,
    step_id text NOT NULL
        CHECK (btrim(step_id, E' \t\n\r\f\v') <> '' AND char_length(step_id) <= 64),
    target_pubkey bytea NOT NULL CHECK (octet_length(target_pubkey) = 32),
    definition_event_id bytea NOT NULL CHECK (octet_length(definition_event_id) = 32),
    message_event_id bytea NOT NULL CHECK (octet_length(message_event_id) = 32),
    -- The cause, decomposed: its kind and exactly the one identity column
    -- that kind uses. Zero, two, or a mismatched column cannot be stored.
    cause_kind delivery_cause_kind NOT NULL,
    cause_event_id bytea CHECK (octet_length(cause_event_id) = 32),
    cause_scheduled_for timestamptz
        CHECK (cause_scheduled_for = date_trunc('second', cause_scheduled_for)),
    cause_invocation_id uuid,
    CONSTRAINT delivery_cause_exactly_one CHECK (
        (cause_event_id IS NOT NULL)::int
        + (cause_scheduled_for IS NOT NULL)::int
        + (cause_invocation_id IS NOT NULL)::int = 1
        AND CASE cause_kind
            WHEN 'event' THEN cause_event_id IS NOT NULL
            WHEN 'schedule' THEN cause_scheduled_for IS NOT NULL
            WHEN 'webhook' THEN cause_invocation_id IS NOT NULL
        END
    ),
    status delivery_status NOT NULL DEFAULT 'pending',
    lease_generation bigint NOT NULL DEFAULT 0 CHECK (lease_generation >= 0),
    lease_until timestamptz,
    claimed_at timestamptz,
    finished_at timestamptz,
    created_at timestamptz NOT NULL,
    CONSTRAINT delivery_lease_iff_claimed CHECK (
        (status = 'claimed') = (lease_until IS NOT NULL)
        AND (status = 'claimed') = (claimed_at IS NOT NULL)
        AND (status <> 'claimed' OR lease_generation >= 1)
    ),
    CONSTRAINT delivery_finished_iff_terminal CHECK (
        (status IN ('finished', 'failed')) = (finished_at IS NOT NULL)
    ),
    PRIMARY KEY (community_id, id),
    CONSTRAINT delivery_identity UNIQUE (community_id, run_id, step_id, target_pubkey),
    FOREIGN KEY (community_id, workflow_id, run_id)
        REFERENCES workflow_runs (community_id, workflow_id, id) ON DELETE CASCADE,
    FOREIGN KEY (community_id, message_event_id) REFERENCES events ON DELETE CASCADE
);

-- Ids of deleted deliveries, never reused within their community: a
-- generation restarts with each row, so a lease on a deleted row must not
-- meet a new row under the same id. A purged community forgets them (its
-- tombstone refuses every write).
CREATE TABLE retired_delivery_ids (
    community_id uuid NOT NULL REFERENCES communities ON DELETE CASCADE,
    id uuid NOT NULL,
    PRIMARY KEY (community_id, id)
);

CREATE FUNCTION lp_retire_delivery_id() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF (SELECT state FROM communities WHERE id = OLD.community_id) IS DISTINCT FROM 'deleted' THEN
        INSERT INTO retired_delivery_ids (community_id, id) VALUES (OLD.community_id, OLD.id)
        ON CONFLICT DO NOTHING;
    END IF;
    RETURN OLD;
END
$$;

CREATE TRIGGER workflow_agent_deliveries_retire AFTER DELETE ON workflow_agent_deliveries
    FOR EACH ROW EXECUTE FUNCTION lp_retire_delivery_id();

-- The claim path: oldest pending row of one (community, target).
CREATE INDEX workflow_agent_deliveries_claim
    ON workflow_agent_deliveries (community_id, target_pubkey, created_at, id)
    WHERE status = 'pending';

-- The reap path: claimed rows by deadline.
CREATE INDEX workflow_agent_deliveries_reap
    ON workflow_agent_deliveries (lease_until)
    WHERE status = 'claimed';

-- The cascade paths from runs and events.
CREATE INDEX workflow_agent_deliveries_run
    ON workflow_agent_deliveries (community_id, workflow_id, run_id);
CREATE INDEX workflow_agent_deliveries_message
    ON workflow_agent_deliveries (community_id, message_event_id);

CREATE TRIGGER workflows_write_fence BEFORE INSERT OR UPDATE OR DELETE ON workflows
    FOR EACH ROW EXECUTE FUNCTION lp_community_write_fence();
CREATE TRIGGER workflow_runs_write_fence BEFORE INSERT OR UPDATE OR DELETE ON workflow_runs
    FOR EACH ROW EXECUTE FUNCTION lp_community_write_fence();
CREATE TRIGGER events_write_fence BEFORE INSERT OR UPDATE OR DELETE ON events
    FOR EACH ROW EXECUTE FUNCTION lp_community_write_fence();
CREATE TRIGGER workflow_agent_deliveries_write_fence
    BEFORE INSERT OR UPDATE OR DELETE ON workflow_agent_deliveries
    FOR EACH ROW EXECUTE FUNCTION lp_community_write_fence();
