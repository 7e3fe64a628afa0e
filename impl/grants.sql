-- Step 3 of impl/roles.sql: what the application role may do, granted by the owner once the
-- migrations have made the tables (see impl/roles.sql for the roles and the steps):
--
--     psql -v owner=leaseproof_owner -v app=leaseproof_app -d leaseproof -f impl/grants.sql
--
-- The DML each store statement needs and nothing else.

\set ON_ERROR_STOP on
SET ROLE :"owner";

GRANT USAGE ON SCHEMA public TO :"app";
GRANT SELECT ON lp_clock, lp_schema_migrations TO :"app";
-- The delivery machine. FOR UPDATE / FOR SHARE on communities need UPDATE.
GRANT SELECT, INSERT, UPDATE ON communities TO :"app";
-- UPDATE only for the row locks the stores take on them (SELECT ... FOR KEY SHARE needs it): no
-- store statement updates a workflow, a run or an event.
GRANT SELECT, INSERT, UPDATE, DELETE ON workflows, workflow_runs, events TO :"app";
GRANT SELECT, INSERT, UPDATE, DELETE ON workflow_agent_deliveries TO :"app";
-- Retired ids are written by the deletion trigger, as the deleting role, and purged.
GRANT SELECT, INSERT, DELETE ON retired_delivery_ids TO :"app";
-- The lifecycle machine.
-- UPDATE on channel_authority and admitted_runs only for the row locks taken on them (an
-- authority check FOR SHARE, a resume's pinned run FOR NO KEY UPDATE): no statement updates them.
GRANT SELECT, INSERT, UPDATE, DELETE ON channel_authority TO :"app";
GRANT SELECT, INSERT, UPDATE, DELETE ON definition_heads, definition_runtime, definition_cutoffs TO :"app";
GRANT SELECT, INSERT, UPDATE, DELETE ON admitted_runs TO :"app";
GRANT SELECT, INSERT, DELETE ON executed_actions TO :"app";
GRANT USAGE ON ALL SEQUENCES IN SCHEMA public TO :"app";
