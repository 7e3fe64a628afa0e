-- The workflow definition lifecycle and atomic run admission.

-- Members with active authority in a channel.
CREATE TABLE channel_authority (
    community_id uuid NOT NULL REFERENCES communities ON DELETE CASCADE,
    channel_id uuid NOT NULL,
    member bytea NOT NULL CHECK (octet_length(member) = 32),
    PRIMARY KEY (community_id, channel_id, member)
);

-- The signed head of each coordinate (community, workflow UUID).
CREATE TABLE definition_heads (
    community_id uuid NOT NULL REFERENCES communities ON DELETE CASCADE,
    workflow_id uuid NOT NULL,
    event_id bytea NOT NULL CHECK (octet_length(event_id) = 32),
    author bytea NOT NULL CHECK (octet_length(author) = 32),
    channel_id uuid NOT NULL,
    created_at timestamptz NOT NULL,
    actions text[] NOT NULL CHECK (cardinality(actions) BETWEEN 1 AND 8),
    enabled boolean,  -- as signed: NULL means omitted, which projects as enabled
    hash bytea NOT NULL CHECK (octet_length(hash) = 32),
    PRIMARY KEY (community_id, workflow_id)
);

-- The runtime projection of each head; a row exists exactly while its head does.
CREATE TABLE definition_runtime (
    community_id uuid NOT NULL,
    workflow_id uuid NOT NULL,
    owner bytea NOT NULL CHECK (octet_length(owner) = 32),
    channel_id uuid NOT NULL,
    hash bytea NOT NULL CHECK (octet_length(hash) = 32),
    enabled boolean NOT NULL,
    incarnation timestamptz NOT NULL,
    actions text[] NOT NULL CHECK (cardinality(actions) BETWEEN 1 AND 8),
    revision bytea NOT NULL CHECK (octet_length(revision) = 32),  -- the head's event id
    PRIMARY KEY (community_id, workflow_id),
    FOREIGN KEY (community_id, workflow_id) REFERENCES definition_heads ON DELETE CASCADE
);

-- Head and runtime are both present or both absent, checked at commit.
CREATE FUNCTION lp_head_runtime_together() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    c uuid := CASE WHEN TG_OP = 'DELETE' THEN OLD.community_id ELSE NEW.community_id END;
    w uuid := CASE WHEN TG_OP = 'DELETE' THEN OLD.workflow_id ELSE NEW.workflow_id END;
BEGIN
    IF EXISTS (SELECT 1 FROM definition_heads WHERE community_id = c AND workflow_id = w)
       <> EXISTS (SELECT 1 FROM definition_runtime WHERE community_id = c AND workflow_id = w) THEN
        RAISE EXCEPTION 'head and runtime of (%, %) would split', c, w USING ERRCODE = 'LP002';
    END IF;
    RETURN NULL;
END
$$;

CREATE CONSTRAINT TRIGGER definition_heads_together AFTER INSERT OR DELETE ON definition_heads
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION lp_head_runtime_together();
CREATE CONSTRAINT TRIGGER definition_runtime_together AFTER INSERT OR DELETE ON definition_runtime
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION lp_head_runtime_together();

-- The persistent per-coordinate deletion cutoff.
CREATE TABLE definition_cutoffs (
    community_id uuid NOT NULL REFERENCES communities ON DELETE CASCADE,
    workflow_id uuid NOT NULL,
    cutoff timestamptz NOT NULL,
    PRIMARY KEY (community_id, workflow_id)
);

-- Admitted runs, each pinned to the exact record it was admitted for.
CREATE TABLE admitted_runs (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    community_id uuid NOT NULL REFERENCES communities ON DELETE CASCADE,
    workflow_id uuid NOT NULL,
    door text NOT NULL CHECK (door IN ('event', 'schedule', 'manual', 'webhook')),
    owner bytea NOT NULL,
    channel_id uuid NOT NULL,
    hash bytea NOT NULL,
    enabled boolean NOT NULL,
    incarnation timestamptz NOT NULL,
    actions text[] NOT NULL,
    revision bytea NOT NULL,
    admitted_at timestamptz NOT NULL
);

-- The action sink: every action executed, in order.
CREATE TABLE executed_actions (
    seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    run_id bigint NOT NULL REFERENCES admitted_runs ON DELETE CASCADE,
    action text NOT NULL
);

CREATE TRIGGER channel_authority_write_fence BEFORE INSERT OR UPDATE OR DELETE ON channel_authority
    FOR EACH ROW EXECUTE FUNCTION lp_community_write_fence();
CREATE TRIGGER definition_heads_write_fence BEFORE INSERT OR UPDATE OR DELETE ON definition_heads
    FOR EACH ROW EXECUTE FUNCTION lp_community_write_fence();
CREATE TRIGGER definition_cutoffs_write_fence BEFORE INSERT OR UPDATE OR DELETE ON definition_cutoffs
    FOR EACH ROW EXECUTE FUNCTION lp_community_write_fence();
CREATE TRIGGER admitted_runs_write_fence BEFORE INSERT OR UPDATE OR DELETE ON admitted_runs
    FOR EACH ROW EXECUTE FUNCTION lp_community_write_fence();
CREATE TRIGGER definition_runtime_write_fence BEFORE INSERT OR UPDATE OR DELETE ON definition_runtime
    FOR EACH ROW EXECUTE FUNCTION lp_community_write_fence();
