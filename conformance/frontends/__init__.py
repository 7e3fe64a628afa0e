"""The ways in: the `leaseproof` command line, the pytest plugin, their progress line."""
