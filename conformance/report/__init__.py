"""HTML reports: one self-contained page per run (counterexamples, stress histories, the kill matrix)."""
