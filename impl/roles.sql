-- The two roles of a production database of the bundled implementation.
-- Run with psql, as a superuser (or a role with CREATEROLE and CREATEDB):
--
--     psql -v owner=leaseproof_owner -v app=leaseproof_app -v db=leaseproof -f impl/roles.sql
--
-- then apply the migrations as the owner (leaseproof.impl.migrate.migrate
-- on a connection of the owner's), then run the GRANTs at the end of this
-- file, connected to the database as the owner (`\connect` below does it).
--
-- * The owner owns the database and every object the migrations make. Only it
--   (or a superuser) can change a trigger or a function, or mark the database a
--   test database (ALTER DATABASE ... SET leaseproof.test_hooks = on), which
--   production never does. It needs no LOGIN except to migrate.
-- * The application role is what the stores connect as: the DML each store
--   statement needs, nothing else. No TRUNCATE, no REFERENCES, no TRIGGER, no
--   write on lp_clock (lp_now() reads it) nor on lp_schema_migrations; it owns
--   nothing, so it cannot ALTER the database or any table. Even with every DML
--   grant (tests/impl/test_guards.py grants them all) it could not pin the
--   clock or break a row's invariants: migration 0004's guards refuse that
--   whoever writes. What it can do is what the stores do: act for any
--   community, because one service serves them all and the reaper sweeps
--   them all (see README, "What the database itself refuses", on row-level
--   security).

CREATE ROLE :"owner" NOLOGIN;
CREATE ROLE :"app" LOGIN;
CREATE DATABASE :"db" OWNER :"owner";

\connect :"db"
SET ROLE :"owner";
-- (apply the migrations here, as the owner, before the grants)

GRANT USAGE ON SCHEMA public TO :"app";
GRANT SELECT ON lp_clock, lp_schema_migrations TO :"app";
-- The delivery machine. FOR UPDATE / FOR SHARE on communities need UPDATE.
GRANT SELECT, INSERT, UPDATE ON communities TO :"app";
GRANT SELECT, INSERT, DELETE ON workflows, workflow_runs, events TO :"app";
GRANT SELECT, INSERT, UPDATE, DELETE ON workflow_agent_deliveries TO :"app";
-- Retired ids are written by the deletion trigger, as the deleting role, and purged.
GRANT SELECT, INSERT, DELETE ON retired_delivery_ids TO :"app";
-- The lifecycle machine.
GRANT SELECT, INSERT, DELETE ON channel_authority, definition_cutoffs TO :"app";
GRANT SELECT, INSERT, UPDATE, DELETE ON definition_heads, definition_runtime TO :"app";
GRANT SELECT, INSERT, UPDATE ON definition_cutoffs TO :"app";
GRANT SELECT, INSERT, DELETE ON admitted_runs, executed_actions TO :"app";
GRANT USAGE ON ALL SEQUENCES IN SCHEMA public TO :"app";
