"""The pytest plugin, as a service would use it: its own project, its own pytest run."""

from __future__ import annotations

import shlex
import sys

import pytest
from helpers import write_adapters

from leaseproof.conformance.harness.server import Server


def _project(pytester: pytest.Pytester, **ini: str) -> None:
    lines = "\n".join(f"{key} = {value}" for key, value in ini.items())
    pytester.makeini(f"[pytest]\n{lines}\n")
    pytester.makepyfile(test_service="def test_the_services_own_test():\n    assert True\n")


def test_the_machine_runs_inside_the_services_pytest_run(pytester: pytest.Pytester, pg_server: Server) -> None:
    _project(
        pytester,
        leaseproof_adapter="leaseproof.impl.delivery.adapter:PostgresDeliveryAdapter",
        leaseproof_dsn=pg_server.dsn,
        leaseproof_max_examples="5",
    )
    result = pytester.runpytest_subprocess("-v", "--junitxml=report.xml")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*leaseproof::delivery PASSED*"])
    assert '<testcase classname="leaseproof" name="delivery"' in (pytester.path / "report.xml").read_text()


def test_a_nonconforming_adapter_fails_with_the_counterexample(pytester: pytest.Pytester, pg_server: Server) -> None:
    command = (
        f"{sys.executable} -m leaseproof.conformance.boundary.serve"
        f" --dsn {shlex.quote(pg_server.dsn)} --mutant lease-target-unbound"
    )
    _project(pytester, leaseproof_adapter_cmd=command, leaseproof_max_examples="5")
    result = pytester.runpytest_subprocess()
    result.assert_outcomes(passed=2, failed=1)  # the service's test and the lifecycle machine pass
    result.stdout.fnmatch_lines(["*does not conform to the delivery model*", "*minimal counterexample*"])


def test_without_configuration_nothing_is_added(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_service="def test_own():\n    assert True\n")
    result = pytester.runpytest_subprocess()
    result.assert_outcomes(passed=1)
    assert "leaseproof::delivery" not in result.stdout.str()


def test_the_provisioned_server_is_a_fixture(pytester: pytest.Pytester, pg_server: Server) -> None:
    pytester.makeini(f"[pytest]\nleaseproof_dsn = {pg_server.dsn}\n")
    pytester.makepyfile(
        test_service=(
            "import psycopg\n"
            "def test_uses_it(leaseproof_postgres):\n"
            "    with psycopg.connect(leaseproof_postgres) as conn:\n"
            "        assert conn.execute('SELECT 1').fetchone() == (1,)\n"
        )
    )
    result = pytester.runpytest_subprocess()
    result.assert_outcomes(passed=1)


def _seed_line(result: pytest.RunResult) -> str:
    return next(line for line in result.stdout.lines if line.startswith("leaseproof::delivery (seed "))


def test_each_run_draws_a_fresh_seed_and_prints_it(pytester: pytest.Pytester, pg_server: Server) -> None:
    ini = {
        "leaseproof_adapter": "leaseproof.impl.delivery.adapter:PostgresDeliveryAdapter",
        "leaseproof_dsn": pg_server.dsn,
        "leaseproof_max_examples": "3",
    }
    _project(pytester, **ini)
    first, second = pytester.runpytest_subprocess(), pytester.runpytest_subprocess()
    first.assert_outcomes(passed=2)
    assert _seed_line(first) != _seed_line(second)  # two fresh seeds out of 2**63
    assert _seed_line(first).endswith(": conforms")
    _project(pytester, **ini, leaseproof_seed="12345")
    fixed = pytester.runpytest_subprocess()
    assert _seed_line(fixed).startswith('leaseproof::delivery (seed 12345: set leaseproof_seed = "12345" to replay)')
    _project(pytester, **ini, leaseproof_seed="twelve")
    assert "leaseproof_seed = 'twelve': not an integer" in pytester.runpytest_subprocess().stderr.str()


def test_an_adapter_that_leaves_operations_out_fails_unless_the_subset_is_accepted(
    pytester: pytest.Pytester, pg_server: Server
) -> None:
    write_adapters(pytester.path)
    ini = {"leaseproof_adapter": "adapters:core_only", "leaseproof_dsn": pg_server.dsn, "leaseproof_max_examples": "3"}
    _project(pytester, **ini, pythonpath=".")
    refused = pytester.runpytest_subprocess()
    refused.assert_outcomes(passed=1, failed=1)
    refused.stdout.fnmatch_lines(["*conforms only on a subset*not checked: *DeleteRun*", "*leaseproof_accept_subset*"])
    _project(pytester, **ini, pythonpath=".", leaseproof_accept_subset="true")
    accepted = pytester.runpytest_subprocess()
    accepted.assert_outcomes(passed=2)
    assert "conforms on a subset, accepted by leaseproof_accept_subset" in _seed_line(accepted)
