"""HTML reports: one self-contained page per run (counterexamples, stress histories, the kill matrix).

Each `write_*` function writes one page into a directory (made if missing) and
returns its path. A page has its style sheet, script and drawings inline and
fetches nothing, so it opens anywhere, offline:

- `write_counterexample_report(dir, verdict, machine=..., implementation=...)`: a
  `verify` verdict; each step of the counterexample with the rows it touched,
  before it, in the model after it and in the implementation after it;
- `write_stress_report(dir, report)`: a `stress` run; a failure's sentence, its
  minimal piece as a timeline with the longest partial order, and the whole
  failing history with its sessions, leases, generations, reaps and clock moves;
- `write_history_report(dir, history, result)`: any one history and its check;
- `write_replay_report(dir, results)`: a `replay` batch, each trace's result;
- `write_matrix_report(dir, matrix)`: the kill matrix, each row linked to its
  counterexample.
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
