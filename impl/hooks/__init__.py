"""Test hooks around the production code: the pinned clock, and the statement gate that forces an interleaving."""
