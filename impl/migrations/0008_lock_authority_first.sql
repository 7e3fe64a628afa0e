-- Admission and resume lock the author's channel authority before the definition's runtime
-- row, as a save does. Both took the two in one `FOR SHARE` over a join, which locks each
-- result's rows in the order of its FROM list: the runtime row first. Under
-- `leaseproof stress --machine lifecycle --contend 0.5` (seeds 1-3, within 60 s) the server
-- broke a deadlock of three (40P01, an error for the caller): a resume or an admission at
-- that join waited for a row's tuple lock held by a change of authority, the change waited
-- for a save's transaction, and the save waited for the resume's (or admission's). With
-- the authority named first the same runs are linearizable. (How the resume came to wait
-- behind the change, rather than share the save's lock at once, is not yet shown by a
-- forced schedule.) The join's FROM list now names the authority first; nothing else
-- changes.

CREATE OR REPLACE FUNCTION lp_admit(p_community uuid, p_workflow uuid, p_door text, p_owner lp_key, p_channel uuid,
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
        SELECT d.* FROM channel_authority a
        JOIN definition_runtime d
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

CREATE OR REPLACE FUNCTION lp_resume_run(p_run bigint,
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
    PERFORM 1 FROM channel_authority a
    JOIN definition_runtime d
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
