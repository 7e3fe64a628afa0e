"""The plugin's items as a separate project's pytest run collects them: counted,
selected by path, -k, -m and --deselect, one per machine."""

from __future__ import annotations

import sys

import pytest

from leaseproof.conformance.harness.server import Server

OWN_TESTS = "def test_x():\n    pass\n\n\ndef test_y():\n    pass\n"
BOTH = ["leaseproof::delivery", "leaseproof::lifecycle"]
OWN = ["tests/test_x.py::test_x", "tests/test_x.py::test_y"]

# Over the wire, one machine only: the bundled delivery implementation on the database named by argv[1].
DELIVERY_ONLY = """\
import sys

from leaseproof.conformance.boundary.serving import serve, stdout_for_protocol
from leaseproof.impl.delivery.adapter import PostgresDeliveryAdapter

serve(PostgresDeliveryAdapter(sys.argv[1]), implementation="delivery alone", stdout=stdout_for_protocol())
"""


def _project(pytester: pytest.Pytester, **ini: str) -> None:
    """A service's project: its own tests in tests/, and leaseproof named in its pytest.ini."""
    lines = "\n".join(f"{key} = {value}" for key, value in ini.items())
    pytester.makeini(f"[pytest]\nmarkers =\n    slow: a slow test\n{lines}\n")
    (pytester.path / "tests").mkdir(exist_ok=True)
    (pytester.path / "tests" / "test_x.py").write_text(OWN_TESTS)


def _collected(result: pytest.RunResult) -> list[str]:
    """The node ids `--collect-only -q` lists."""
    return [line for line in result.stdout.lines if "::" in line and not line.startswith(("=", "ERROR"))]


@pytest.mark.parametrize(
    ("args", "listed", "tail"),
    [
        ((), OWN + BOTH, "4 tests collected"),
        ((".",), OWN + BOTH, "4 tests collected"),  # the rootdir, named
        (("tests/test_x.py::test_y",), OWN[1:], "1 test collected"),  # a path narrows the run
        (("tests",), OWN, "2 tests collected"),
        (("leaseproof",), BOTH, "2 tests collected"),
        (("leaseproof::lifecycle",), BOTH[1:], "1 test collected"),
        (("tests/test_x.py::test_x", "leaseproof::delivery"), [*OWN[:1], *BOTH[:1]], "2 tests collected"),
        (("-m", "slow"), [], "no tests collected (4 deselected)"),
        (("-m", "leaseproof"), BOTH, "2/4 tests collected (2 deselected)"),
        (("-m", "not leaseproof"), OWN, "2/4 tests collected (2 deselected)"),
        (("-k", "lifecycle"), BOTH[1:], "1/4 tests collected (3 deselected)"),
        (("--deselect", "leaseproof::delivery"), [*OWN, *BOTH[1:]], "3/4 tests collected (1 deselected)"),
    ],
)
def test_the_items_are_collected_counted_and_selected_like_the_projects_own(
    pytester: pytest.Pytester, args: tuple[str, ...], listed: list[str], tail: str
) -> None:
    _project(pytester, leaseproof_adapter_cmd="./adapter-never-started-by-collection")
    result = pytester.runpytest_subprocess("--collect-only", "-q", *args)
    assert _collected(result) == listed
    assert result.stdout.lines[-1].startswith(tail), result.stdout.lines[-1]


def test_a_bare_run_from_a_subfolder_collects_them_too(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    _project(pytester, leaseproof_adapter_cmd="./adapter")
    monkeypatch.chdir(pytester.path / "tests")
    result = pytester.runpytest_subprocess("--collect-only", "-q")
    assert _collected(result) == OWN + BOTH
    assert result.stdout.lines[-1].startswith("4 tests collected")


def test_leaseproof_markers_adds_the_projects_own_markers(pytester: pytest.Pytester) -> None:
    _project(pytester, leaseproof_adapter_cmd="./adapter", leaseproof_markers="slow")
    result = pytester.runpytest_subprocess("--collect-only", "-q", "-m", "slow")
    assert _collected(result) == BOTH


def test_the_in_process_boundary_has_the_delivery_machine_alone(pytester: pytest.Pytester) -> None:
    _project(pytester, leaseproof_adapter="pkg:make")
    result = pytester.runpytest_subprocess("--collect-only", "-q")
    assert _collected(result) == [*OWN, "leaseproof::delivery"]
    _project(pytester, leaseproof_adapter="pkg:make", leaseproof_machines="lifecycle")
    refused = pytester.runpytest_subprocess("--collect-only", "-q")
    assert refused.ret == pytest.ExitCode.USAGE_ERROR
    assert (
        "leaseproof_machines = lifecycle: no machine 'lifecycle' (the in-process boundary (leaseproof_adapter)"
        " carries the delivery machine alone)"
    ) in refused.stderr.str()


@pytest.mark.parametrize(
    ("args", "ini", "message"),
    [
        (("leaseproof::nosuch",), {"leaseproof_adapter_cmd": "./a"}, "leaseproof::nosuch: no such leaseproof machine"),
        (
            ("leaseproof",),
            {},
            "leaseproof: no adapter is configured (set leaseproof_adapter or leaseproof_adapter_cmd)",
        ),
        (
            ("leaseproof::lifecycle",),
            {"leaseproof_adapter_cmd": "./a", "leaseproof_machines": "delivery"},
            "leaseproof::lifecycle: not a machine of this run (leaseproof_machines or the adapter's: delivery)",
        ),
    ],
)
def test_naming_a_machine_that_is_not_there_is_a_usage_error(
    pytester: pytest.Pytester, args: tuple[str, ...], ini: dict[str, str], message: str
) -> None:
    _project(pytester, **ini)
    result = pytester.runpytest_subprocess("--collect-only", *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert f"ERROR: {message}" in result.stderr.str()


def _delivery_only(pytester: pytest.Pytester, dsn: str, **ini: str) -> None:
    (pytester.path / "delivery_only.py").write_text(DELIVERY_ONLY)
    # Relative to the rootdir, as the README's example is.
    _project(pytester, leaseproof_adapter_cmd=f"{sys.executable} delivery_only.py '{dsn}'", **ini)


def test_a_machine_the_adapter_does_not_offer_is_skipped_and_one_named_fails(
    pytester: pytest.Pytester, scratch_dsn: str
) -> None:
    _delivery_only(pytester, scratch_dsn, leaseproof_max_examples="2")
    result = pytester.runpytest_subprocess("-rs", "leaseproof")
    result.assert_outcomes(passed=1, skipped=1)
    result.stdout.fnmatch_lines(
        ["*leaseproof_adapter_cmd = * does not offer the lifecycle machine (its hello offers: delivery)"]
    )
    _delivery_only(pytester, scratch_dsn, leaseproof_max_examples="2", leaseproof_machines="delivery lifecycle")
    named = pytester.runpytest_subprocess("leaseproof")
    named.assert_outcomes(passed=1, failed=1)
    named.stdout.fnmatch_lines(
        ["leaseproof_machines names lifecycle, but leaseproof_adapter_cmd = * does not offer it*"]
    )


def test_each_machine_runs_as_its_own_item_also_under_xdist(pytester: pytest.Pytester, pg_server: Server) -> None:
    command = f"{sys.executable} -m leaseproof.conformance.boundary.serve --dsn '{pg_server.dsn}'"
    _project(pytester, leaseproof_adapter_cmd=command, leaseproof_max_examples="2")
    result = pytester.runpytest_subprocess("-n", "2", "-v")
    result.assert_outcomes(passed=4)
    # The verdicts come back from the workers' reports to the summary.
    verdicts = sorted(line.split(" (seed ")[0] for line in result.stdout.lines if line.endswith(": conforms"))
    assert verdicts == BOTH


def test_a_relative_adapter_command_is_the_rootdirs_wherever_pytest_runs(
    pytester: pytest.Pytester, scratch_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _delivery_only(pytester, scratch_dsn, leaseproof_max_examples="2", leaseproof_machines="delivery")
    monkeypatch.chdir(pytester.path / "tests")
    result = pytester.runpytest_subprocess()
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines(["leaseproof::delivery (seed *): conforms"])
