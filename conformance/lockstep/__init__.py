"""The sequential path: programs run in lockstep on the model and an implementation, compared."""
