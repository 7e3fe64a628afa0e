-- A claim may carry a request key (chosen by the client) so that, sent again
-- after its answer was lost, it returns the lease it took instead of claiming
-- another delivery and orphaning the first (specs/delivery.md, "Sending a
-- command again"). The row keeps the key while it is claimed.
ALTER TABLE workflow_agent_deliveries ADD COLUMN claim_key text;

ALTER TABLE workflow_agent_deliveries
    ADD CONSTRAINT delivery_claim_key_only_while_claimed CHECK (claim_key IS NULL OR status = 'claimed'),
    ADD CONSTRAINT delivery_claim_key_shape CHECK (
        claim_key IS NULL OR (char_length(claim_key) BETWEEN 1 AND 64 AND claim_key = btrim(claim_key, E' \t\n\r\f\v'))
    );

-- A retried claim finds its row by (community, target, key).
CREATE INDEX workflow_agent_deliveries_claim_key ON workflow_agent_deliveries (community_id, target_pubkey, claim_key)
    WHERE claim_key IS NOT NULL;
