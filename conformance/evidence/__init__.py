"""That the checks catch bugs: the kill matrix over shipped mutants, the score over generated."""
