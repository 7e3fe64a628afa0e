-- The clock is an operation's too. The application role holds no privilege on any
-- table (impl/grants.sql): every read is a function's. lp_now() is the one function
-- it calls that reads a table itself (lp_clock, the pinned clock of a test database):
-- as the caller, it was refused (permission denied for table lp_clock). It runs as
-- its owner now, like the operations; it still reads nothing but the clock. (ALTER,
-- not CREATE OR REPLACE: its body stays where 0006 states it.)
ALTER FUNCTION lp_now() SECURITY DEFINER;
