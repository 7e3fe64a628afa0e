"""The checker benchmark runs end to end on tiny sizes and judges every history linearizable."""

from __future__ import annotations

import pytest

from leaseproof.conformance.concurrent import bench
from leaseproof.conformance.concurrent.linearizability import check


def test_the_benchmark_prints_one_row_per_size_all_linearizable(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench.main(["--sizes", "200,50,400", "--seed", "3", "--clients", "4"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "delivery histories, 4 clients, seed 3"
    assert lines[1].split() == [
        "operations",
        "epochs",
        "partitions",
        "configurations",
        "seconds",
        "peak",
        "MiB",
        "×",
        "50",
        "verdict",
    ]
    rows = [line.split() for line in lines[2:]]
    assert [row[0] for row in rows] == ["50", "200", "400"]  # smallest first: it is the base of the ratios
    for row in rows:
        assert len(row) == 8 and row[-1] == "linearizable"
        operations, epochs, partitions, configurations = (int(cell.replace(",", "")) for cell in row[:4])
        assert 0 < epochs <= operations and epochs <= partitions and configurations >= operations
        assert float(row[4]) >= 0 and float(row[5]) >= 0 and float(row[6]) > 0
    assert rows[0][6] == "1.0"


def test_the_benchmark_reports_a_history_it_cannot_pass(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # A checker that judges nothing linearizable must make the benchmark fail, not print a pass.
    monkeypatch.setattr(bench, "check", lambda history, spec: check(history, spec, budget=0))
    assert bench.main(["--sizes", "30"]) == 1
    assert capsys.readouterr().out.splitlines()[-1].split()[-1] == "unknown"
