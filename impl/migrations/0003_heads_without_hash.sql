-- The signed head kept a copy of its definition's hash that no statement read
-- and no snapshot compared, so a wrong value could be written and never seen
-- (mechanical mutation found it: SQL_UPSERT_HEAD could keep a stale hash and
-- every check still passed). The hash that admission matches lives in
-- definition_runtime; the head keeps the signed content it is computed from.
ALTER TABLE definition_heads DROP COLUMN hash;
