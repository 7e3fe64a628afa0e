"""The pytest plugin, as a service would use it: its own project, its own pytest run."""

from __future__ import annotations

import shlex
import sys

import pytest

from leaseproof.conformance.harness.provision import Server


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
    result.assert_outcomes(passed=1, failed=1)
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
