"""Recorded programs to replay or check against the model, and the regression corpus."""
