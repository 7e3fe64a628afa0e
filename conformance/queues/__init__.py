"""The lease-queue profile against real queues: adapters, runs, the guarantees matrix."""
