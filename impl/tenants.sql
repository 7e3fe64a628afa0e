-- A tenant's own login role, acting for its community alone (after the three steps of
-- impl/roles.sql). With psql, connected to the database as a superuser:
--
--     psql -v api=leaseproof_api -v tenant=leaseproof_tenant_acme \
--          -v community=6f1c0a52-6c39-4b8e-9a43-1d8f0e7c2b11 -d leaseproof -f impl/tenants.sql
--
-- The role is made if it does not exist: LOGIN, with api's privileges (so it may call the
-- operation functions, and may signal the sessions of no other role of the application;
-- from PostgreSQL 16 on, it may not SET ROLE to api either), with the same bounded waits
-- as the application role. It is then bound to
-- the community: lp_role_scope gets (tenant, community), and every function refuses the
-- role any other community (SQLSTATE LP005), whatever it passes, because the scope is
-- keyed to the session's login role (session_user), which no statement of a session
-- changes. Run again with another community, it binds the same role to that one too.
-- The community need not exist yet; the application role (a fleet role) creates it.
--
-- Never bind a tenant with an empty community: a row of lp_role_scope without one makes
-- a fleet role, which acts for every community.

\set ON_ERROR_STOP on

SELECT NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = :'tenant') AS lp_new_role \gset
SELECT current_setting('server_version_num')::int >= 160000 AS lp_no_set_option \gset
\if :lp_new_role
CREATE ROLE :"tenant" LOGIN;
\if :lp_no_set_option
GRANT :"api" TO :"tenant" WITH INHERIT TRUE, SET FALSE;
\else
GRANT :"api" TO :"tenant";
\endif
ALTER ROLE :"tenant" SET lock_timeout = '5s';
ALTER ROLE :"tenant" SET statement_timeout = '30s';
ALTER ROLE :"tenant" SET idle_in_transaction_session_timeout = '60s';
\endif

INSERT INTO lp_role_scope (role_name, community_id) VALUES (:'tenant', CAST(:'community' AS uuid))
ON CONFLICT DO NOTHING;
