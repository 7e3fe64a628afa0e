"""The plugin's runs in a separate project: failures in its own words naming the
ini keys, trace files, the reply timeout, the Hypothesis profile, seeds,
database and statistics, and the per-test database fixture."""

from __future__ import annotations

import json
import re
import shlex
import sys
from pathlib import Path

import psycopg
import pytest
from helpers import printed_replay, run_as_printed
from psycopg.conninfo import conninfo_to_dict

from leaseproof.conformance.harness.server import Server
from leaseproof.conformance.traces.trace import read, replay
from leaseproof.impl.delivery.adapter import PostgresDeliveryAdapter
from leaseproof.impl.mutants import by_name
from leaseproof.impl.mutants.delivery import MUTANTS

BUNDLED = "leaseproof.impl.delivery.adapter:PostgresDeliveryAdapter"

# Hypothesis profiles the project's conftest registers, and an example database
# that notes each key it is asked for.
PROFILES = """\
import datetime as dt

from hypothesis import Phase, settings
from hypothesis.database import InMemoryExampleDatabase


class Noting(InMemoryExampleDatabase):
    def fetch(self, key):
        with open("fetched.log", "a") as log:
            log.write(key.hex() + "\\n")
        return super().fetch(key)


settings.register_profile("few", max_examples=3, stateful_step_count=4)
settings.register_profile("noted", max_examples=2, database=Noting())
settings.register_profile("tight", max_examples=2, deadline=dt.timedelta(microseconds=1))
settings.register_profile("scenarios", phases=[Phase.explicit])
"""


def _project(pytester: pytest.Pytester, **ini: str) -> None:
    lines = "\n".join(f"{key} = {value}" for key, value in ini.items())
    pytester.makeini(f"[pytest]\n{lines}\n")
    (pytester.path / "tests").mkdir(exist_ok=True)
    (pytester.path / "tests" / "test_service.py").write_text("def test_own():\n    pass\n")


def _bundled(pytester: pytest.Pytester, server: Server, **ini: str) -> None:
    _project(pytester, leaseproof_adapter=BUNDLED, leaseproof_dsn=server.dsn, **ini)
    (pytester.path / "conftest.py").write_text(PROFILES)


def _failure(result: pytest.RunResult, name: str = "leaseproof::delivery") -> list[str]:
    """The lines of one item's failure report, between its header and the next section."""
    lines = result.stdout.lines
    start = next(i for i, line in enumerate(lines) if line.startswith("_") and f" {name} " in line)
    end = next(i for i in range(start + 1, len(lines)) if lines[i].startswith(("=", "_")))
    return lines[start + 1 : end]


def _verdict(result: pytest.RunResult, name: str = "leaseproof::delivery") -> str:
    """The item's line in the terminal summary's leaseproof section."""
    return next(line for line in result.stdout.lines if line.startswith(f"{name} (seed "))


# -- failures in the plugin's own words -----------------------------------------------


def test_a_factory_that_does_not_load_is_reported_under_the_ini_key(pytester: pytest.Pytester) -> None:
    _project(pytester, leaseproof_adapter="nosuch.module:make")
    result = pytester.runpytest_subprocess()
    result.assert_outcomes(passed=1, failed=1)
    assert _failure(result) == ["leaseproof_adapter = 'nosuch.module:make': cannot load it: No module named 'nosuch'"]
    assert "--adapter" not in result.stdout.str()


def test_a_factory_that_raises_is_the_adapters_failure_in_one_line(pytester: pytest.Pytester) -> None:
    (pytester.path / "broken.py").write_text("def make():\n    raise RuntimeError('no config file')\n")
    _project(pytester, leaseproof_adapter="broken:make", pythonpath=".")
    result = pytester.runpytest_subprocess()
    result.assert_outcomes(passed=1, failed=1)
    assert _failure(result) == ["leaseproof_adapter = 'broken:make': the factory failed: RuntimeError: no config file"]


def test_an_adapter_command_that_cannot_start_is_reported_under_the_ini_key(pytester: pytest.Pytester) -> None:
    _project(pytester, leaseproof_adapter_cmd="./no-such-adapter --fast", leaseproof_machines="delivery")
    result = pytester.runpytest_subprocess()
    result.assert_outcomes(passed=1, failed=1)
    assert _failure(result) == [
        "leaseproof_adapter_cmd = './no-such-adapter --fast': could not start the adapter './no-such-adapter --fast':"
        " [Errno 2] No such file or directory: './no-such-adapter'"
    ]


@pytest.mark.parametrize(
    ("ini", "message"),
    [
        ({"leaseproof_max_examples": "many"}, "leaseproof_max_examples = 'many': not an integer"),
        ({"leaseproof_max_examples": "0"}, "leaseproof_max_examples = 0: must be at least 1"),
        ({"leaseproof_reply_timeout": "soon"}, "leaseproof_reply_timeout = 'soon': not a number of seconds"),
        ({"leaseproof_reply_timeout": "-1"}, "leaseproof_reply_timeout = -1: must be a positive number of seconds"),
        ({"leaseproof_seed": "-3"}, "leaseproof_seed = -3: must be between 0 and 2**63 - 1"),
        ({"leaseproof_machines": "delivery queue"}, "leaseproof_machines = delivery queue: no machine 'queue'"),
        ({"leaseproof_markers": "not-a-name"}, "leaseproof_markers = not-a-name: 'not-a-name' is not a marker name"),
        ({"leaseproof_adapter": "pkg:make"}, "leaseproof_adapter = 'pkg:make' and leaseproof_adapter_cmd = './a'"),
    ],
)
def test_a_bad_ini_value_is_a_usage_error_naming_the_key(
    pytester: pytest.Pytester, ini: dict[str, str], message: str
) -> None:
    _project(pytester, leaseproof_adapter_cmd="./a", **ini)
    result = pytester.runpytest_subprocess()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert f"ERROR: {message}" in result.stderr.str()
    assert "Traceback" not in result.stderr.str()


SILENT = "import sys\nsys.stdin.read()  # reads every request, answers none\n"


def test_the_reply_timeout_is_an_ini_key(pytester: pytest.Pytester) -> None:
    (pytester.path / "silent.py").write_text(SILENT)
    command = f"{sys.executable} silent.py"
    _project(pytester, leaseproof_adapter_cmd=command, leaseproof_reply_timeout="0.4", leaseproof_machines="delivery")
    result = pytester.runpytest_subprocess()
    result.assert_outcomes(passed=1, failed=1)
    assert _failure(result) == [
        f"leaseproof_adapter_cmd = {command!r}: adapter {command!r} failed: no reply to 'hello' within 0.4s",
        "(leaseproof_reply_timeout: 0.4 seconds for each reply)",
    ]


# -- trace files ------------------------------------------------------------------------


def _mutant_project(pytester: pytest.Pytester, server: Server, **ini: str) -> None:
    command = (
        f"{sys.executable} -m leaseproof.conformance.boundary.serve"
        f" --dsn {shlex.quote(server.dsn)} --mutant lease-target-unbound"
    )
    _project(pytester, leaseproof_adapter_cmd=command, leaseproof_max_examples="3", **ini)


def _trace_named(result: pytest.RunResult) -> Path:
    line = next(line for line in _failure(result) if line.startswith("trace: "))
    return Path(line.removeprefix("trace: ").split(" (the counterexample")[0])


def test_a_counterexample_is_written_as_a_trace_in_the_rootdir_by_default(
    pytester: pytest.Pytester, pg_server: Server, delivery_dsn: str, adapter: PostgresDeliveryAdapter
) -> None:
    _mutant_project(pytester, pg_server, leaseproof_machines="delivery", leaseproof_seed="11")
    result = pytester.runpytest_subprocess()
    result.assert_outcomes(passed=1, failed=1)
    path = _trace_named(result)
    assert path == pytester.path / "leaseproof-delivery-counterexample-11.jsonl"
    assert f"does not conform; trace: {path}" in _verdict(result)
    trace = read(path)
    assert trace.machine == "delivery"
    # It is the counterexample: the bundled implementation does not diverge on it, the mutant
    # does. (In that order: the mutant's adapter puts its functions in the database they share.)
    assert replay(trace, adapter) is None
    mutant = by_name(MUTANTS, "lease-target-unbound").adapter(delivery_dsn)
    try:
        assert replay(trace, mutant) is not None
    finally:
        mutant.close()


def test_the_printed_replay_run_as_printed_meets_the_same_failure(pytester: pytest.Pytester, pg_server: Server) -> None:
    _mutant_project(pytester, pg_server, leaseproof_machines="delivery", leaseproof_seed="11")
    result = pytester.runpytest_subprocess()
    result.assert_outcomes(passed=1, failed=1)
    command = printed_replay("\n".join(_failure(result)))
    assert "--mutant lease-target-unbound" in command  # inside the quoted --adapter-cmd
    replayed = run_as_printed(command, pytester.path)
    assert replayed.returncode == 1, replayed.stdout + replayed.stderr
    assert "0 passed, 1 failed" in replayed.stdout


def test_leaseproof_trace_dir_is_relative_to_the_rootdir(
    pytester: pytest.Pytester, pg_server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    _mutant_project(pytester, pg_server, leaseproof_machines="delivery", leaseproof_trace_dir="out/traces")
    monkeypatch.chdir(pytester.path / "tests")
    result = pytester.runpytest_subprocess()
    result.assert_outcomes(passed=1, failed=1)
    path = _trace_named(result)
    assert path.parent == pytester.path / "out" / "traces"
    assert json.loads(path.read_text().splitlines()[0])["machine"] == "delivery"


# -- Hypothesis ---------------------------------------------------------------------------


def _statistics(result: pytest.RunResult) -> str:
    text = result.stdout.str()
    assert "Hypothesis Statistics" in text
    return text.split("Hypothesis Statistics", 1)[1]


def test_the_profile_sets_the_counts_and_statistics_are_shown(pytester: pytest.Pytester, pg_server: Server) -> None:
    _bundled(pytester, pg_server)
    result = pytester.runpytest_subprocess("--hypothesis-profile", "few", "--hypothesis-show-statistics")
    result.assert_outcomes(passed=2)
    statistics = _statistics(result)
    assert "leaseproof::delivery:" in statistics
    assert "Stopped because settings.max_examples=3" in statistics
    # The ini's count wins over the profile's.
    _bundled(pytester, pg_server, leaseproof_max_examples="2")
    ini = pytester.runpytest_subprocess("--hypothesis-profile", "few", "--hypothesis-show-statistics")
    assert "Stopped because settings.max_examples=2" in _statistics(ini)


def test_the_profiles_deadline_applies(pytester: pytest.Pytester, pg_server: Server) -> None:
    _bundled(pytester, pg_server)
    result = pytester.runpytest_subprocess("--hypothesis-profile", "tight")
    result.assert_outcomes(passed=1, failed=1)
    assert any(line.startswith("DeadlineExceeded: ") for line in _failure(result))


def test_the_profiles_phases_apply(pytester: pytest.Pytester, pg_server: Server) -> None:
    _bundled(pytester, pg_server)
    result = pytester.runpytest_subprocess("--hypothesis-profile", "scenarios", "--hypothesis-show-statistics")
    result.assert_outcomes(passed=2)
    assert _verdict(result).endswith(
        ": conforms (on the fixed scenarios alone: the Hypothesis profile's phases leave out generate)"
    )
    assert "during generate phase" not in result.stdout.str()


def test_the_profiles_example_database_is_used(pytester: pytest.Pytester, pg_server: Server) -> None:
    _bundled(pytester, pg_server)
    result = pytester.runpytest_subprocess("--hypothesis-profile", "noted")
    result.assert_outcomes(passed=2)
    assert (pytester.path / "fetched.log").read_text().split()  # asked for the machine's stored examples


def test_the_profiles_verbosity_applies(pytester: pytest.Pytester, pg_server: Server) -> None:
    _bundled(pytester, pg_server)
    result = pytester.runpytest_subprocess("-s", "--hypothesis-profile", "few", "--hypothesis-verbosity", "verbose")
    result.assert_outcomes(passed=2)
    assert result.stdout.str().count("Test case: ") >= 3  # Hypothesis's own report of each program


def test_leaseproof_seed_wins_over_hypothesis_seed_which_wins_over_a_fresh_one(
    pytester: pytest.Pytester, pg_server: Server
) -> None:
    _bundled(pytester, pg_server)
    # The seed printed is pinned (42, not a fresh draw): one run shows it comes from the option.
    forced = pytester.runpytest_subprocess("--hypothesis-profile", "few", "--hypothesis-seed", "42")
    assert _verdict(forced).startswith(
        'leaseproof::delivery (seed 42, from --hypothesis-seed 42: set leaseproof_seed = "42" to replay)'
    )
    named = pytester.runpytest_subprocess("--hypothesis-profile", "few", "--hypothesis-seed", "abc")
    seed = re.fullmatch(r"leaseproof::delivery \(seed (\d+), from --hypothesis-seed abc: .*", _verdict(named))
    assert seed is not None  # a string seed becomes an integer one, printed
    _bundled(pytester, pg_server, leaseproof_seed="7")
    fixed = pytester.runpytest_subprocess("--hypothesis-profile", "few", "--hypothesis-seed", "42")
    assert _verdict(fixed).startswith('leaseproof::delivery (seed 7: set leaseproof_seed = "7" to replay)')


# -- the fixtures -------------------------------------------------------------------------

FIXTURE_TESTS = """\
from pathlib import Path

import psycopg


def test_first(leaseproof_database, leaseproof_postgres):
    assert leaseproof_database != leaseproof_postgres
    Path("first.dsn").write_text(leaseproof_database)
    with psycopg.connect(leaseproof_database) as conn:
        conn.execute("CREATE TABLE mine (id int)")


def test_second(leaseproof_database):
    Path("second.dsn").write_text(leaseproof_database)
    with psycopg.connect(leaseproof_database) as conn:
        tables = conn.execute("SELECT count(*) FROM pg_tables WHERE tablename = 'mine'").fetchone()
    assert tables == (0,)  # a fresh database, not the first test's
"""


def test_each_test_gets_a_fresh_database_dropped_after(pytester: pytest.Pytester, pg_server: Server) -> None:
    pytester.makeini(f"[pytest]\nleaseproof_dsn = {pg_server.dsn}\n")
    pytester.makepyfile(test_service=FIXTURE_TESTS)
    result = pytester.runpytest_subprocess()
    result.assert_outcomes(passed=2)
    names = [conninfo_to_dict((pytester.path / f"{which}.dsn").read_text())["dbname"] for which in ("first", "second")]
    assert names[0] != names[1]
    with psycopg.connect(pg_server.dsn) as conn:
        left = conn.execute("SELECT datname FROM pg_database WHERE datname = ANY(%s)", (names,)).fetchall()
    assert left == []
