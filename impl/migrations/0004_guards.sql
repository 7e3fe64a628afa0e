-- The database guards its own invariants, whoever writes: the clock
-- authority, the delivery row's transitions, retired ids and community
-- tombstones. Before this, a role with ordinary DML grants (and the owner)
-- could pin the clock back and revive an expired lease, lower a generation,
-- flip a terminal, settle an unclaimed row, rewrite a binding, reuse a
-- retired id or revive a deleted community. No statement the stores run is
-- refused: each of them already keeps these invariants (the conformance
-- checks prove it); the guards make the database refuse any other writer.
--
-- Every refusal raises SQLSTATE LP003 (a transition or a row the machine
-- never makes) or LP004 (the clock), with the constraint it breaks as the
-- error's constraint name.

-- ---------------------------------------------------------------------------
-- Test hooks: a database-level setting, not a session one.
--
-- A test database is one whose owner (or a superuser) has run
--     ALTER DATABASE <name> SET leaseproof.test_hooks = on
-- (impl/hooks/clock.py: mark_test_database). Only there does lp_now() honour
-- a pinned clock, may lp_clock be written, and may a community's tombstone be
-- deleted (the test adapters' reset). The setting is read from
-- pg_db_role_setting, the catalog ALTER DATABASE writes, and only its
-- database-wide entry (setrole = 0) counts: a session's SET, or ALTER ROLE
-- ... SET (which a role may run for itself), changes nothing here.
CREATE FUNCTION lp_test_hooks() RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT EXISTS (
        SELECT 1 FROM pg_catalog.pg_db_role_setting s
        JOIN pg_catalog.pg_database d ON d.oid = s.setdatabase
        WHERE d.datname = pg_catalog.current_database() AND s.setrole = 0
          AND 'leaseproof.test_hooks=on' = ANY (s.setconfig))
$$;

-- The clock: the transaction time, unless this is a test database and the
-- clock is pinned. A pinned row in any other database is ignored.
CREATE OR REPLACE FUNCTION lp_now() RETURNS timestamptz
LANGUAGE sql STABLE AS $$
    SELECT coalesce((SELECT pinned_at FROM lp_clock WHERE lp_test_hooks()), now())
$$;

-- Only the database's owner (or a member of its role, or a superuser) moves
-- the pinned clock, and only in a test database.
CREATE FUNCTION lp_clock_guard() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NOT lp_test_hooks() THEN
        RAISE EXCEPTION 'the clock cannot be pinned in this database: lp_now() is the transaction time'
            USING ERRCODE = 'LP004', CONSTRAINT = 'lp_clock_test_database_only', TABLE = TG_TABLE_NAME,
                  HINT = 'a test database is marked by its owner: ALTER DATABASE ... SET leaseproof.test_hooks = on';
    END IF;
    IF NOT pg_catalog.pg_has_role(current_user,
            (SELECT datdba FROM pg_catalog.pg_database WHERE datname = pg_catalog.current_database()), 'MEMBER') THEN
        RAISE EXCEPTION 'only the owner of the database moves its pinned clock, not %', current_user
            USING ERRCODE = 'LP004', CONSTRAINT = 'lp_clock_owner_only', TABLE = TG_TABLE_NAME;
    END IF;
    RETURN CASE WHEN TG_LEVEL = 'STATEMENT' THEN NULL WHEN TG_OP = 'DELETE' THEN OLD ELSE NEW END;
END
$$;

CREATE TRIGGER lp_clock_guard BEFORE INSERT OR UPDATE OR DELETE ON lp_clock
    FOR EACH ROW EXECUTE FUNCTION lp_clock_guard();
CREATE TRIGGER lp_clock_guard_truncate BEFORE TRUNCATE ON lp_clock
    FOR EACH STATEMENT EXECUTE FUNCTION lp_clock_guard();

-- ---------------------------------------------------------------------------
-- Delivery rows.

-- A claim's deadline lies after the claim (leases are positive).
ALTER TABLE workflow_agent_deliveries
    ADD CONSTRAINT delivery_lease_until_after_claimed_at CHECK (lease_until > claimed_at);

-- A row is created pending, at generation 0, at the database's now, under an
-- id its community never retired. Checked after the row's CHECK constraints
-- (an AFTER trigger), and with a fresh snapshot: an insert that waited for a
-- concurrent deletion of the same id (the primary key makes it wait) sees
-- the id that deletion retired.
CREATE FUNCTION lp_delivery_created() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.status <> 'pending' OR NEW.lease_generation <> 0 THEN
        RAISE EXCEPTION 'delivery % is created % at generation %: deliveries are created pending, at generation 0',
                NEW.id, NEW.status, NEW.lease_generation
            USING ERRCODE = 'LP003', CONSTRAINT = 'delivery_created_pending', TABLE = TG_TABLE_NAME;
    END IF;
    IF NEW.created_at IS DISTINCT FROM lp_now() THEN
        RAISE EXCEPTION 'delivery % is created at %, not at the database''s now (%)', NEW.id, NEW.created_at, lp_now()
            USING ERRCODE = 'LP003', CONSTRAINT = 'delivery_created_now', TABLE = TG_TABLE_NAME;
    END IF;
    IF EXISTS (SELECT 1 FROM retired_delivery_ids WHERE community_id = NEW.community_id AND id = NEW.id) THEN
        RAISE EXCEPTION 'delivery id % of community % is retired', NEW.id, NEW.community_id
            USING ERRCODE = 'LP003', CONSTRAINT = 'delivery_id_not_retired', TABLE = TG_TABLE_NAME;
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER workflow_agent_deliveries_created AFTER INSERT ON workflow_agent_deliveries
    FOR EACH ROW EXECUTE FUNCTION lp_delivery_created();

-- A row moves only along the machine's transitions:
--     pending --claim--> claimed --finish--> finished | failed
--     claimed --reap--> pending,  claimed --renew--> claimed
-- Its binding, id and created_at never change; its generation never
-- decreases; a terminal row never changes again; nothing settles a row that
-- was not claimed. (How far a claim or a reap moves the generation, and
-- which holder may renew or settle, are the statements' WHERE clauses, which
-- the conformance checks judge; this states what no writer may ever do.)
-- Named after the write fence so that it fires after it: a fenced tenant's
-- row is refused as fenced first.
CREATE FUNCTION lp_delivery_transition() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF (NEW.community_id, NEW.id, NEW.workflow_id, NEW.run_id, NEW.step_id, NEW.target_pubkey,
        NEW.definition_event_id, NEW.message_event_id, NEW.cause_kind, NEW.cause_event_id,
        NEW.cause_scheduled_for, NEW.cause_invocation_id, NEW.created_at)
       IS DISTINCT FROM
       (OLD.community_id, OLD.id, OLD.workflow_id, OLD.run_id, OLD.step_id, OLD.target_pubkey,
        OLD.definition_event_id, OLD.message_event_id, OLD.cause_kind, OLD.cause_event_id,
        OLD.cause_scheduled_for, OLD.cause_invocation_id, OLD.created_at) THEN
        RAISE EXCEPTION 'the binding, id and created_at of delivery % never change', OLD.id
            USING ERRCODE = 'LP003', CONSTRAINT = 'delivery_binding_immutable', TABLE = TG_TABLE_NAME;
    END IF;
    IF NEW.lease_generation < OLD.lease_generation THEN
        RAISE EXCEPTION 'the generation of delivery % never decreases (% to %)',
                OLD.id, OLD.lease_generation, NEW.lease_generation
            USING ERRCODE = 'LP003', CONSTRAINT = 'delivery_generation_monotone', TABLE = TG_TABLE_NAME;
    END IF;
    IF OLD.status IN ('finished', 'failed') AND NEW IS DISTINCT FROM OLD THEN
        RAISE EXCEPTION 'delivery % is % and never changes again (to %)', OLD.id, OLD.status, NEW.status
            USING ERRCODE = 'LP003', CONSTRAINT = 'delivery_terminal_once', TABLE = TG_TABLE_NAME;
    END IF;
    IF OLD.status = 'pending' AND NEW.status IN ('finished', 'failed') THEN
        RAISE EXCEPTION 'delivery % is pending: only its holder settles it, after a claim', OLD.id
            USING ERRCODE = 'LP003', CONSTRAINT = 'delivery_settled_only_when_claimed', TABLE = TG_TABLE_NAME;
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER workflow_agent_deliveries_write_transition BEFORE UPDATE ON workflow_agent_deliveries
    FOR EACH ROW EXECUTE FUNCTION lp_delivery_transition();

-- ---------------------------------------------------------------------------
-- Retired ids: an id is retired when its row goes, never while it lives, and
-- a retirement is forgotten only with its community's purge.
CREATE FUNCTION lp_retired_delivery_id_guard() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        IF EXISTS (SELECT 1 FROM workflow_agent_deliveries WHERE community_id = NEW.community_id AND id = NEW.id) THEN
            RAISE EXCEPTION 'delivery id % of community % is live: an id is retired when its row is deleted',
                    NEW.id, NEW.community_id
                USING ERRCODE = 'LP003', CONSTRAINT = 'retired_delivery_id_not_live', TABLE = TG_TABLE_NAME;
        END IF;
        RETURN NEW;
    END IF;
    IF (SELECT state FROM communities WHERE id = OLD.community_id) IS DISTINCT FROM 'deleted' THEN
        RAISE EXCEPTION 'retired delivery id % of community % is retired for good', OLD.id, OLD.community_id
            USING ERRCODE = 'LP003', CONSTRAINT = 'retired_delivery_id_kept', TABLE = TG_TABLE_NAME;
    END IF;
    RETURN CASE WHEN TG_OP = 'DELETE' THEN OLD ELSE NEW END;
END
$$;

CREATE TRIGGER retired_delivery_ids_guard BEFORE INSERT OR UPDATE OR DELETE ON retired_delivery_ids
    FOR EACH ROW EXECUTE FUNCTION lp_retired_delivery_id_guard();

-- ---------------------------------------------------------------------------
-- Communities: the write fence of the communities table itself. A deleted
-- community is a tombstone: it never changes state again (no write to its
-- id can ever be admitted), and it is never removed, except by the reset of
-- a test database.
CREATE FUNCTION lp_community_guard() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE' THEN
        IF NEW.id IS DISTINCT FROM OLD.id THEN
            RAISE EXCEPTION 'the id of community % never changes', OLD.id
                USING ERRCODE = 'LP003', CONSTRAINT = 'community_id_immutable', TABLE = TG_TABLE_NAME;
        END IF;
        IF OLD.state = 'deleted' AND NEW.state <> 'deleted' THEN
            RAISE EXCEPTION 'community % is deleted, for good (not %)', OLD.id, NEW.state
                USING ERRCODE = 'LP003', CONSTRAINT = 'community_deleted_for_good', TABLE = TG_TABLE_NAME;
        END IF;
        RETURN NEW;
    END IF;
    IF OLD.state <> 'deleted' OR NOT lp_test_hooks() THEN
        RAISE EXCEPTION 'community % is kept: a deletion leaves its tombstone (state deleted), which only a test database''s reset removes', OLD.id
            USING ERRCODE = 'LP003', CONSTRAINT = 'community_tombstone_kept', TABLE = TG_TABLE_NAME;
    END IF;
    RETURN OLD;
END
$$;

CREATE TRIGGER communities_guard BEFORE UPDATE OR DELETE ON communities
    FOR EACH ROW EXECUTE FUNCTION lp_community_guard();

-- TRUNCATE fires no row trigger: only a test database's tables are emptied so.
CREATE FUNCTION lp_truncate_guard() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NOT lp_test_hooks() THEN
        RAISE EXCEPTION '% is not truncated outside a test database', TG_TABLE_NAME
            USING ERRCODE = 'LP003', CONSTRAINT = 'lp_no_truncate', TABLE = TG_TABLE_NAME;
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER communities_no_truncate BEFORE TRUNCATE ON communities
    FOR EACH STATEMENT EXECUTE FUNCTION lp_truncate_guard();
CREATE TRIGGER workflow_agent_deliveries_no_truncate BEFORE TRUNCATE ON workflow_agent_deliveries
    FOR EACH STATEMENT EXECUTE FUNCTION lp_truncate_guard();
CREATE TRIGGER retired_delivery_ids_no_truncate BEFORE TRUNCATE ON retired_delivery_ids
    FOR EACH STATEMENT EXECUTE FUNCTION lp_truncate_guard();
