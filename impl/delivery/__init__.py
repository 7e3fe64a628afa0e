"""The delivery machine's production code: its PostgreSQL store and the adapter in front of it."""
