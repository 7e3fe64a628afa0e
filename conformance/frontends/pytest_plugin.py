"""The pytest plugin: run leaseproof's conformance machines inside a service's own test run.

Registered through the `pytest11` entry point, so installing leaseproof is
enough. A service names its adapter in its pytest configuration:

    [tool.pytest.ini_options]
    leaseproof_adapter = "myservice.leaseproof_adapter:make"   # in-process, or
    leaseproof_adapter_cmd = "./target/release/delivery-adapter" # over the wire
    leaseproof_max_examples = "200"
    leaseproof_seed = "12345"            # to replay a run; fresh by default, and printed
    leaseproof_accept_subset = "true"    # if the adapter leaves operations out (printed)

and the run gains one test per machine, `leaseproof::delivery`, reported
like any other test (JUnit XML and the rest). Hypothesis settings profiles
apply (`--hypothesis-profile`); the ini value, when set, wins for
max_examples. Every run draws a fresh seed unless `leaseproof_seed` fixes
one, and says which in the terminal summary and in any failure, so a
failure can be replayed. An adapter that leaves operations out fails unless
`leaseproof_accept_subset` accepts a verdict on what it offers. The fixture `leaseproof_postgres` offers the provisioned
server's DSN to the service's own tests; an in-process factory that takes a
`dsn` parameter gets a fresh database on it.
"""

from __future__ import annotations

import inspect
import random
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest
from hypothesis import settings as hypothesis_settings

from leaseproof.conformance.boundary.protocols import DeliveryAdapter
from leaseproof.conformance.boundary.wire import SubprocessAdapter
from leaseproof.conformance.lockstep.verify import run_conformance

if TYPE_CHECKING:
    from _pytest._code.code import TerminalRepr  # what Item.repr_failure returns; pytest exports no public name

_SESSION_SERVER: Any = None


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini("leaseproof_adapter", "MODULE:FACTORY of an in-process leaseproof adapter", default="")
    parser.addini("leaseproof_adapter_cmd", "command of an out-of-process leaseproof adapter", default="")
    parser.addini(
        "leaseproof_max_examples", "generated programs per machine (default: the Hypothesis profile's)", default=""
    )
    parser.addini("leaseproof_seed", "seed of the generated programs (default: a fresh one, printed)", default="")
    parser.addini(
        "leaseproof_accept_subset",
        "accept a verdict on the operations an adapter offers when it leaves some out (default: false)",
        type="bool",
        default=False,
    )
    parser.addini("leaseproof_dsn", "PostgreSQL server for the leaseproof_postgres fixture", default="")


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getini("leaseproof_adapter") or config.getini("leaseproof_adapter_cmd"):
        items.append(ConformanceItem.from_parent(session, name="delivery", nodeid="leaseproof::delivery"))


class ConformanceItem(pytest.Item):
    """The delivery machine, in lockstep against the configured adapter."""

    def runtest(self) -> None:
        config = self.config
        seed_value = config.stash[_SEED]
        replay = f"(seed {seed_value}: set leaseproof_seed = \"{seed_value}\" to replay)"
        with _configured_adapter(config) as adapter:
            profile = hypothesis_settings.default
            assert profile is not None  # Hypothesis loads its default profile on import
            examples = config.getini("leaseproof_max_examples")
            verdict = run_conformance(
                adapter,
                max_examples=int(examples) if examples else profile.max_examples,
                seed_value=seed_value,
                steps=profile.stateful_step_count,
            )
        summary = f"leaseproof::{self.name} {replay}"
        if verdict.fault:
            raise ConformanceFailure(f"the adapter failed, nothing was judged {replay}:\n{verdict.fault}")
        if not verdict.conforms:
            program = "\n".join(f"  {line}" for line in verdict.counterexample.splitlines())
            raise ConformanceFailure(
                f"{adapter.name} does not conform to the delivery model {replay}\n"
                f"minimal counterexample:\n{program}\n{verdict.failure}"
            )
        if verdict.subset():
            if not config.getini("leaseproof_accept_subset"):
                raise ConformanceFailure(
                    f"{adapter.name} conforms only on a subset {replay}: {verdict.subset()}\n"
                    "implement them, or set leaseproof_accept_subset = true to accept a verdict on these alone"
                )
            summary += f": conforms on a subset, accepted by leaseproof_accept_subset ({verdict.subset()})"
        else:
            summary += ": conforms"
        config.stash.setdefault(_SUMMARY, []).append(summary)

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> str | TerminalRepr:
        if isinstance(excinfo.value, ConformanceFailure):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style)

    def reportinfo(self) -> tuple[str, int | None, str]:
        return "leaseproof", None, self.name


_SUMMARY = pytest.StashKey[list[str]]()
_SEED = pytest.StashKey[int]()


def pytest_configure(config: pytest.Config) -> None:
    """The run's seed, read (a bad one is a usage error before anything runs) or drawn."""
    config.stash[_SEED] = _seed(config)


def _seed(config: pytest.Config) -> int:
    """The ini's seed, else a fresh one."""
    text = config.getini("leaseproof_seed").strip()
    if not text:
        return random.randrange(2**63)
    try:
        value = int(text)
    except ValueError:
        raise pytest.UsageError(f"leaseproof_seed = {text!r}: not an integer") from None
    if not 0 <= value < 2**63:
        raise pytest.UsageError(f"leaseproof_seed = {text}: must be between 0 and 2**63 - 1")
    return value


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    """Each machine's seed and verdict, so a passing run can be replayed and a subset is seen."""
    lines = config.stash.get(_SUMMARY, [])
    if lines:
        terminalreporter.section("leaseproof")
        for line in lines:
            terminalreporter.write_line(line)


class ConformanceFailure(AssertionError):
    """The configured implementation does not conform, or its adapter failed."""


class _configured_adapter:  # noqa: N801 - used as a context manager
    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.stack: list[Any] = []

    def __enter__(self) -> DeliveryAdapter:
        command = self.config.getini("leaseproof_adapter_cmd")
        if command:
            self.adapter: DeliveryAdapter = SubprocessAdapter(command)
            return self.adapter
        # The CLI's loader, one spelling of MODULE:FACTORY.
        from leaseproof.conformance.frontends.cli import _load_factory

        factory = _load_factory(self.config.getini("leaseproof_adapter"))
        if "dsn" in inspect.signature(factory).parameters:
            from leaseproof.conformance.harness.provision import scratch_database

            database = scratch_database(_server(self.config))
            self.stack.append(database)
            self.adapter = factory(dsn=database.__enter__())
        else:
            self.adapter = factory()
        return self.adapter

    def __exit__(self, *exc: object) -> None:
        self.adapter.close()
        for context in reversed(self.stack):
            context.__exit__(None, None, None)


def _server(config: pytest.Config) -> Any:
    """One provisioned server per test session, stopped when the session ends."""
    global _SESSION_SERVER
    if _SESSION_SERVER is None:
        from leaseproof.conformance.harness.provision import postgres_server

        context = postgres_server(config.getini("leaseproof_dsn") or None)
        _SESSION_SERVER = (context, context.__enter__())
        config.add_cleanup(_stop_server)
    return _SESSION_SERVER[1]


def _stop_server() -> None:
    global _SESSION_SERVER
    if _SESSION_SERVER is not None:
        context, _ = _SESSION_SERVER
        _SESSION_SERVER = None
        context.__exit__(None, None, None)


@pytest.fixture(scope="session")
def leaseproof_postgres(pytestconfig: pytest.Config) -> Iterator[str]:
    """The DSN of leaseproof's provisioned PostgreSQL (maintenance database, superuser)."""
    yield _server(pytestconfig).dsn


__all__ = ["ConformanceItem", "leaseproof_postgres"]
