"""The concurrent path: programs run by concurrent sessions, their histories, the checker."""
