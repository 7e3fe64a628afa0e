"""The pytest plugin: run leaseproof's conformance machines inside a service's own test run.

Registered through the `pytest11` entry point, so installing leaseproof is
enough. A service names its adapter in its pytest configuration:

    [tool.pytest.ini_options]
    leaseproof_adapter = "myservice.leaseproof_adapter:make"   # in-process, or
    leaseproof_adapter_cmd = "./target/release/delivery-adapter" # over the wire
    leaseproof_max_examples = "200"

and the run gains one test per machine, `leaseproof::delivery`, reported
like any other test (JUnit XML and the rest). Hypothesis settings profiles
apply (`--hypothesis-profile`); the ini value, when set, wins for
max_examples. The fixture `leaseproof_postgres` offers the provisioned
server's DSN to the service's own tests; an in-process factory that takes a
`dsn` parameter gets a fresh database on it.
"""

from __future__ import annotations

import inspect
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
    parser.addini("leaseproof_seed", "seed of the generated programs (default: 0, for a reproducible CI)", default="0")
    parser.addini("leaseproof_dsn", "PostgreSQL server for the leaseproof_postgres fixture", default="")


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getini("leaseproof_adapter") or config.getini("leaseproof_adapter_cmd"):
        items.append(ConformanceItem.from_parent(session, name="delivery", nodeid="leaseproof::delivery"))


class ConformanceItem(pytest.Item):
    """The delivery machine, in lockstep against the configured adapter."""

    def runtest(self) -> None:
        config = self.config
        with _configured_adapter(config) as adapter:
            profile = hypothesis_settings.default
            assert profile is not None  # Hypothesis loads its default profile on import
            examples = config.getini("leaseproof_max_examples")
            verdict = run_conformance(
                adapter,
                max_examples=int(examples) if examples else profile.max_examples,
                seed_value=int(config.getini("leaseproof_seed")),
                steps=profile.stateful_step_count,
            )
        if verdict.fault:
            raise ConformanceFailure(f"the adapter failed, nothing was judged:\n{verdict.fault}")
        if not verdict.conforms:
            program = "\n".join(f"  {line}" for line in verdict.counterexample.splitlines())
            raise ConformanceFailure(
                f"{adapter.name} does not conform to the delivery model\n"
                f"minimal counterexample:\n{program}\n{verdict.failure}"
            )

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> str | TerminalRepr:
        if isinstance(excinfo.value, ConformanceFailure):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style)

    def reportinfo(self) -> tuple[str, int | None, str]:
        return "leaseproof", None, self.name


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
