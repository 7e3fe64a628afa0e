-- The two roles of a production database of the bundled implementation, in three steps:
--
-- 1. This file, with psql, as a superuser (or a role with CREATEROLE and CREATEDB):
--        psql -v owner=leaseproof_owner -v app=leaseproof_app -v db=leaseproof -f impl/roles.sql
-- 2. The migrations, as the owner: leaseproof.impl.migrate.migrate on a connection to the
--    database that acts as the owner (a superuser's, after SET ROLE leaseproof_owner).
-- 3. impl/grants.sql, with psql, connected to the database as a superuser or the owner:
--        psql -v owner=leaseproof_owner -v app=leaseproof_app -d leaseproof -f impl/grants.sql
--
-- tests/impl/test_roles_script.py runs the three steps as written, then checks both
-- machines in lockstep with every statement of the stores sent as the application role.
--
-- * The owner owns the database and every object the migrations make. Only it
--   (or a superuser) can change a trigger or a function. Marking the database a
--   test database (ALTER DATABASE ... SET leaseproof.test_hooks = on), which
--   production never does, takes a superuser (or a role granted SET on that
--   parameter): from PostgreSQL 15 on, not even the owner may. It needs no LOGIN
--   except to migrate.
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

\set ON_ERROR_STOP on

CREATE ROLE :"owner" NOLOGIN;
CREATE ROLE :"app" LOGIN;
CREATE DATABASE :"db" OWNER :"owner";
