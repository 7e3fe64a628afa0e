-- The application role's only way in: one function per operation of the model.
--
-- Before this, the application role held INSERT, UPDATE and DELETE on the
-- tables, and the guards of 0004 refused only what no row may ever be. A row
-- of legal shape that the model never produces (a reap that keeps the
-- generation, a lease extended without a renew, a delivery deleted outside a
-- cascade) was accepted, and the guards could be shadowed by a temporary
-- table of the same name. Now:
--
-- * every function runs with a fixed search_path (pg_catalog, public, and the
--   session's temporary schema last), so nothing a session creates replaces
--   what a function reads;
-- * each operation of both machines is one SECURITY DEFINER function, owned
--   by the owner, that checks its arguments against the model's bounds, the
--   caller's scope (lp_role_scope), the community's write fence, and then
--   makes exactly the model's transition; impl/grants.sql gives the
--   application role EXECUTE on these and no privilege on any table;
-- * the clock is read once per operation, after its locks are taken
--   (clock_timestamp()), not at its transaction's or its statement's start: a
--   lease is judged when the operation takes effect; and the operations run at
--   READ COMMITTED only;
-- * the reaper skips, and reports, a community whose fence another session
--   holds, instead of waiting for it; sweeps take turns on a row lock of a
--   table no other role can lock.
--
-- Refusals of the model are answers (the functions' `outcome` column);
-- arguments out of the model's bounds are errors (SQLSTATE 22023, or 23514
-- from a domain), and a caller acting for a community outside its scope is
-- refused with SQLSTATE LP005. Nothing is written in either case.

-- ---------------------------------------------------------------------------
-- Domains: the row shapes a single column states, checked when a value is
-- cast to them (an argument of a function, a value written to a column). A
-- table CHECK constraint is prepared again by every statement that writes the
-- table (about 100 µs for the delivery table's thirteen, measured); a domain's
-- check is prepared once per session.

CREATE DOMAIN lp_key AS bytea CHECK (octet_length(VALUE) = 32);
CREATE DOMAIN lp_step_id AS text
    CHECK (btrim(VALUE, E' \t\n\r\f\x0b') <> '' AND char_length(VALUE) <= 64);
-- Python's str.strip() (the model's) strips every Unicode space; so does this.
CREATE DOMAIN lp_request_key AS text
    CHECK (char_length(VALUE) BETWEEN 1 AND 64 AND VALUE !~ E'^[\t\n\x0b\f\r\u001c-\u001f \u0085\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]|[\t\n\x0b\f\r\u001c-\u001f \u0085\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]$');
-- model/binding.py: LATEST_INSTANT
CREATE DOMAIN lp_instant AS timestamptz CHECK (isfinite(VALUE) AND VALUE <= '9999-01-01 00:00:00+00');
CREATE DOMAIN lp_whole_second AS timestamptz CHECK (VALUE = date_trunc('second', VALUE));
-- model/delivery.py: MAX_LEASE_SECONDS (tests/impl/test_api.py checks they agree)
CREATE DOMAIN lp_lease_seconds AS integer CHECK (VALUE BETWEEN 1 AND 86400);

-- The delivery row's multi-column shape, in one check whose expressions are
-- prepared once per session (a plpgsql function), each rule raising under the
-- constraint name it had as a CHECK.
CREATE FUNCTION lp_delivery_shape(
    status delivery_status, lease_generation bigint, lease_until timestamptz, claimed_at timestamptz,
    finished_at timestamptz, cause_kind delivery_cause_kind, cause_event_id bytea,
    cause_scheduled_for timestamptz, cause_invocation_id uuid, claim_key text
) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, public, pg_temp AS $$
BEGIN
    IF NOT ((status = 'claimed') = (lease_until IS NOT NULL)
            AND (status = 'claimed') = (claimed_at IS NOT NULL)
            AND (status <> 'claimed' OR lease_generation >= 1)) THEN
        RAISE EXCEPTION 'a delivery holds a lease exactly while claimed (status %, generation %)', status, lease_generation
            USING ERRCODE = '23514', CONSTRAINT = 'delivery_lease_iff_claimed';
    END IF;
    IF (status IN ('finished', 'failed')) <> (finished_at IS NOT NULL) THEN
        RAISE EXCEPTION 'a delivery has finished_at exactly while terminal (status %)', status
            USING ERRCODE = '23514', CONSTRAINT = 'delivery_finished_iff_terminal';
    END IF;
    IF lease_until <= claimed_at THEN
        RAISE EXCEPTION 'a lease ends after its claim'
            USING ERRCODE = '23514', CONSTRAINT = 'delivery_lease_until_after_claimed_at';
    END IF;
    IF claim_key IS NOT NULL AND status <> 'claimed' THEN
        RAISE EXCEPTION 'a claim key is kept only while claimed'
            USING ERRCODE = '23514', CONSTRAINT = 'delivery_claim_key_only_while_claimed';
    END IF;
    IF NOT ((cause_event_id IS NOT NULL)::int + (cause_scheduled_for IS NOT NULL)::int
            + (cause_invocation_id IS NOT NULL)::int = 1
            AND CASE cause_kind
                WHEN 'event' THEN cause_event_id IS NOT NULL
                WHEN 'schedule' THEN cause_scheduled_for IS NOT NULL
                WHEN 'webhook' THEN cause_invocation_id IS NOT NULL
            END) THEN
        RAISE EXCEPTION 'a cause of kind % has exactly its own identity column', cause_kind
            USING ERRCODE = '23514', CONSTRAINT = 'delivery_cause_exactly_one';
    END IF;
    RETURN true;
END
$$;

ALTER TABLE workflow_agent_deliveries
    DROP CONSTRAINT workflow_agent_deliveries_step_id_check,
    DROP CONSTRAINT workflow_agent_deliveries_target_pubkey_check,
    DROP CONSTRAINT workflow_agent_deliveries_definition_event_id_check,
    DROP CONSTRAINT workflow_agent_deliveries_message_event_id_check,
    DROP CONSTRAINT workflow_agent_deliveries_cause_event_id_check,
    DROP CONSTRAINT workflow_agent_deliveries_cause_scheduled_for_check,
    DROP CONSTRAINT delivery_cause_exactly_one,
    DROP CONSTRAINT delivery_lease_iff_claimed,
    DROP CONSTRAINT delivery_finished_iff_terminal,
    DROP CONSTRAINT delivery_lease_until_after_claimed_at,
    DROP CONSTRAINT delivery_claim_key_only_while_claimed,
    DROP CONSTRAINT delivery_claim_key_shape;
ALTER TABLE workflow_agent_deliveries
    ALTER COLUMN step_id TYPE lp_step_id,
    ALTER COLUMN target_pubkey TYPE lp_key,
    ALTER COLUMN definition_event_id TYPE lp_key,
    ALTER COLUMN message_event_id TYPE lp_key,
    ALTER COLUMN cause_event_id TYPE lp_key,
    ALTER COLUMN cause_scheduled_for TYPE lp_whole_second,
    ALTER COLUMN claim_key TYPE lp_request_key,
    ADD CONSTRAINT delivery_shape CHECK (lp_delivery_shape(
        status, lease_generation, lease_until, claimed_at, finished_at,
        cause_kind, cause_event_id, cause_scheduled_for, cause_invocation_id, claim_key));

-- Each query of the functions below has one index that serves it, and no
-- other index can: on a table without statistics (a new database, before
-- autovacuum analyzes it) every equality looks equally selective to the
-- planner, and a plan it made while the table was small, and keeps, used an
-- index that matched only the community and scanned every delivery of it
-- (the commit's "does this step exist" took 200 µs at 1,000 deliveries).
-- So the run index goes (the cascades from runs look (run, community) up in
-- the identity index), and no index but the partial ones leads with the
-- community: the primary key, the identity and the message index each lead
-- with the column their lookups name first. The functions that read the table also forbid a
-- sequential scan (SET enable_seqscan = off): a plan made over a few rows
-- must not be one that reads them all.
DROP INDEX workflow_agent_deliveries_run;
DROP INDEX workflow_agent_deliveries_message;
CREATE INDEX workflow_agent_deliveries_message ON workflow_agent_deliveries (message_event_id, community_id);
ALTER TABLE workflow_agent_deliveries
    DROP CONSTRAINT workflow_agent_deliveries_pkey,
    ADD CONSTRAINT workflow_agent_deliveries_pkey PRIMARY KEY (id, community_id),
    DROP CONSTRAINT delivery_identity,
    ADD CONSTRAINT delivery_identity UNIQUE (run_id, step_id, target_pubkey, community_id);

-- ---------------------------------------------------------------------------
-- The clock, and the test mark, with a fixed search_path.

CREATE OR REPLACE FUNCTION lp_test_hooks() RETURNS boolean
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, public, pg_temp AS $$
BEGIN
    RETURN EXISTS (
            SELECT 1 FROM pg_catalog.pg_db_role_setting s
            JOIN pg_catalog.pg_database d ON d.oid = s.setdatabase
            WHERE d.datname = pg_catalog.current_database() AND s.setrole = 0
              AND 'leaseproof.test_hooks=on' = ANY (s.setconfig));
END
$$;

-- (The small helpers of this migration are plpgsql, not sql: a sql function that
-- is not inlined, as none with a SET clause is, costs about 50 µs a call to set up,
-- a plpgsql one under 1 µs.)
--
-- The instant an operation takes effect: the moment it reads the clock, once,
-- after it took its locks, whatever transaction or statement it runs in (a
-- session that opened its transaction, or began a statement that waits, before
-- a lease's deadline cannot act on the lease after it).
-- A pinned clock (lp_clock) is honoured only in a test database; the table is
-- read first, so a production database (where it is always empty) never
-- reads the catalog.
CREATE OR REPLACE FUNCTION lp_now() RETURNS timestamptz
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, public, pg_temp AS $$
DECLARE
    pinned timestamptz;
BEGIN
    SELECT pinned_at INTO pinned FROM lp_clock;
    IF pinned IS NOT NULL AND lp_test_hooks() THEN
        RETURN pinned;
    END IF;
    RETURN clock_timestamp();
END
$$;

-- ---------------------------------------------------------------------------
-- The guards of 0001 and 0004, again, with a fixed search_path. The creation
-- guard no longer compares created_at with the clock: only lp_commit_deliveries
-- inserts for the application role, and it writes its own clock reading.

CREATE OR REPLACE FUNCTION lp_community_write_fence() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, public, pg_temp AS $$
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

CREATE OR REPLACE FUNCTION lp_retire_delivery_id() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, public, pg_temp AS $$
BEGIN
    IF (SELECT state FROM communities WHERE id = OLD.community_id) IS DISTINCT FROM 'deleted' THEN
        INSERT INTO retired_delivery_ids (community_id, id) VALUES (OLD.community_id, OLD.id)
        ON CONFLICT DO NOTHING;
    END IF;
    RETURN OLD;
END
$$;

CREATE OR REPLACE FUNCTION lp_head_runtime_together() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, public, pg_temp AS $$
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

CREATE OR REPLACE FUNCTION lp_clock_guard() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, public, pg_temp AS $$
BEGIN
    IF NOT lp_test_hooks() THEN
        RAISE EXCEPTION 'the clock cannot be pinned in this database: lp_now() is the statement time'
            USING ERRCODE = 'LP004', CONSTRAINT = 'lp_clock_test_database_only', TABLE = TG_TABLE_NAME,
                  HINT = 'a test database is marked by its owner: ALTER DATABASE ... SET leaseproof.test_hooks = on';
    END IF;
    IF NOT pg_has_role(current_user,
            (SELECT datdba FROM pg_database WHERE datname = current_database()), 'MEMBER') THEN
        RAISE EXCEPTION 'only the owner of the database moves its pinned clock, not %', current_user
            USING ERRCODE = 'LP004', CONSTRAINT = 'lp_clock_owner_only', TABLE = TG_TABLE_NAME;
    END IF;
    RETURN CASE WHEN TG_LEVEL = 'STATEMENT' THEN NULL WHEN TG_OP = 'DELETE' THEN OLD ELSE NEW END;
END
$$;

CREATE OR REPLACE FUNCTION lp_delivery_created() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, public, pg_temp AS $$
BEGIN
    IF NEW.status <> 'pending' OR NEW.lease_generation <> 0 THEN
        RAISE EXCEPTION 'delivery % is created % at generation %: deliveries are created pending, at generation 0',
                NEW.id, NEW.status, NEW.lease_generation
            USING ERRCODE = 'LP003', CONSTRAINT = 'delivery_created_pending', TABLE = TG_TABLE_NAME;
    END IF;
    IF EXISTS (SELECT 1 FROM retired_delivery_ids WHERE community_id = NEW.community_id AND id = NEW.id) THEN
        RAISE EXCEPTION 'delivery id % of community % is retired', NEW.id, NEW.community_id
            USING ERRCODE = 'LP003', CONSTRAINT = 'delivery_id_not_retired', TABLE = TG_TABLE_NAME;
    END IF;
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION lp_delivery_transition() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, public, pg_temp AS $$
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

CREATE OR REPLACE FUNCTION lp_retired_delivery_id_guard() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, public, pg_temp AS $$
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

CREATE OR REPLACE FUNCTION lp_community_guard() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, public, pg_temp AS $$
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

CREATE OR REPLACE FUNCTION lp_truncate_guard() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, public, pg_temp AS $$
BEGIN
    IF NOT lp_test_hooks() THEN
        RAISE EXCEPTION '% is not truncated outside a test database', TG_TABLE_NAME
            USING ERRCODE = 'LP003', CONSTRAINT = 'lp_no_truncate', TABLE = TG_TABLE_NAME;
    END IF;
    RETURN NULL;
END
$$;

-- The delivery table's write fence trigger goes: every write to the table is one
-- of the functions below, which check the community's state under its fence (a
-- stronger check than the trigger's, which read the state without a lock), and
-- on this table, the one every job writes three times, the trigger's query was
-- a fifth of a write's cost. The other tables keep theirs.
DROP TRIGGER workflow_agent_deliveries_write_fence ON workflow_agent_deliveries;

-- ---------------------------------------------------------------------------
-- Who acts for which community.
--
-- A role acts for the communities lp_role_scope lists for it, or for every
-- community when it has a row without one (a fleet role: a service that serves
-- every tenant, the reaper). The role is the session's login role
-- (session_user), which no statement of the session can change: neither SET
-- ROLE nor a setting moves a role's scope. A superuser, and a member of the
-- database's owner, act for every community. Any other role acts for none.
CREATE TABLE lp_role_scope (
    role_name name NOT NULL,
    community_id uuid,  -- NULL: every community
    CONSTRAINT lp_role_scope_unique UNIQUE NULLS NOT DISTINCT (role_name, community_id)
);

CREATE FUNCTION lp_is_fleet() RETURNS boolean
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, public, pg_temp AS $$
BEGIN
    PERFORM lp_require_read_committed();
    RETURN EXISTS (SELECT 1 FROM lp_role_scope WHERE role_name = session_user AND community_id IS NULL)
            OR pg_has_role(session_user, 'pg_database_owner', 'MEMBER');
END
$$;

CREATE FUNCTION lp_scope_refused(p_community uuid) RETURNS void
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, public, pg_temp AS $$
BEGIN
    RAISE EXCEPTION 'role % does not act for community %', session_user, p_community
        USING ERRCODE = 'LP005', HINT = 'a role acts for the communities lp_role_scope lists for it';
END
$$;

CREATE FUNCTION lp_require_scope(p_community uuid) RETURNS void
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, public, pg_temp AS $$
BEGIN
    IF NOT lp_may_act(p_community) THEN
        PERFORM lp_scope_refused(p_community);
    END IF;
END
$$;

CREATE FUNCTION lp_require_fleet() RETURNS void
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, public, pg_temp AS $$
BEGIN
    IF NOT lp_is_fleet() THEN
        RAISE EXCEPTION 'role % acts for some communities only, not for the fleet', session_user
            USING ERRCODE = 'LP005', HINT = 'a fleet role has a row of lp_role_scope without a community';
    END IF;
END
$$;

CREATE FUNCTION lp_require(ok boolean, what text) RETURNS void
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, public, pg_temp AS $$
BEGIN
    IF ok IS NOT TRUE THEN
        RAISE EXCEPTION 'invalid argument: %', what USING ERRCODE = '22023';
    END IF;
END
$$;

-- ---------------------------------------------------------------------------
-- The write fence. Every operation that writes a community's rows holds the
-- community's fence lock shared until it commits, and reads the community's
-- state after taking it; a change of state takes it exclusively, so it waits
-- for the writes in flight, and the writes after it read the new state.
-- Changes of one community take turns on a lock of their own first, so that
-- one may hold the fence shared, find nothing to change and leave (never
-- stopping the reaper), or upgrade to exclusive without meeting another
-- upgrader. Advisory locks: nothing is written to take them. impl/grants.sql
-- revokes the advisory-lock functions from every role but the owner, so no
-- session can take these keys except through these functions.

CREATE FUNCTION lp_fence_key(p_community uuid) RETURNS bigint
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, public, pg_temp AS $$
BEGIN
    RETURN hashtextextended('leaseproof fence ' || p_community::text, 0);
END
$$;

CREATE FUNCTION lp_change_key(p_community uuid) RETURNS bigint
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, public, pg_temp AS $$
BEGIN
    RETURN hashtextextended('leaseproof change ' || p_community::text, 0);
END
$$;

-- The operations run at READ COMMITTED only: each reads the community's state,
-- the clock and the rows after it took its locks, which a snapshot kept from the
-- transaction's start (REPEATABLE READ, SERIALIZABLE) would not show.
CREATE FUNCTION lp_require_read_committed() RETURNS void
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, public, pg_temp AS $$
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'the operations run at read committed, not %', current_setting('transaction_isolation')
            USING ERRCODE = '25001';
    END IF;
END
$$;

-- Whether the session's role acts for `p_community` (see lp_role_scope).
CREATE FUNCTION lp_may_act(p_community uuid) RETURNS boolean
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, public, pg_temp AS $$
BEGIN
    PERFORM lp_require_read_committed();
    IF pg_has_role(session_user, 'pg_database_owner', 'MEMBER') THEN
        RETURN true;
    END IF;
    RETURN EXISTS (SELECT 1 FROM lp_role_scope
                   WHERE role_name = session_user AND (community_id IS NULL OR community_id = p_community));
END
$$;

-- The refusal a community in `state` gives a write (NULL: it takes it).
CREATE FUNCTION lp_refusal(state community_state) RETURNS text
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, public, pg_temp AS $$
BEGIN
    RETURN CASE WHEN state IS NULL THEN 'UnknownCommunity' WHEN state <> 'active' THEN 'CommunityNotWritable' END;
END
$$;

-- Where every operation on a community's rows starts: the caller must act for
-- the community (LP005 otherwise); its fence is then held shared until the
-- transaction ends; and, read after the fence is taken, the community's state
-- (NULL: no such community), the refusal it gives a write (NULL: none), and
-- the instant the operation takes effect (lp_now(), read here in the same
-- query). Two queries: it runs before every operation.
CREATE FUNCTION lp_enter(p_community uuid, OUT refusal text, OUT state community_state, OUT now timestamptz)
LANGUAGE plpgsql SET search_path = pg_catalog, public, pg_temp AS $$
BEGIN
    PERFORM pg_advisory_xact_lock_shared(lp_fence_key(p_community)) WHERE lp_may_act(p_community);
    IF NOT FOUND THEN
        PERFORM lp_scope_refused(p_community);
    END IF;
    SELECT c.state, lp_now() INTO state, now FROM (SELECT) AS one LEFT JOIN communities c ON c.id = p_community;
    refusal := lp_refusal(state);
END
$$;

-- Sweeps take turns on this row, which only the owner may lock.
CREATE TABLE lp_reaper (singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton));
INSERT INTO lp_reaper VALUES (true);

-- ---------------------------------------------------------------------------
-- The delivery machine. Each function is one operation of model/delivery.py;
-- `outcome` names the model's outcome (or refusal), and the columns beside it
-- carry what that outcome reports.

CREATE FUNCTION lp_create_community(p_community uuid, OUT outcome text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS $$
BEGIN
    PERFORM lp_require_fleet();
    PERFORM lp_require(p_community IS NOT NULL, 'a community id');
    INSERT INTO communities (id) VALUES (p_community) ON CONFLICT DO NOTHING;
    outcome := CASE WHEN FOUND THEN 'Ok' ELSE 'AlreadyExists' END;
END
$$;

CREATE FUNCTION lp_set_community_state(p_community uuid, p_state community_state,
    OUT outcome text, OUT state community_state)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS $$
BEGIN
    PERFORM lp_require(p_state IN ('active', 'quiescing', 'fenced'), 'a state of active, quiescing or fenced');
    PERFORM lp_require_fleet();
    PERFORM pg_advisory_xact_lock(lp_change_key(p_community));
    SELECT e.state INTO state FROM lp_enter(p_community) AS e;
    IF state IS NULL THEN
        outcome := 'UnknownCommunity';
    ELSIF state = 'deleted' THEN
        outcome := 'CommunityNotWritable';
    ELSE
        IF state <> p_state THEN
            PERFORM pg_advisory_xact_lock(lp_fence_key(p_community));
            UPDATE communities SET state = p_state WHERE id = p_community;
        END IF;
        outcome := 'Ok';
    END IF;
END
$$;

CREATE FUNCTION lp_delete_community(p_community uuid, OUT outcome text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp SET enable_seqscan = off SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    current community_state;
BEGIN
    PERFORM lp_require_fleet();
    PERFORM pg_advisory_xact_lock(lp_change_key(p_community));
    SELECT e.state INTO current FROM lp_enter(p_community) AS e;
    IF current IS NULL THEN
        outcome := 'UnknownCommunity';
        RETURN;
    END IF;
    IF current <> 'deleted' THEN
        -- The tombstone, then the purge (its rows' ids are not retired: the
        -- tombstone refuses every write to the community for good).
        PERFORM pg_advisory_xact_lock(lp_fence_key(p_community));
        UPDATE communities SET state = 'deleted' WHERE id = p_community;
        DELETE FROM workflow_agent_deliveries WHERE community_id = p_community;
        DELETE FROM workflow_runs WHERE community_id = p_community;
        DELETE FROM workflows WHERE community_id = p_community;
        DELETE FROM events WHERE community_id = p_community;
        DELETE FROM retired_delivery_ids WHERE community_id = p_community;
    END IF;
    outcome := 'Ok';
END
$$;

-- Deletions of one community take turns: their cascades overlap (a workflow's
-- runs' deliveries, a message's deliveries) and would lock the same rows in
-- different orders.
CREATE FUNCTION lp_deletions_key(p_community uuid) RETURNS bigint
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, public, pg_temp AS $$
BEGIN
    RETURN hashtextextended('leaseproof deletions ' || p_community::text, 0);
END
$$;

CREATE FUNCTION lp_create_workflow(p_community uuid, p_workflow uuid, OUT outcome text, OUT state community_state)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS $$
BEGIN
    PERFORM lp_require(p_workflow IS NOT NULL, 'a workflow id');
    SELECT e.refusal, e.state INTO outcome, state FROM lp_enter(p_community) AS e;
    IF outcome IS NOT NULL THEN RETURN; END IF;
    INSERT INTO workflows (community_id, id) VALUES (p_community, p_workflow) ON CONFLICT DO NOTHING;
    outcome := CASE WHEN FOUND THEN 'Ok' ELSE 'AlreadyExists' END;
END
$$;

CREATE FUNCTION lp_delete_workflow(p_community uuid, p_workflow uuid, OUT outcome text, OUT state community_state)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS $$
BEGIN
    SELECT e.refusal, e.state INTO outcome, state FROM lp_enter(p_community) AS e;
    IF outcome IS NOT NULL THEN RETURN; END IF;
    PERFORM pg_advisory_xact_lock(lp_deletions_key(p_community));
    DELETE FROM workflows WHERE community_id = p_community AND id = p_workflow;
    outcome := CASE WHEN FOUND THEN 'Ok' ELSE 'NotFound' END;
END
$$;

CREATE FUNCTION lp_create_run(p_community uuid, p_workflow uuid, p_run uuid,
    OUT outcome text, OUT state community_state)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS $$
BEGIN
    PERFORM lp_require(p_workflow IS NOT NULL AND p_run IS NOT NULL, 'a workflow id and a run id');
    SELECT e.refusal, e.state INTO outcome, state FROM lp_enter(p_community) AS e;
    IF outcome IS NOT NULL THEN RETURN; END IF;
    PERFORM 1 FROM workflows WHERE community_id = p_community AND id = p_workflow FOR KEY SHARE;
    IF NOT FOUND THEN
        outcome := 'NotFound';
        RETURN;
    END IF;
    INSERT INTO workflow_runs (community_id, workflow_id, id) VALUES (p_community, p_workflow, p_run)
    ON CONFLICT DO NOTHING;
    outcome := CASE WHEN FOUND THEN 'Ok' ELSE 'AlreadyExists' END;
END
$$;

CREATE FUNCTION lp_delete_run(p_community uuid, p_run uuid, OUT outcome text, OUT state community_state)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS $$
BEGIN
    SELECT e.refusal, e.state INTO outcome, state FROM lp_enter(p_community) AS e;
    IF outcome IS NOT NULL THEN RETURN; END IF;
    PERFORM pg_advisory_xact_lock(lp_deletions_key(p_community));
    DELETE FROM workflow_runs WHERE community_id = p_community AND id = p_run;
    outcome := CASE WHEN FOUND THEN 'Ok' ELSE 'NotFound' END;
END
$$;

CREATE FUNCTION lp_publish_event(p_community uuid, p_event lp_key, OUT outcome text, OUT state community_state)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS $$
BEGIN
    PERFORM lp_require(p_event IS NOT NULL, 'an event id');
    SELECT e.refusal, e.state INTO outcome, state FROM lp_enter(p_community) AS e;
    IF outcome IS NOT NULL THEN RETURN; END IF;
    INSERT INTO events (community_id, id) VALUES (p_community, p_event) ON CONFLICT DO NOTHING;
    outcome := CASE WHEN FOUND THEN 'Ok' ELSE 'AlreadyExists' END;
END
$$;

CREATE FUNCTION lp_delete_event(p_community uuid, p_event lp_key, OUT outcome text, OUT state community_state)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS $$
BEGIN
    SELECT e.refusal, e.state INTO outcome, state FROM lp_enter(p_community) AS e;
    IF outcome IS NOT NULL THEN RETURN; END IF;
    PERFORM pg_advisory_xact_lock(lp_deletions_key(p_community));
    DELETE FROM events WHERE community_id = p_community AND id = p_event;
    outcome := CASE WHEN FOUND THEN 'Ok' ELSE 'NotFound' END;
END
$$;

-- Every target of one step, all or nothing. The i-th element of each array is
-- the i-th target's binding; the community, run and step are the commit's.
-- Refusals, in the model's order: the community, the run (NotFound, entity
-- 'run'), a target's workflow (WorkflowMismatch, the first in order), a
-- target's message event (NotFound, entity 'event', the first in order), a new
-- target whose id is live, retired, or another new target's (DeliveryIdTaken,
-- the first in order). Targets whose identity exists are a producer's retry:
-- kept as they are. A concurrent commit that takes an id between this
-- function's check and its insert makes the insert fail (a unique violation,
-- or LP003 delivery_id_not_retired): nothing is written, and the call may be
-- sent again, when the check sees the id.
CREATE FUNCTION lp_commit_deliveries(
    p_community uuid, p_run uuid, p_step lp_step_id,
    p_ids uuid[], p_workflows uuid[], p_targets lp_key[], p_definitions lp_key[], p_messages lp_key[],
    p_cause_kinds delivery_cause_kind[], p_cause_events lp_key[], p_cause_times lp_whole_second[],
    p_cause_invocations uuid[],
    OUT outcome text, OUT state community_state, OUT created uuid[], OUT existed boolean,
    OUT run_workflow uuid, OUT workflow uuid, OUT event bytea, OUT taken uuid)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp SET enable_seqscan = off SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    n integer := cardinality(p_ids);
    inserted integer;
BEGIN
    PERFORM lp_require(n >= 1 AND n = cardinality(p_workflows) AND n = cardinality(p_targets)
        AND n = cardinality(p_definitions) AND n = cardinality(p_messages) AND n = cardinality(p_cause_kinds)
        AND n = cardinality(p_cause_events) AND n = cardinality(p_cause_times)
        AND n = cardinality(p_cause_invocations), 'one or more targets, each array with one element a target');
    PERFORM lp_require(p_run IS NOT NULL AND p_step IS NOT NULL AND array_position(p_ids, NULL) IS NULL
        AND array_position(p_workflows, NULL) IS NULL AND array_position(p_targets, NULL) IS NULL
        AND array_position(p_definitions, NULL) IS NULL AND array_position(p_messages, NULL) IS NULL
        AND array_position(p_cause_kinds, NULL) IS NULL, 'every id and key of every target');
    -- The caller's scope, the community's fence (shared), and the step's turn: commits
    -- of one step take turns, so the second sees the first's rows. Taken before the
    -- statement below, so that its snapshot sees what the holders before committed.
    PERFORM pg_advisory_xact_lock_shared(lp_fence_key(p_community)),
            pg_advisory_xact_lock(hashtextextended(
                jsonb_build_array(p_community::text, p_run::text, p_step::text)::text, 0))
    WHERE lp_may_act(p_community);
    IF NOT FOUND THEN
        PERFORM lp_scope_refused(p_community);
    END IF;
    -- Refusals in the model's order: the community, the run, a target's workflow (the
    -- first in order), a target's message event (the first in order), a new target
    -- whose id is live, retired, or an earlier new target's (the first in order). A
    -- target whose identity exists is a producer's retry, kept as it is; so is the
    -- second of two targets with one key. The run and the events are locked, so that
    -- their deletion waits for this commit.
    WITH env AS MATERIALIZED (
        SELECT c.state, lp_now() AS t,
               EXISTS (SELECT 1 FROM workflow_agent_deliveries d
                       WHERE d.community_id = p_community AND d.run_id = p_run AND d.step_id = p_step) AS existed
        FROM (SELECT) AS one LEFT JOIN communities c ON c.id = p_community
    ), run AS MATERIALIZED (
        SELECT r.workflow_id FROM workflow_runs r
        WHERE (SELECT e.state = 'active' FROM env e) AND r.community_id = p_community AND r.id = p_run
        FOR KEY SHARE OF r
    ), known AS MATERIALIZED (
        SELECT k.id FROM events k
        WHERE (SELECT e.state = 'active' FROM env e) AND k.community_id = p_community
          AND k.id = ANY (p_messages::bytea[])
        FOR KEY SHARE OF k
    ), target AS MATERIALIZED (
        -- (Scalar subqueries, not EXISTS: the planner may answer an EXISTS over a list
        -- of targets by hashing every delivery of the community.)
        SELECT u.*,
               (SELECT true FROM workflow_agent_deliveries d
                WHERE d.community_id = p_community AND d.run_id = p_run AND d.step_id = p_step
                  AND d.target_pubkey = u.target) IS NOT NULL AS present,
               (SELECT true FROM workflow_agent_deliveries d WHERE d.id = u.id AND d.community_id = p_community)
                   IS NOT NULL
               OR (SELECT true FROM retired_delivery_ids r WHERE r.community_id = p_community AND r.id = u.id)
                   IS NOT NULL AS used
        FROM unnest(p_ids, p_workflows, p_targets::bytea[], p_definitions::bytea[], p_messages::bytea[],
                    p_cause_kinds, p_cause_events::bytea[], p_cause_times::timestamptz[], p_cause_invocations)
             WITH ORDINALITY AS u (id, workflow, target, definition, message, kind, cause_event, cause_time,
                                   cause_invocation, i)
        WHERE (SELECT e.state = 'active' FROM env e)
    ), fresh AS MATERIALIZED (
        SELECT f.*, count(*) OVER (PARTITION BY f.id ORDER BY f.i) AS nth_of_id
        FROM (SELECT t.*, row_number() OVER (PARTITION BY t.target ORDER BY t.i) AS nth_of_target
              FROM target t WHERE NOT t.present) AS f
        WHERE f.nth_of_target = 1
    ), verdict AS MATERIALIZED (
        SELECT CASE
                   WHEN lp_refusal(e.state) IS NOT NULL THEN lp_refusal(e.state)
                   WHEN NOT EXISTS (SELECT FROM run) THEN 'NotFound'
                   WHEN mismatch.workflow IS NOT NULL THEN 'WorkflowMismatch'
                   WHEN missing.message IS NOT NULL THEN 'NotFound'
                   WHEN used.id IS NOT NULL THEN 'DeliveryIdTaken'
                   ELSE 'Committed'
               END AS outcome,
               e.state, e.existed, (SELECT r.workflow_id FROM run r) AS run_workflow,
               mismatch.workflow, missing.message, used.id
        FROM env e
        LEFT JOIN LATERAL (
            SELECT t.workflow FROM target t, run r WHERE t.workflow <> r.workflow_id ORDER BY t.i LIMIT 1
        ) AS mismatch ON true
        LEFT JOIN LATERAL (
            SELECT t.message FROM target t WHERE t.message NOT IN (SELECT k.id FROM known k) ORDER BY t.i LIMIT 1
        ) AS missing ON true
        LEFT JOIN LATERAL (
            SELECT f.id FROM fresh f WHERE f.used OR f.nth_of_id > 1 ORDER BY f.i LIMIT 1
        ) AS used ON true
    ), inserted AS (
        INSERT INTO workflow_agent_deliveries (
            community_id, id, workflow_id, run_id, step_id, target_pubkey,
            definition_event_id, message_event_id, cause_kind, cause_event_id,
            cause_scheduled_for, cause_invocation_id, created_at)
        SELECT p_community, f.id, f.workflow, p_run, p_step, f.target,
               f.definition, f.message, f.kind, f.cause_event,
               f.cause_time, f.cause_invocation, e.t
        FROM fresh f, env e, verdict v
        WHERE v.outcome = 'Committed'
        ORDER BY f.i
        RETURNING 1
    )
    SELECT v.outcome, v.state, v.existed, v.run_workflow,
           CASE WHEN v.outcome = 'WorkflowMismatch' THEN v.workflow END,
           CASE WHEN v.outcome = 'NotFound' AND v.run_workflow IS NOT NULL THEN v.message END,
           CASE WHEN v.outcome = 'DeliveryIdTaken' THEN v.id END,
           CASE WHEN v.outcome = 'Committed' THEN ARRAY(SELECT f.id FROM fresh f ORDER BY f.i) END,
           (SELECT count(*) FROM inserted)
    INTO outcome, state, existed, run_workflow, workflow, event, taken, created, inserted
    FROM verdict v;
    PERFORM lp_require(outcome <> 'Committed' OR inserted = cardinality(created),
        'every new target inserted (no concurrent commit of the same step)');
END
$$;

-- Claim the oldest pending delivery of (community, target) that matches the
-- requested id and every field of the expected binding, skipping rows another
-- claimer holds locked. With a request key: claims under one key take turns,
-- and the lease a key holds, unexpired, is returned again.
CREATE FUNCTION lp_claim(
    p_community uuid, p_target lp_key, p_lease_seconds lp_lease_seconds, p_delivery uuid,
    p_expected boolean, p_expected_community uuid, p_expected_target lp_key,
    p_workflow uuid, p_run uuid, p_step lp_step_id, p_definition lp_key, p_message lp_key,
    p_cause_kind delivery_cause_kind, p_cause_event lp_key, p_cause_time lp_whole_second,
    p_cause_invocation uuid, p_request_key lp_request_key)
RETURNS TABLE (
    outcome text, state community_state,
    community_id uuid, id uuid, workflow_id uuid, run_id uuid, step_id lp_step_id, target_pubkey lp_key,
    definition_event_id lp_key, message_event_id lp_key, cause_kind delivery_cause_kind, cause_event_id lp_key,
    cause_scheduled_for lp_whole_second, cause_invocation_id uuid, status delivery_status, lease_generation bigint,
    lease_until timestamptz, claimed_at timestamptz, finished_at timestamptz, created_at timestamptz,
    claim_key lp_request_key)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp SET enable_seqscan = off SET plan_cache_mode = force_generic_plan AS $$
BEGIN
    PERFORM lp_require(p_target IS NOT NULL AND p_lease_seconds IS NOT NULL AND p_expected IS NOT NULL,
        'a target and a lease');
    -- The caller's scope, the community's fence (shared) and, with a request key, the
    -- key's turn, before the statement below takes its snapshot.
    PERFORM pg_advisory_xact_lock_shared(lp_fence_key(p_community)),
            CASE WHEN p_request_key IS NOT NULL THEN pg_advisory_xact_lock(hashtextextended(jsonb_build_array(
                'claim', p_community::text, encode(p_target, 'hex'), p_request_key::text)::text, 0)) END
    WHERE lp_may_act(p_community);
    IF NOT FOUND THEN
        PERFORM lp_scope_refused(p_community);
    END IF;
    IF p_expected AND (p_expected_community IS DISTINCT FROM p_community
                       OR p_expected_target IS DISTINCT FROM p_target) THEN
        -- A foreign wake: a miss, whatever the community's state.
        RETURN QUERY SELECT 'ClaimMiss', NULL::community_state, d.*
        FROM (SELECT) AS one LEFT JOIN workflow_agent_deliveries d ON false;
        RETURN;
    END IF;
    RETURN QUERY
    WITH env AS MATERIALIZED (
        SELECT c.state, lp_now() AS t FROM (SELECT) AS one LEFT JOIN communities c ON c.id = p_community
    ), retried AS MATERIALIZED (
        -- Whole rows, answered from here: a join of the table to this CTE was planned
        -- once as a scan of every delivery of the community (tests/impl/test_plans.py).
        SELECT d.* FROM workflow_agent_deliveries d
        WHERE p_request_key IS NOT NULL AND (SELECT e.state = 'active' FROM env e)
          AND d.community_id = p_community AND d.target_pubkey = p_target
          AND d.claim_key = p_request_key AND d.status = 'claimed' AND d.lease_until >= (SELECT e.t FROM env e)
    ), candidate AS (
        SELECT d.community_id, d.id FROM workflow_agent_deliveries d
        WHERE (SELECT e.state = 'active' FROM env e) AND NOT EXISTS (SELECT FROM retried)
          AND d.community_id = p_community
          AND d.target_pubkey = p_target
          AND d.status = 'pending'
          AND (p_delivery IS NULL OR d.id = p_delivery)
          AND (NOT p_expected OR (
                d.workflow_id = p_workflow
            AND d.run_id = p_run
            AND d.step_id = p_step
            AND d.definition_event_id = p_definition
            AND d.message_event_id = p_message
            AND d.cause_kind = p_cause_kind
            AND d.cause_event_id IS NOT DISTINCT FROM p_cause_event
            AND d.cause_scheduled_for IS NOT DISTINCT FROM p_cause_time
            AND d.cause_invocation_id IS NOT DISTINCT FROM p_cause_invocation))
        ORDER BY d.created_at, d.id
        LIMIT 1
        FOR UPDATE SKIP LOCKED
    ), claimed AS (
        UPDATE workflow_agent_deliveries d
        SET status = 'claimed',
            lease_generation = d.lease_generation + 1,
            lease_until = e.t + make_interval(secs => p_lease_seconds),
            claimed_at = e.t,
            claim_key = p_request_key
        FROM candidate, env e
        WHERE d.community_id = candidate.community_id AND d.id = candidate.id
        RETURNING d.*
    ), answer AS (
        SELECT * FROM claimed
        UNION ALL
        SELECT * FROM retried
    )
    SELECT coalesce(lp_refusal(e.state), CASE WHEN a.id IS NULL THEN 'ClaimMiss' ELSE 'Claimed' END), e.state, a.*
    FROM env e LEFT JOIN answer a ON true;
END
$$;

CREATE FUNCTION lp_renew(p_community uuid, p_delivery uuid, p_target lp_key, p_generation bigint,
    p_lease_seconds lp_lease_seconds,
    OUT outcome text, OUT state community_state, OUT lease_until timestamptz)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp SET enable_seqscan = off SET plan_cache_mode = force_generic_plan AS $$
BEGIN
    PERFORM lp_require(p_delivery IS NOT NULL AND p_target IS NOT NULL AND p_generation >= 0
        AND p_lease_seconds IS NOT NULL, 'a lease and a lease length');
    PERFORM pg_advisory_xact_lock_shared(lp_fence_key(p_community)) WHERE lp_may_act(p_community);
    IF NOT FOUND THEN
        PERFORM lp_scope_refused(p_community);
    END IF;
    -- A lease governs its row only while the row is claimed, at the lease's
    -- generation, for the lease's target, and unexpired.
    WITH env AS MATERIALIZED (
        SELECT c.state, lp_now() AS t FROM (SELECT) AS one LEFT JOIN communities c ON c.id = p_community
    ), renewed AS (
        UPDATE workflow_agent_deliveries d
        SET lease_until = e.t + make_interval(secs => p_lease_seconds)
        FROM env e
        WHERE e.state = 'active'
          AND d.community_id = p_community AND d.id = p_delivery
          AND d.target_pubkey = p_target
          AND d.lease_generation = p_generation
          AND d.status = 'claimed'
          AND d.lease_until >= e.t
        RETURNING d.lease_until
    )
    SELECT coalesce(lp_refusal(e.state), CASE WHEN r.lease_until IS NULL THEN 'LeaseLost' ELSE 'Renewed' END),
           e.state, r.lease_until
    INTO outcome, state, lease_until
    FROM env e LEFT JOIN renewed r ON true;
END
$$;

CREATE FUNCTION lp_finish(p_community uuid, p_delivery uuid, p_target lp_key, p_generation bigint,
    p_outcome delivery_status,
    OUT outcome text, OUT state community_state, OUT status delivery_status)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp SET enable_seqscan = off SET plan_cache_mode = force_generic_plan AS $$
BEGIN
    PERFORM lp_require(p_delivery IS NOT NULL AND p_target IS NOT NULL AND p_generation >= 0,
        'a lease');
    PERFORM lp_require(p_outcome IN ('finished', 'failed'), 'an outcome of finished or failed');
    PERFORM pg_advisory_xact_lock_shared(lp_fence_key(p_community)) WHERE lp_may_act(p_community);
    IF NOT FOUND THEN
        PERFORM lp_scope_refused(p_community);
    END IF;
    WITH env AS MATERIALIZED (
        SELECT c.state, lp_now() AS t FROM (SELECT) AS one LEFT JOIN communities c ON c.id = p_community
    ), settled AS (
        UPDATE workflow_agent_deliveries d
        SET status = p_outcome, finished_at = e.t, lease_until = NULL, claimed_at = NULL, claim_key = NULL
        FROM env e
        WHERE e.state = 'active'
          AND d.community_id = p_community AND d.id = p_delivery
          AND d.target_pubkey = p_target
          AND d.lease_generation = p_generation
          AND d.status = 'claimed'
          AND d.lease_until >= e.t
        RETURNING d.status
    )
    SELECT coalesce(lp_refusal(e.state), CASE WHEN s.status IS NULL THEN NULL ELSE 'Settled' END), e.state, s.status
    INTO outcome, state, status
    FROM env e LEFT JOIN settled s ON true;
    IF outcome IS NOT NULL THEN
        RETURN;
    END IF;
    -- Reconciliation of an uncertain completion, fenced like the lease: only
    -- the same holder (generation and target) is told the recorded terminal.
    -- A statement of its own, so a terminal a concurrent retry of the same
    -- holder committed is visible.
    SELECT d.status INTO status FROM workflow_agent_deliveries d
    WHERE d.community_id = p_community AND d.id = p_delivery
      AND d.target_pubkey = p_target
      AND d.lease_generation = p_generation
      AND d.status IN ('finished', 'failed');
    outcome := CASE WHEN FOUND THEN 'AlreadyTerminal' ELSE 'LeaseLost' END;
END
$$;

-- The reaper: every expired lease of an active community returns to pending,
-- at the next generation. Fleet roles only. A community whose fence another
-- session holds (a change of its state in flight, or a session stalled inside
-- one) is skipped and reported, not waited for; an expired row another
-- transaction holds locked (a holder between its write and its commit) is left
-- and reported. The next sweep takes both.
CREATE FUNCTION lp_sweep(OUT reaped integer, OUT left_communities uuid[], OUT left_deliveries uuid[],
    OUT skipped uuid[])
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp SET enable_seqscan = off SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    t timestamptz := lp_now();
    fenced uuid[];
BEGIN
    PERFORM lp_require_fleet();
    -- Sweeps take turns. A sweep that met a row an overlapping sweep had just
    -- returned to pending would keep it locked until it commits, and a claimer
    -- would pass over the oldest pending row.
    PERFORM 1 FROM lp_reaper FOR UPDATE;
    SELECT coalesce(array_agg(c ORDER BY c) FILTER (WHERE got), '{}'),
           coalesce(array_agg(c ORDER BY c) FILTER (WHERE NOT got), '{}')
    INTO fenced, skipped
    FROM (
        SELECT c, pg_try_advisory_xact_lock_shared(lp_fence_key(c)) AS got
        FROM (SELECT DISTINCT community_id AS c FROM workflow_agent_deliveries
              WHERE status = 'claimed' AND lease_until < t) AS expired
    ) AS tried;
    WITH due AS (
        SELECT d.community_id, d.id FROM workflow_agent_deliveries d
        JOIN communities c ON c.id = d.community_id
        WHERE d.community_id = ANY (fenced) AND c.state = 'active'
          AND d.status = 'claimed' AND d.lease_until < t
        FOR UPDATE OF d SKIP LOCKED
    ), done AS (
        UPDATE workflow_agent_deliveries d
        SET status = 'pending', lease_generation = d.lease_generation + 1,
            lease_until = NULL, claimed_at = NULL, claim_key = NULL
        FROM due
        WHERE d.community_id = due.community_id AND d.id = due.id
        RETURNING 1
    )
    SELECT count(*) INTO reaped FROM done;
    SELECT coalesce(array_agg(d.community_id ORDER BY d.community_id, d.id), '{}'),
           coalesce(array_agg(d.id ORDER BY d.community_id, d.id), '{}')
    INTO left_communities, left_deliveries
    FROM workflow_agent_deliveries d JOIN communities c ON c.id = d.community_id
    WHERE d.community_id = ANY (fenced) AND c.state = 'active'
      AND d.status = 'claimed' AND d.lease_until < t;
END
$$;

CREATE FUNCTION lp_get_delivery(p_community uuid, p_delivery uuid)
RETURNS TABLE (
    outcome text, state community_state,
    community_id uuid, id uuid, workflow_id uuid, run_id uuid, step_id lp_step_id, target_pubkey lp_key,
    definition_event_id lp_key, message_event_id lp_key, cause_kind delivery_cause_kind, cause_event_id lp_key,
    cause_scheduled_for lp_whole_second, cause_invocation_id uuid, status delivery_status, lease_generation bigint,
    lease_until timestamptz, claimed_at timestamptz, finished_at timestamptz, created_at timestamptz,
    claim_key lp_request_key)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp SET enable_seqscan = off SET plan_cache_mode = force_generic_plan AS $$
BEGIN
    PERFORM lp_require_scope(p_community);
    RETURN QUERY
    SELECT CASE WHEN d.id IS NULL THEN 'NotFound' ELSE 'Found' END, NULL::community_state, d.*
    FROM (SELECT) AS one
    LEFT JOIN workflow_agent_deliveries d ON d.community_id = p_community AND d.id = p_delivery;
END
$$;

-- ---------------------------------------------------------------------------
-- The lifecycle machine (model/lifecycle.py).

-- The definition hash: SHA-256 of the canonical JSON of the signed content,
-- byte for byte what model/lifecycle.py's Definition.hash computes (keys
-- sorted, no spaces, every character from DEL (0x7f) on as a \u escape,
-- astral ones as a surrogate pair; to_json escapes the control characters).
CREATE FUNCTION lp_json_string(s text) RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT SET search_path = pg_catalog, public, pg_temp AS $$
DECLARE
    quoted text := to_json(s)::text;
    result text := '';
    ch text;
    code integer;
BEGIN
    IF quoted !~ '[^\x01-\x7e]' THEN
        RETURN quoted;
    END IF;
    FOREACH ch IN ARRAY regexp_split_to_array(quoted, '') LOOP
        code := ascii(ch);
        IF code < 127 THEN
            result := result || ch;
        ELSIF code < 65536 THEN
            result := result || '\u' || lpad(to_hex(code), 4, '0');
        ELSE
            code := code - 65536;
            result := result || '\u' || to_hex(55296 + (code >> 10)) || '\u' || to_hex(56320 + (code & 1023));
        END IF;
    END LOOP;
    RETURN result;
END
$$;

CREATE FUNCTION lp_definition_hash(p_actions text[], p_enabled boolean) RETURNS bytea
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, public, pg_temp AS $$
    SELECT sha256(convert_to(
        '{"actions":[' || (SELECT string_agg(lp_json_string(a), ',' ORDER BY i)
                           FROM unnest(p_actions) WITH ORDINALITY AS u (a, i))
        || '],"enabled":' || CASE WHEN p_enabled IS NULL THEN 'null' WHEN p_enabled THEN 'true' ELSE 'false' END
        || '}', 'UTF8'))
$$;

-- A definition's actions as the model bounds them: 1 to 8, each not blank (by Python's str.strip()),
-- at most 64 characters.
CREATE FUNCTION lp_valid_actions(p_actions text[]) RETURNS boolean
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, public, pg_temp AS $$
    SELECT cardinality(p_actions) BETWEEN 1 AND 8
       AND array_ndims(p_actions) = 1
       AND NOT EXISTS (SELECT 1 FROM unnest(p_actions) AS a
                       WHERE a IS NULL OR a ~ E'^[\t\n\x0b\f\r\u001c-\u001f \u0085\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]*$' OR char_length(a) > 64)
$$;

CREATE FUNCTION lp_coordinate_key(p_community uuid, p_workflow uuid) RETURNS bigint
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, public, pg_temp AS $$
BEGIN
    RETURN hashtextextended(jsonb_build_array('definition', p_community::text, p_workflow::text)::text, 0);
END
$$;

CREATE FUNCTION lp_set_authority(p_community uuid, p_channel uuid, p_member lp_key, p_active boolean,
    OUT outcome text, OUT state community_state)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS $$
BEGIN
    PERFORM lp_require(p_channel IS NOT NULL AND p_member IS NOT NULL AND p_active IS NOT NULL,
        'a channel, a member and whether the authority is active');
    SELECT e.refusal, e.state INTO outcome, state FROM lp_enter(p_community) AS e;
    IF outcome IS NOT NULL THEN RETURN; END IF;
    IF p_active THEN
        INSERT INTO channel_authority VALUES (p_community, p_channel, p_member) ON CONFLICT DO NOTHING;
    ELSE
        DELETE FROM channel_authority
        WHERE community_id = p_community AND channel_id = p_channel AND member = p_member;
    END IF;
    outcome := 'Ok';
END
$$;

-- A signed save: create, update, enable or disable. Saves and deletions of one
-- coordinate take turns; the author's authority is share-locked, so a
-- revocation waits for the write that relied on it.
CREATE FUNCTION lp_save_definition(p_event lp_key, p_community uuid, p_workflow uuid, p_author lp_key,
    p_channel uuid, p_created_at lp_instant, p_actions text[], p_enabled boolean,
    OUT outcome text, OUT state community_state, OUT at timestamptz, OUT enabled boolean)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS $$
#variable_conflict use_column
DECLARE
    head record;
    cutoff timestamptz;
BEGIN
    PERFORM lp_require(p_event IS NOT NULL AND p_workflow IS NOT NULL AND p_author IS NOT NULL
        AND p_channel IS NOT NULL AND p_created_at IS NOT NULL, 'an event id, a workflow, an author, a channel, an instant');
    PERFORM lp_require(lp_valid_actions(p_actions), '1 to 8 actions, each non-blank text of at most 64 characters');
    SELECT e.refusal, e.state INTO outcome, state FROM lp_enter(p_community) AS e;
    IF outcome IS NOT NULL THEN RETURN; END IF;
    PERFORM pg_advisory_xact_lock(lp_coordinate_key(p_community, p_workflow));
    PERFORM 1 FROM channel_authority a
    WHERE a.community_id = p_community AND a.channel_id = p_channel AND a.member = p_author
    FOR SHARE;
    IF NOT FOUND THEN
        outcome := 'NoAuthority';
        RETURN;
    END IF;
    SELECT h.author, h.channel_id, h.created_at INTO head FROM definition_heads h
    WHERE h.community_id = p_community AND h.workflow_id = p_workflow FOR UPDATE;
    IF FOUND AND (head.author, head.channel_id) <> (p_author::bytea, p_channel) THEN
        outcome := 'NotAuthor';
        RETURN;
    END IF;
    IF FOUND AND p_created_at <= head.created_at THEN
        outcome := 'Superseded';
        at := head.created_at;
        RETURN;
    END IF;
    IF NOT FOUND THEN
        SELECT c.cutoff INTO cutoff FROM definition_cutoffs c
        WHERE c.community_id = p_community AND c.workflow_id = p_workflow;
        IF FOUND AND p_created_at <= cutoff THEN
            outcome := 'BeforeCutoff';
            at := cutoff;
            RETURN;
        END IF;
    END IF;
    INSERT INTO definition_heads
        (community_id, workflow_id, event_id, author, channel_id, created_at, actions, enabled)
    VALUES (p_community, p_workflow, p_event, p_author, p_channel, p_created_at, p_actions, p_enabled)
    ON CONFLICT (community_id, workflow_id) DO UPDATE SET
        event_id = excluded.event_id, created_at = excluded.created_at,
        actions = excluded.actions, enabled = excluded.enabled;
    -- A new coordinate's incarnation is the save's instant; an update keeps its own.
    INSERT INTO definition_runtime
        (community_id, workflow_id, owner, channel_id, hash, enabled, incarnation, actions, revision)
    VALUES (p_community, p_workflow, p_author, p_channel, lp_definition_hash(p_actions, p_enabled),
            p_enabled IS NOT FALSE, p_created_at, p_actions, p_event)
    ON CONFLICT (community_id, workflow_id) DO UPDATE SET
        hash = excluded.hash, enabled = excluded.enabled, actions = excluded.actions, revision = excluded.revision;
    enabled := p_enabled IS NOT FALSE;
    IF head IS NULL THEN
        outcome := 'Created';
        at := p_created_at;
    ELSE
        outcome := 'Updated';
    END IF;
END
$$;

-- The canonical deletion, signed by the definition's author: the head and its
-- runtime row go, and the coordinate's cutoff is set, together.
CREATE FUNCTION lp_delete_definition(p_community uuid, p_workflow uuid, p_author lp_key, p_created_at lp_instant,
    OUT outcome text, OUT state community_state, OUT at timestamptz, OUT channel_id uuid)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS $$
#variable_conflict use_column
DECLARE
    head record;
BEGIN
    PERFORM lp_require(p_workflow IS NOT NULL AND p_author IS NOT NULL AND p_created_at IS NOT NULL,
        'a workflow, an author and an instant');
    SELECT e.refusal, e.state INTO outcome, state FROM lp_enter(p_community) AS e;
    IF outcome IS NOT NULL THEN RETURN; END IF;
    PERFORM pg_advisory_xact_lock(lp_coordinate_key(p_community, p_workflow));
    SELECT h.author, h.channel_id, h.created_at INTO head FROM definition_heads h
    WHERE h.community_id = p_community AND h.workflow_id = p_workflow FOR UPDATE;
    IF NOT FOUND THEN
        outcome := 'NotFound';
        RETURN;
    END IF;
    IF head.author <> p_author::bytea THEN
        outcome := 'NotAuthor';
        RETURN;
    END IF;
    channel_id := head.channel_id;
    PERFORM 1 FROM channel_authority a
    WHERE a.community_id = p_community AND a.channel_id = head.channel_id AND a.member = p_author
    FOR SHARE;
    IF NOT FOUND THEN
        outcome := 'NoAuthority';
        RETURN;
    END IF;
    IF p_created_at < head.created_at THEN
        outcome := 'Superseded';
        at := head.created_at;
        RETURN;
    END IF;
    DELETE FROM definition_runtime r WHERE r.community_id = p_community AND r.workflow_id = p_workflow;
    DELETE FROM definition_heads h WHERE h.community_id = p_community AND h.workflow_id = p_workflow;
    INSERT INTO definition_cutoffs VALUES (p_community, p_workflow, p_created_at)
    ON CONFLICT (community_id, workflow_id) DO UPDATE SET cutoff = excluded.cutoff;
    outcome := 'Deleted';
    at := p_created_at;
END
$$;

-- A replica's fire starts here: the community's state (a refused fire touches
-- nothing, not even the replica's cache) and the clock its cache is judged by.
CREATE FUNCTION lp_fire_check(p_community uuid, OUT outcome text, OUT state community_state, OUT now timestamptz)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS $$
BEGIN
    SELECT coalesce(e.refusal, 'Ok'), e.state, e.now INTO outcome, state, now FROM lp_enter(p_community) AS e;
END
$$;

-- A replica's cache: every enabled record of the communities the caller acts
-- for, and the instant it was read (the first row, whose record is empty).
CREATE FUNCTION lp_enabled_records()
RETURNS TABLE (loaded_at timestamptz, community_id uuid, workflow_id uuid, owner bytea, channel_id uuid,
               hash bytea, enabled boolean, incarnation timestamptz, actions text[], revision bytea)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS $$
DECLARE
    t timestamptz := lp_now();
    fleet boolean := lp_is_fleet();
BEGIN
    RETURN QUERY
    SELECT t, NULL::uuid, NULL::uuid, NULL::bytea, NULL::uuid, NULL::bytea, NULL::boolean,
           NULL::timestamptz, NULL::text[], NULL::bytea
    UNION ALL
    SELECT t, r.community_id, r.workflow_id, r.owner, r.channel_id, r.hash, r.enabled,
           r.incarnation, r.actions, r.revision
    FROM definition_runtime r
    WHERE r.enabled
      AND (fleet OR EXISTS (SELECT 1 FROM lp_role_scope s
                            WHERE s.role_name = session_user AND s.community_id = r.community_id));
END
$$;

-- The only admission path: the selected record must still be the current,
-- enabled row in every field it was selected by, of an owner with active
-- authority in its channel; the share lock makes writers and deleters of the
-- definition wait for (or win over) it. The run executes the row's actions,
-- in order, in the same transaction.
CREATE FUNCTION lp_admit(p_community uuid, p_workflow uuid, p_door text, p_owner lp_key, p_channel uuid,
    p_hash lp_key, p_incarnation timestamptz,
    OUT outcome text, OUT state community_state, OUT run_id bigint, OUT revision bytea)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS $$
#variable_conflict use_column
DECLARE
    t timestamptz;
    v_run bigint;
    v_actions text[];
BEGIN
    PERFORM lp_require(p_door IN ('event', 'schedule', 'manual', 'webhook'), 'a door of event, schedule, manual or webhook');
    PERFORM lp_require(p_workflow IS NOT NULL AND p_owner IS NOT NULL AND p_channel IS NOT NULL
        AND p_hash IS NOT NULL AND p_incarnation IS NOT NULL, 'the selected record');
    SELECT e.refusal, e.state, e.now INTO outcome, state, t FROM lp_enter(p_community) AS e;
    IF outcome IS NOT NULL THEN RETURN; END IF;
    INSERT INTO admitted_runs
        (community_id, workflow_id, door, owner, channel_id, hash, enabled, incarnation, actions, revision, admitted_at)
    SELECT r.community_id, r.workflow_id, p_door, r.owner, r.channel_id, r.hash, r.enabled,
           r.incarnation, r.actions, r.revision, t
    FROM (
        SELECT d.* FROM definition_runtime d
        JOIN channel_authority a
          ON a.community_id = d.community_id AND a.channel_id = d.channel_id AND a.member = d.owner
        WHERE d.community_id = p_community AND d.workflow_id = p_workflow
          AND d.enabled
          AND d.hash = p_hash
          AND d.owner = p_owner
          AND d.channel_id = p_channel
          AND d.incarnation = p_incarnation
        FOR SHARE
    ) AS r
    RETURNING admitted_runs.id, admitted_runs.revision, admitted_runs.actions INTO v_run, revision, v_actions;
    IF NOT FOUND THEN
        outcome := 'AdmissionRefused';
        RETURN;
    END IF;
    INSERT INTO executed_actions (run_id, action)
    SELECT v_run, a FROM unnest(v_actions) WITH ORDINALITY AS u (a, i) ORDER BY i;
    run_id := v_run;
    outcome := 'Admitted';
END
$$;

-- Resume of an admitted run: only its pinned revision, only while it passes
-- the admission guard again. Resumes of one run take turns (its row is
-- locked), so each appends its whole action list, never interleaved.
CREATE FUNCTION lp_resume_run(p_run bigint,
    OUT outcome text, OUT state community_state, OUT actions text[], OUT community_id uuid)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS $$
#variable_conflict use_column
DECLARE
    c uuid;
    pinned record;
BEGIN
    PERFORM lp_require(p_run >= 1, 'a run id of 1 or more');
    -- A run of a community the caller does not act for is unknown to it.
    SELECT r.community_id INTO c FROM admitted_runs r WHERE r.id = p_run AND lp_may_act(r.community_id);
    IF NOT FOUND THEN
        outcome := 'UnknownRun';
        RETURN;
    END IF;
    community_id := c;
    SELECT e.refusal, e.state INTO outcome, state FROM lp_enter(c) AS e;
    IF outcome IS NOT NULL THEN RETURN; END IF;
    SELECT r.* INTO pinned FROM admitted_runs r WHERE r.id = p_run FOR NO KEY UPDATE;
    PERFORM 1 FROM definition_runtime d
    JOIN channel_authority a
      ON a.community_id = d.community_id AND a.channel_id = d.channel_id AND a.member = d.owner
    WHERE d.community_id = pinned.community_id AND d.workflow_id = pinned.workflow_id AND d.enabled
      AND d.hash = pinned.hash AND d.owner = pinned.owner AND d.channel_id = pinned.channel_id
      AND d.incarnation = pinned.incarnation AND d.actions = pinned.actions AND d.revision = pinned.revision
    FOR SHARE;
    IF NOT FOUND THEN
        outcome := 'ResumeRefused';
        RETURN;
    END IF;
    INSERT INTO executed_actions (run_id, action)
    SELECT p_run, a FROM unnest(pinned.actions) WITH ORDINALITY AS u (a, i) ORDER BY i;
    outcome := 'Resumed';
    actions := pinned.actions;
END
$$;

-- ---------------------------------------------------------------------------
-- No function is callable by PUBLIC: impl/grants.sql grants EXECUTE on the
-- operations to the roles that perform them. Functions a later migration makes
-- (as the migrating role) are not either.
DO $$
DECLARE
    f regprocedure;
BEGIN
    FOR f IN
        SELECT p.oid::regprocedure FROM pg_proc p
        WHERE p.pronamespace = 'public'::regnamespace AND p.proname LIKE 'lp\_%'
    LOOP
        EXECUTE format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', f);
    END LOOP;
END
$$;
ALTER DEFAULT PRIVILEGES REVOKE EXECUTE ON FUNCTIONS FROM PUBLIC;
