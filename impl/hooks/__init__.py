"""Test hooks around the production code: the statement gate that forces an interleaving."""
