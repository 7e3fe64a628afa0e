-- The roles of a production database of the bundled implementation, in three steps:
--
-- 1. This file, with psql, as a superuser (or a role with CREATEROLE and CREATEDB):
--        psql -v owner=leaseproof_owner -v api=leaseproof_api -v app=leaseproof_app \
--             -v reaper=leaseproof_reaper -v db=leaseproof -f impl/roles.sql
-- 2. The migrations, as the owner: leaseproof.impl.migrate.migrate on a connection to the
--    database that acts as the owner (a superuser's, after SET ROLE leaseproof_owner).
-- 3. impl/grants.sql, with psql, connected to the database as a superuser (it revokes the
--    advisory-lock and large-object functions of pg_catalog, which only a superuser may):
--        psql -v owner=leaseproof_owner -v api=leaseproof_api -v app=leaseproof_app \
--             -v reaper=leaseproof_reaper -d leaseproof -f impl/grants.sql
--
-- A tenant that gets a login role of its own, acting for its community alone, is bound to it
-- by impl/tenants.sql (any time after step 3).
--
-- tests/impl/test_roles_script.py runs the three steps as written, then checks both
-- machines in lockstep with every store call sent as the application role (the model's
-- Reap as the reaper); tests/impl/test_attacks.py attacks the result as each of them.
--
-- * The owner owns the database and every object the migrations make. Only it
--   (or a superuser) can change a trigger, a table or a function. It needs no LOGIN
--   except to migrate. Marking the database a test database (ALTER DATABASE ... SET
--   leaseproof.test_hooks = on), which production never does, takes a superuser (or a
--   role granted SET on that parameter): from PostgreSQL 15 on, not even the owner may.
-- * The api role (NOLOGIN) holds what performing the model's operations takes:
--   EXECUTE on the operation functions of migration 0006 (SECURITY DEFINER, each with a
--   fixed search_path) and on lp_now() (run as its owner since 0007), and USAGE on the
--   schema. No privilege on any table, sequence or
--   other function: every read and write goes through the functions, which check the
--   caller's scope (lp_role_scope, keyed to the login role) and make exactly the model's
--   transitions. Login roles hold it by membership, so that none of them is a member of
--   another: a role may signal (pg_cancel_backend, pg_terminate_backend) only the sessions
--   of roles whose privileges it has.
-- * The application role (LOGIN, a member of api) is the service of every tenant: a fleet
--   role (grants.sql gives it a row of lp_role_scope without a community). It owns
--   nothing; it cannot sweep (lp_sweep is the reaper's), create anything (no CREATE, no
--   TEMP), take an advisory lock but through the functions, or signal the reaper.
-- * The reaper role (LOGIN, not a member of api) holds EXECUTE on lp_sweep alone, and is a
--   fleet role too. No role of the application can signal its sessions.
-- * Every login role's sessions start with bounded waits: lock_timeout,
--   statement_timeout and idle_in_transaction_session_timeout (the same bounds as the
--   stores' own, impl/delivery/store.py: Waits). A session can SET them again, even to
--   0, and a role may ALTER ROLE ... SET its own defaults: the bounds protect the fleet
--   from a stalled well-meaning client, not from a hostile one. What protects it from a
--   hostile one is the functions: the reaper skips, and reports, a community whose fence
--   a stalled session holds, and waits for nothing a session of these roles can hold
--   (tests/impl/test_reaper_under_locks.py).
-- * The database: PUBLIC may neither connect, nor create a schema, nor create a temporary
--   object in it (so nothing a session makes can shadow a table, view, function or
--   operator the functions use); api and the reaper may connect.
-- * The server: keep max_prepared_transactions = 0 (its default). Any role may PREPARE
--   TRANSACTION where it is not, and a prepared transaction keeps its locks (a
--   community's fence) past its session and every timeout, until a superuser ends it.

\set ON_ERROR_STOP on

CREATE ROLE :"owner" NOLOGIN;
CREATE ROLE :"api" NOLOGIN;
CREATE ROLE :"app" LOGIN;
CREATE ROLE :"reaper" LOGIN;
-- The application role has api's privileges, and (from PostgreSQL 16 on) may not SET ROLE to
-- it: as api it could change api's own entries (its settings, which no session applies).
SELECT current_setting('server_version_num')::int >= 160000 AS lp_no_set_option \gset
\if :lp_no_set_option
GRANT :"api" TO :"app" WITH INHERIT TRUE, SET FALSE;
\else
GRANT :"api" TO :"app";
\endif

ALTER ROLE :"app" SET lock_timeout = '5s';
ALTER ROLE :"app" SET statement_timeout = '30s';
ALTER ROLE :"app" SET idle_in_transaction_session_timeout = '60s';
ALTER ROLE :"reaper" SET lock_timeout = '5s';
ALTER ROLE :"reaper" SET statement_timeout = '30s';
ALTER ROLE :"reaper" SET idle_in_transaction_session_timeout = '60s';

CREATE DATABASE :"db" OWNER :"owner";
REVOKE ALL ON DATABASE :"db" FROM PUBLIC;
GRANT CONNECT ON DATABASE :"db" TO :"api", :"reaper";
