-- The application role holds no privilege on any table (impl/grants.sql): every read and
-- write is a function's, run as its owner. Two functions still ran as the caller and read
-- a table themselves; they run as their owner now. (ALTER FUNCTION: their bodies stay
-- where migration 0006 states them, and read nothing more than before.)
--
-- * lp_now(), which the replicas call for the clock, reads lp_clock (the pinned clock of
--   a test database): as the application role, it was refused (permission denied for
--   table lp_clock).
-- * lp_head_runtime_together(), the deferred constraint trigger that keeps a definition's
--   head and runtime record together, reads both tables at COMMIT, after the function that
--   wrote them has returned: before PostgreSQL 18, a deferred trigger runs as the role
--   that commits, so every save and deletion of a definition by the application role
--   failed at its COMMIT (permission denied for table definition_heads); PostgreSQL 18
--   runs it as the role that queued it (the functions' owner).
ALTER FUNCTION lp_now() SECURITY DEFINER;
ALTER FUNCTION lp_head_runtime_together() SECURITY DEFINER;
