"""What the command line names before anything it names is imported: the machines, the
shipped mutants by kind, and the defaults the help texts state. `leaseproof COMMAND --help`
reads them from here, so that it starts without the database driver, Hypothesis or the
models; tests/conformance/frontends/test_startup.py keeps each one equal to its source."""

from __future__ import annotations

MACHINES = ("delivery", "lifecycle")  # conformance/lockstep/verify.py

# impl/mutants/delivery.py, then impl/mutants/lifecycle.py: what verify and replay take.
SEQUENTIAL_MUTANTS = (
    "reconcile-unfenced", "renew-ignores-expiry", "finish-ignores-expiry", "claim-scope-unchecked",
    "lease-target-unbound", "reap-ignores-fence", "reap-at-deadline", "lease-lost-at-deadline",
    "claim-newest-first", "claim-ignores-cause", "reap-keeps-generation", "reconcile-echoes-request",
    "writes-trust-fence-trigger", "delivery-ids-reused", "commit-not-atomic", "graphile-worker-169-finish-by-state",
    "pgqueuer-430-heartbeat-by-id", "procrastinate-1518-finish-by-worker", "oban-rescue-beyond-scope",
    "rescue-batch-starved",
    "admission-ignores-hash", "admission-ignores-incarnation", "admission-by-id",
    "refreshed-admission-stale-execution", "cache-never-expires", "report-enforcement-splits", "cutoff-ignored",
    "resume-reloads-current",
)  # fmt: skip
# impl/mutants/race.py and impl/mutants/faults.py: what only stress shows.
RACE_MUTANTS = (
    "claim-read-then-update", "finish-check-then-act", "reconcile-outside-transaction",
    "commit-without-identity-lock", "reap-read-then-update", "sweeps-overlap", "read-skips-locked",
    "admission-without-row-lock", "authority-check-unlocked", "resumes-interleave",
)  # fmt: skip
FAULT_MUTANTS = ("claim-then-deadline",)
ALL_MUTANTS = (*SEQUENTIAL_MUTANTS, *RACE_MUTANTS, *FAULT_MUTANTS)
# impl/mutants/faults.py: RESTART_MUTANTS, what only a restart of the implementation's process shows.
RESTART_MUTANTS = ("keys-remembered-in-process",)
# impl/mutants/faults.py: NETWORK_MUTANTS, what only an answer lost after a commit shows.
NETWORK_MUTANTS = ("resends-after-a-lost-answer",)
# impl/mutants/service.py: what the nemesis's audit must catch (with the fault mutants).
SERVICE_MUTANTS = (
    "reap-deletes", "finish-retry-settles-again", "finish-ignores-generation", "generation-never-moves",
    "sweep-waits-for-locks", "resend-claim-new-key",
)  # fmt: skip

CHECKER_BUDGET = 200_000  # conformance/concurrent/linearizability.py: DEFAULT_BUDGET
SHRINK_ATTEMPTS = 1_000  # conformance/lockstep/core.py
SHRINK_SECONDS = 60.0  # conformance/lockstep/core.py
KILL_MATRIX_SEED = 20261129  # conformance/evidence/killmatrix.py: SEED
# conformance/evidence/killmatrix.py: KINDS
MUTANT_KINDS = ("sequential", "race", "fault", "service", "restart", "network")
SCORE_SEEDS = (1, 2, 3, 4, 5)  # conformance/evidence/score.py: SEEDS
SCORE_EXAMPLES = 300  # conformance/evidence/score.py: Budget().examples
MIN_SCORE = 0.95  # conformance/evidence/score.py
NEMESIS_FAULTS = (
    "kill", "terminate", "pause", "stall", "restart", "lose-answer", "reset", "delay", "blackhole",
)  # fmt: skip  # conformance/concurrent/nemesis.py: FAULTS
# conformance/queues/subjects/__init__.py: SUBJECTS; conformance/evidence/throughput.py: SUBJECTS
QUEUE_SUBJECTS = (
    "leaseproof", "procrastinate", "pgqueuer", "pg-boss", "graphile-worker", "pgmq", "absurd", "chancy", "oban",
)  # fmt: skip
THROUGHPUT_SUBJECTS = ("floor", "store", "procrastinate", "pgqueuer", "pgqueuer-1")
