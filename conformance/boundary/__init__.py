"""The contract an implementation meets: adapter protocols, wire protocol, codec, wire server."""
