-- Step 3 of impl/roles.sql: what each role may do, once the migrations have made the schema
-- (see impl/roles.sql for the roles and the steps). Connected to the database as a superuser:
--
--     psql -v owner=leaseproof_owner -v api=leaseproof_api -v app=leaseproof_app \
--          -v reaper=leaseproof_reaper -d leaseproof -f impl/grants.sql
--
-- A superuser, because it changes who may execute functions of pg_catalog (the advisory
-- locks, the large objects) in this database. Run again, it changes nothing.

\set ON_ERROR_STOP on

-- Nothing a session creates can shadow the schema: no object in public (from PostgreSQL 15
-- on PUBLIC has no CREATE there anyway), no schema, no temporary object (roles.sql).
REVOKE CREATE ON SCHEMA public FROM PUBLIC;
GRANT USAGE ON SCHEMA public TO :"api", :"reaper";

-- No role of the application holds a privilege on a table or a sequence: every read and
-- write is a function's.
REVOKE ALL ON ALL TABLES IN SCHEMA public FROM PUBLIC, :"api", :"app", :"reaper";
REVOKE ALL ON ALL SEQUENCES IN SCHEMA public FROM PUBLIC, :"api", :"app", :"reaper";
-- (Migration 0006 already revoked every lp_ function from PUBLIC; this covers the rest.)
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA public FROM PUBLIC, :"api", :"app", :"reaper";

-- The model's operations, one function each (docs/database-api.md), and the clock they read.
GRANT EXECUTE ON FUNCTION
    lp_now,
    lp_create_community, lp_set_community_state, lp_delete_community,
    lp_create_workflow, lp_delete_workflow, lp_create_run, lp_delete_run,
    lp_publish_event, lp_delete_event,
    lp_commit_deliveries, lp_claim, lp_renew, lp_finish, lp_get_delivery,
    lp_set_authority, lp_save_definition, lp_delete_definition,
    lp_fire_check, lp_enabled_records, lp_admit, lp_resume_run
TO :"api";
-- The sweep is the reaper's alone.
GRANT EXECUTE ON FUNCTION lp_sweep TO :"reaper";

-- Both act for every community (a fleet role: a row without a community).
INSERT INTO lp_role_scope (role_name, community_id) VALUES (:'app', NULL), (:'reaper', NULL)
ON CONFLICT DO NOTHING;

-- No session takes an advisory lock but through the functions (which run as the owner): the
-- fences, the changes' and deletions' turns, a step's and a request key's are advisory locks,
-- and a session that held one would stop the writers, or the reaper, of a community.
SELECT format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', p.oid::regprocedure)
FROM pg_catalog.pg_proc p
WHERE p.pronamespace = 'pg_catalog'::regnamespace AND p.proname ~ '^pg_(try_)?advisory_'
ORDER BY 1 \gexec
SELECT format('GRANT EXECUTE ON FUNCTION %s TO %I', p.oid::regprocedure, :'owner')
FROM pg_catalog.pg_proc p
WHERE p.pronamespace = 'pg_catalog'::regnamespace AND p.proname ~ '^pg_(try_)?advisory_'
ORDER BY 1 \gexec

-- Large objects are rows of the database (pg_largeobject) that any role may create by
-- default: none of the application's may.
SELECT format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', p.oid::regprocedure)
FROM pg_catalog.pg_proc p
WHERE p.pronamespace = 'pg_catalog'::regnamespace
  AND p.proname IN ('lo_create', 'lo_creat', 'lo_from_bytea', 'lo_import')
ORDER BY 1 \gexec
