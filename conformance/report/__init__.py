"""HTML reports: one self-contained page per run (counterexamples, stress histories, the kill matrix).

Each `write_*` function writes one page into a directory (made if missing) and returns its
path. A page has its style sheet, script and drawings inline and fetches nothing, so it opens
anywhere, offline: `write_counterexample_report` (a `verify` verdict: each step with the rows
it touched, before it, in the model after it and in the implementation after it),
`write_stress_report` (a `stress` run: a failure's minimal piece as a timeline with the
longest partial order, and the whole failing history), `write_history_report` (any one
history and its check), `write_replay_report` (a `replay` batch) and `write_matrix_report`
(the kill matrix, each row linked to its counterexample). docs/reports.md shows each page.
"""

from leaseproof.conformance.report.counterexample import (
    ReplayResult,
    TraceRun,
    run_trace,
    write_counterexample_report,
    write_replay_report,
)
from leaseproof.conformance.report.matrix import write_matrix_report
from leaseproof.conformance.report.stress import write_history_report, write_stress_report

__all__ = [
    "ReplayResult",
    "TraceRun",
    "run_trace",
    "write_counterexample_report",
    "write_history_report",
    "write_matrix_report",
    "write_replay_report",
    "write_stress_report",
]
