"""verify's counts say what they count: its progress never passes its total, and its
summary gives the programs generated under --max-examples, those sent and those that
repeated one already sent, a failure's place as the progress numbered it, and the
shrinking apart.

Hypothesis starts more programs than max_examples when it abandons some part-way (it
ran out of choices, or a draw was rejected): those do not count toward the budget, and
it generates others in their place. A machine with a rule that rejects some of its draws
makes that happen on every seed; before these counts, its progress read "example 23/20"
and the summary counted 21 programs sent for 20 asked."""

from __future__ import annotations

import io
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import leaseproof
from hypothesis import HealthCheck, Phase, reject, seed, settings
from hypothesis import strategies as st
from hypothesis.stateful import rule, run_state_machine_as_test

from leaseproof.conformance.boundary.protocols import offered_operations
from leaseproof.conformance.frontends.commands.verify import _Progress, _summary
from leaseproof.conformance.harness.server import Server
from leaseproof.conformance.lockstep.core import Coverage, bind, release
from leaseproof.conformance.lockstep.delivery import DeliveryConformance
from leaseproof.conformance.lockstep.verify import Verdict
from leaseproof.impl.delivery.adapter import PostgresDeliveryAdapter

EXAMPLE = re.compile(r"^  example ([\d,]+)/([\d,]+)")


class _Rejecting(DeliveryConformance):
    """The delivery lockstep, plus a rule that rejects one draw in four: a program that
    takes it with that draw is abandoned by Hypothesis."""

    @rule(draw=st.integers(0, 3))
    def sometimes_rejected(self, draw: int) -> None:
        if draw == 0:
            reject()


class _Lines(_Progress):
    """verify's progress, every line it would show kept (a terminal shows each one)."""

    def __init__(self, total: int) -> None:
        super().__init__(total, io.StringIO())
        self.lines: list[str] = []

    def show(self, line: str, at: float) -> None:
        self.lines.append(line)


@pytest.fixture
def delivery(delivery_dsn: str) -> Iterator[PostgresDeliveryAdapter]:
    adapter = PostgresDeliveryAdapter(delivery_dsn)
    yield adapter
    adapter.close()


def test_programs_hypothesis_abandons_are_counted_apart(delivery: PostgresDeliveryAdapter) -> None:
    asked = 20
    coverage = Coverage()
    progress = _Lines(asked)
    bound = seed(3)(bind(_Rejecting, delivery, coverage, progress, offered_operations(delivery)))
    config = settings(
        max_examples=asked, deadline=None, database=None, phases=[Phase.generate],
        suppress_health_check=list(HealthCheck), stateful_step_count=20,
    )  # fmt: skip
    try:
        run_state_machine_as_test(bound, settings=config)
    finally:
        release(bound)
    assert coverage.discarded > 0, "no program was abandoned: the test shows nothing"
    assert coverage.generated == asked + coverage.discarded  # Hypothesis made up for each one
    assert coverage.counted == asked
    sent = coverage.examples - coverage.discarded_sent
    assert sent + coverage.repeats == asked
    numbers = [(int(m[1]), int(m[2])) for m in map(EXAMPLE.match, progress.lines) if m]
    assert len(numbers) == coverage.generated
    assert all(n <= total == asked for n, total in numbers), numbers
    assert numbers[-1][0] == asked
    assert any("abandoned by Hypothesis, not counted" in line for line in progress.lines)
    out = io.StringIO()
    _summary(Verdict(True, coverage, 1.0, 3), out, asked)
    line = out.getvalue().splitlines()[0]
    repeats = "repeat" if coverage.repeats == 1 else "repeats"
    assert (
        f"examples: {asked} of {asked} generated ({sent} sent, {coverage.repeats} {repeats} of a program already "
        f"sent, not sent again); and {coverage.discarded} abandoned by Hypothesis part-way"
    ) in line, line


def _examples(stdout: str) -> str:
    summary = next(line for line in stdout.splitlines() if line.startswith("scenarios: "))
    return summary.split("   examples: ")[1].split("   steps: ")[0]


def test_a_conforming_run_counts_the_programs_asked_for(pg_server: Server, tmp_path: Path) -> None:
    run = leaseproof(
        "verify", "--dsn", pg_server.dsn, "--machine", "delivery", "--no-scenarios", "--max-examples", "12",
        "--seed", "3", cwd=tmp_path,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    found = re.fullmatch(r"12 of 12 generated \((\d+) sent, (\d+) repeats? of a program already sent, not sent again\)",
                         _examples(run.stdout))  # fmt: skip
    assert found is not None, _examples(run.stdout)
    assert int(found[1]) + int(found[2]) == 12
    numbers = [int(m[1]) for m in map(EXAMPLE.match, run.stderr.splitlines()) if m]
    assert numbers[0] == 1 and max(numbers) <= 12, run.stderr


def test_a_failure_is_numbered_as_the_progress_numbered_it_and_its_shrinking_apart(
    pg_server: Server, tmp_path: Path
) -> None:
    run = leaseproof(
        "verify", "--dsn", pg_server.dsn, "--mutant", "claim-newest-first", "--no-scenarios", "--seed", "4",
        "--max-examples", "20", "--shrink-attempts", "30", cwd=tmp_path,
    )  # fmt: skip
    assert run.returncode == 1, run.stdout + run.stderr
    examples = _examples(run.stdout)
    found = re.fullmatch(
        r"the first failure in example (\d+) of 20 \((\d+) sent, (\d+) repeats? of a program already sent\); "
        r"then ([\d,]+) programs run to shrink and report it \((\d+) sent\)",
        examples,
    )
    assert found is not None, examples
    failed_in, sent, repeats, attempts = int(found[1]), int(found[2]), int(found[3]), int(found[4])
    assert sent + repeats == failed_in <= 20 and attempts > 0
    progress = run.stderr.splitlines()
    shrinking = [line for line in progress if "shrinking, attempt" in line]
    assert shrinking and all(line.startswith(f"  failed in example {failed_in}; ") for line in shrinking), progress
    before = [int(m[1]) for m in map(EXAMPLE.match, progress) if m]
    assert before and max(before) <= failed_in, progress
