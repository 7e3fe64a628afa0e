"""The lifecycle machine's production code: its PostgreSQL store, replica engines and adapter."""
