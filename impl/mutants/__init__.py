"""Deliberately wrong variants of the bundled machines: written by hand, racy, and generated."""
