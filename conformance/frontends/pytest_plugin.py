"""The pytest plugin: run leaseproof's conformance machines inside a service's own test run.

Registered through the `pytest11` entry point, so installing leaseproof is enough. A service
names its adapter in its pytest configuration (`leaseproof_adapter = "pkg.mod:make"` in
process, or `leaseproof_adapter_cmd`, a command run in the rootdir, over the wire), and the
run gains one test per machine, `leaseproof::delivery` and (over the wire)
`leaseproof::lifecycle`, collected like any other (the `leaseproof` marker; -k, -m,
--deselect) when the command line names no path, the rootdir, or them. The loaded Hypothesis
profile applies, but for two stock values leaseproof replaces (a 200 ms deadline: none;
every phase: all but explain). Every failure is a short report naming the ini key concerned;
a counterexample is also written as a trace file. Fixtures: `leaseproof_postgres` (the
server's DSN) and `leaseproof_database` (a fresh database per test, dropped after).
docs/own-implementation.md ("Inside your own pytest run") has every key.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import hashlib
import math
import random
from collections.abc import Callable, Generator, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import pytest
from hypothesis import Phase, Verbosity
from hypothesis import settings as hypothesis_settings

from leaseproof.conformance.lockstep.verify import MACHINES, Run, Verdict, run_conformance

if TYPE_CHECKING:
    from _pytest._code.code import TerminalRepr  # what Item.repr_failure returns; pytest exports no public name

    from leaseproof.conformance.boundary.protocols import SomeAdapter
    from leaseproof.conformance.harness.server import Server

IN_PROCESS_MACHINES = ("delivery",)  # the in-process boundary carries the delivery machine alone
DEFAULT_REPLY_TIMEOUT = 30.0  # seconds; SubprocessAdapter's own default
_SUMMARY_PROPERTY = "leaseproof"  # the user property carrying an item's summary line
# Hypothesis's stock values that leaseproof replaces while a profile keeps them: a
# step is a round trip to PostgreSQL, so a 200 ms deadline fails healthy runs, and
# the explain phase re-runs a counterexample many times (it more than doubled a
# mutant's run, 20 s to 48 s).
_STOCK_DEADLINE = dt.timedelta(milliseconds=200)
_STOCK_PHASES = frozenset(Phase)


class ConformanceFailure(AssertionError):
    """The configured implementation does not conform, its adapter failed, or
    the plugin's configuration cannot run it: reported as its message alone.
    `verdict`: the summary's word on it (default: the message's first line)."""

    def __init__(self, message: str, verdict: str = "") -> None:
        super().__init__(message)
        self.verdict = verdict or message.splitlines()[0]


@attrs.frozen
class Plan:
    """What the ini keys and the command line ask of this run, checked before anything runs."""

    adapter: str  # leaseproof_adapter: MODULE:FACTORY, or ""
    adapter_cmd: str  # leaseproof_adapter_cmd, or ""
    machines: tuple[str, ...]  # the machines to collect items for
    chosen: bool  # leaseproof_machines named them: one the adapter lacks fails instead of skipping
    seed: int
    seed_origin: str  # where the seed came from, as the summary prints it
    max_examples: int | None  # None: the profile's
    reply_timeout: float
    trace_dir: Path
    markers: tuple[str, ...]  # extra markers on every item (leaseproof_markers)
    rootdir: Path

    @property
    def key(self) -> str:
        """The ini key that names the adapter, as failures quote it."""
        if self.adapter_cmd:
            return f"leaseproof_adapter_cmd = {self.adapter_cmd!r}"
        return f"leaseproof_adapter = {self.adapter!r}"


_PLAN = pytest.StashKey[Plan | None]()
_SERVER = pytest.StashKey[tuple[contextlib.ExitStack, "Server"]]()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini("leaseproof_adapter", "MODULE:FACTORY of an in-process leaseproof adapter", default="")
    parser.addini(
        "leaseproof_adapter_cmd",
        "command of an out-of-process leaseproof adapter, run in the rootdir (relative paths are the rootdir's)",
        default="",
    )
    parser.addini(
        "leaseproof_machines",
        "the machines to check (default: every one the adapter offers; the in-process boundary offers delivery)",
        type="args",
        default=[],
    )
    parser.addini(
        "leaseproof_max_examples", "generated programs per machine (default: the Hypothesis profile's)", default=""
    )
    parser.addini(
        "leaseproof_seed",
        "seed of the generated programs (default: --hypothesis-seed, else a fresh one; printed)",
        default="",
    )
    parser.addini(
        "leaseproof_accept_subset",
        "accept a verdict on the operations an adapter offers when it leaves some out (default: false)",
        type="bool",
        default=False,
    )
    parser.addini(
        "leaseproof_reply_timeout",
        f"seconds to wait for each reply of leaseproof_adapter_cmd (default: {DEFAULT_REPLY_TIMEOUT:g})",
        default="",
    )
    parser.addini(
        "leaseproof_trace_dir",
        "folder for counterexample traces, relative to the rootdir (default: the rootdir)",
        default="",
    )
    parser.addini("leaseproof_markers", "extra markers on the leaseproof items (e.g. slow)", type="args", default=[])
    parser.addini("leaseproof_dsn", "PostgreSQL server for the leaseproof fixtures and adapters", default="")


def pytest_configure(config: pytest.Config) -> None:
    """Check the ini keys (a bad one is a usage error before anything runs), draw
    the seed, and take the `leaseproof[::MACHINE]` arguments off the paths to collect."""
    config.addinivalue_line(
        "markers", "leaseproof: a leaseproof conformance machine (leaseproof::delivery, leaseproof::lifecycle)"
    )
    config.stash[_PLAN] = _plan(config)


def _plan(config: pytest.Config) -> Plan | None:
    adapter = str(config.getini("leaseproof_adapter")).strip()
    command = str(config.getini("leaseproof_adapter_cmd")).strip()
    named, paths = _named_machines(config)
    if not (adapter or command):
        if named:
            raise pytest.UsageError(
                f"{named[0][0]}: no adapter is configured (set leaseproof_adapter or leaseproof_adapter_cmd)"
            )
        return None
    if adapter and command:
        raise pytest.UsageError(
            f"leaseproof_adapter = {adapter!r} and leaseproof_adapter_cmd = {command!r}: set one of them, not both"
        )
    offered = IN_PROCESS_MACHINES if adapter else tuple(MACHINES)
    chosen = tuple(config.getini("leaseproof_machines"))
    for machine in chosen:
        if machine not in offered:
            why = (
                "the in-process boundary (leaseproof_adapter) carries the delivery machine alone"
                if adapter and machine in MACHINES
                else f"the machines are {', '.join(MACHINES)}"
            )
            raise pytest.UsageError(f"leaseproof_machines = {' '.join(chosen)}: no machine {machine!r} ({why})")
    configured = chosen or offered
    for arg, machine in named:
        if machine is not None and machine not in configured:
            raise pytest.UsageError(
                f"{arg}: not a machine of this run (leaseproof_machines or the adapter's: {', '.join(configured)})"
            )
    if named:
        machines = tuple(m for m in configured if any(n in (None, m) for _, n in named))
    elif config.args_source is not pytest.Config.ArgsSource.ARGS or _names_rootdir(config, paths):
        machines = configured
    else:
        machines = ()
    config.args[:] = paths
    seed, origin = _seed(config)
    markers = tuple(config.getini("leaseproof_markers"))
    for marker in markers:
        if not marker.isidentifier():
            raise pytest.UsageError(f"leaseproof_markers = {' '.join(markers)}: {marker!r} is not a marker name")
    trace_dir = str(config.getini("leaseproof_trace_dir")).strip()
    return Plan(
        adapter=adapter,
        adapter_cmd=command,
        machines=machines,
        chosen=bool(chosen),
        seed=seed,
        seed_origin=origin,
        max_examples=_count(config),
        reply_timeout=_reply_timeout(config),
        trace_dir=config.rootpath / trace_dir if trace_dir else config.rootpath,
        markers=markers,
        rootdir=config.rootpath,
    )


def _named_machines(config: pytest.Config) -> tuple[list[tuple[str, str | None]], list[str]]:
    """The command line's `leaseproof` (every machine) and `leaseproof::MACHINE`
    arguments, and the other arguments. An argument naming a path that exists is a path."""
    named: list[tuple[str, str | None]] = []
    paths: list[str] = []
    for arg in config.args:
        head, _, rest = arg.partition("::")
        if head != "leaseproof" or (config.invocation_params.dir / head).exists():
            paths.append(arg)
        elif not rest:
            named.append((arg, None))
        elif rest in MACHINES:
            named.append((arg, rest))
        else:
            raise pytest.UsageError(f"{arg}: no such leaseproof machine (the machines are {', '.join(MACHINES)})")
    return named, paths


def _names_rootdir(config: pytest.Config, paths: list[str]) -> bool:
    root = config.rootpath.resolve()
    return any("::" not in arg and (config.invocation_params.dir / arg).resolve() == root for arg in paths)


def _seed(config: pytest.Config) -> tuple[int, str]:
    """leaseproof_seed, else --hypothesis-seed, else a fresh one; and where it came from."""
    text = str(config.getini("leaseproof_seed")).strip()
    if text:
        try:
            value = int(text)
        except ValueError:
            raise pytest.UsageError(f"leaseproof_seed = {text!r}: not an integer") from None
        if not 0 <= value < 2**63:
            raise pytest.UsageError(f"leaseproof_seed = {text}: must be between 0 and 2**63 - 1")
        return value, "leaseproof_seed"
    forced = config.getoption("--hypothesis-seed", default=None)
    if forced is not None:
        try:
            value = int(forced)
        except ValueError:
            value = -1
        if not 0 <= value < 2**63:  # Hypothesis takes any string: leaseproof's seeds are integers
            value = int.from_bytes(hashlib.sha256(str(forced).encode()).digest()[:8], "big") >> 1
        return value, f"--hypothesis-seed {forced}"
    return random.randrange(2**63), "fresh"


def _ini_number(
    config: pytest.Config, key: str, convert: Callable[[str], Any], noun: str, accepts: Callable[[Any], bool], rule: str
) -> Any:
    """The ini value `key` as `convert` reads it, None if unset; a usage error naming the key otherwise."""
    text = str(config.getini(key)).strip()
    if not text:
        return None
    try:
        value = convert(text)
    except ValueError:
        raise pytest.UsageError(f"{key} = {text!r}: not {noun}") from None
    if not accepts(value):
        raise pytest.UsageError(f"{key} = {text}: must be {rule}")
    return value


def _count(config: pytest.Config) -> int | None:
    count: int | None = _ini_number(
        config, "leaseproof_max_examples", int, "an integer", lambda v: v >= 1, "at least 1"
    )
    return count


def _reply_timeout(config: pytest.Config) -> float:
    timeout: float | None = _ini_number(
        config, "leaseproof_reply_timeout", float, "a number of seconds",
        lambda v: v > 0 and v != float("inf"), "a positive number of seconds",
    )  # fmt: skip
    return DEFAULT_REPLY_TIMEOUT if timeout is None else timeout


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(
    collector: pytest.Collector,
) -> Generator[None, pytest.CollectReport, pytest.CollectReport]:
    """The session's collection gains the `leaseproof` collector, so its items are
    collected (and counted, selected and deselected) like the files' tests."""
    report: pytest.CollectReport = yield
    plan = collector.config.stash.get(_PLAN, None)
    if isinstance(collector, pytest.Session) and plan is not None and plan.machines and report.passed:
        assert isinstance(report.result, list)
        report.result.append(Machines.from_parent(collector, name="leaseproof", nodeid="leaseproof"))
    return report


class Machines(pytest.Collector):
    """`leaseproof`: one item per machine the run checks."""

    def collect(self) -> Iterable[pytest.Item]:
        plan = self.config.stash[_PLAN]
        assert plan is not None
        for machine in plan.machines:
            item = ConformanceItem.from_parent(self, name=machine)
            for marker in ("leaseproof", *plan.markers):
                item.add_marker(marker)
            yield item


class ConformanceItem(pytest.Item):
    """One machine, in lockstep against the configured adapter."""

    hypothesis_statistics: str  # read by Hypothesis's own plugin, for --hypothesis-show-statistics

    def runtest(self) -> None:
        plan = self.config.stash[_PLAN]
        assert plan is not None
        machine = self.name
        replay = f'(seed {plan.seed}: set leaseproof_seed = "{plan.seed}" to replay)'
        if plan.seed_origin not in ("fresh", "leaseproof_seed"):
            replay = f'(seed {plan.seed}, from {plan.seed_origin}: set leaseproof_seed = "{plan.seed}" to replay)'
        summary = f"leaseproof::{machine} {replay}"
        try:
            with contextlib.ExitStack() as stack:
                adapter = _adapter(self.config, plan, machine, stack)
                verdict = self._run(adapter, plan)
            self._judge(verdict, adapter.name, plan, replay)
        except ConformanceFailure as failure:
            self.user_properties.append((_SUMMARY_PROPERTY, f"{summary}: {failure.verdict}"))
            raise
        if verdict.subset():
            summary += f": conforms on a subset, accepted by leaseproof_accept_subset ({verdict.subset()})"
        else:
            summary += ": conforms"
        phases = _profile(self.config).phases
        if Phase.generate not in phases:
            alone = (
                "the fixed scenarios and the example database's programs"
                if Phase.reuse in phases
                else "the fixed scenarios"
            )
            summary += f" (on {alone} alone: the Hypothesis profile's phases leave out generate)"
        self.user_properties.append((_SUMMARY_PROPERTY, summary))

    def _run(self, adapter: SomeAdapter, plan: Plan) -> Verdict:
        from hypothesis.statistics import collector, describe_statistics

        profile = _profile(self.config)

        def note_statistics(stats: Any) -> None:
            stats["nodeid"] = self.nodeid
            self.hypothesis_statistics = describe_statistics(stats)

        reporter: Callable[[object], None] | None = print if profile.verbosity >= Verbosity.verbose else None
        # A profile that neither generates nor reuses has no programs to run (Hypothesis
        # would skip the run): the fixed scenarios alone are run then, and said.
        generate = bool({Phase.generate, Phase.reuse} & set(profile.phases))
        with collector.with_value(note_statistics):  # type: ignore[arg-type]  # Hypothesis types it by its default, None
            return run_conformance(
                adapter,
                Run(
                    machine=self.name,
                    max_examples=plan.max_examples or profile.max_examples,
                    seed=plan.seed,
                    steps=profile.stateful_step_count,
                    hypothesis_settings=profile,
                    reporter=reporter,
                    generate=generate,
                ),
            )

    def _judge(self, verdict: Verdict, name: str, plan: Plan, replay: str) -> None:
        if verdict.fault:
            where = "".join(f"\n  {line}" for line in verdict.fault_program)
            raise ConformanceFailure(
                f"{plan.key}: the adapter failed, so nothing was judged {replay}:\n{verdict.fault}"
                + _timeout_note(plan, verdict.fault)
                + (f"\nwhere, and the program's commands up to the fault:{where}" if where else ""),
                "the adapter failed, so nothing was judged",
            )
        if not verdict.conforms:
            program = "".join(f"\n  {line}" for line in verdict.counterexample.splitlines())
            stopped = (
                f"\nshrinking stopped early, {verdict.shrink_stopped}: the program above may not be minimal"
                if verdict.shrink_stopped
                else ""
            )
            trace = self._trace(verdict, plan)
            raise ConformanceFailure(
                f"{name} does not conform to the {self.name} model {replay}\n"
                f"minimal counterexample:{program}{stopped}\n{verdict.failure}{trace}",
                "does not conform" + (f"; {trace.strip().split(' (')[0]}" if trace else ""),
            )
        if verdict.subset() and not self.config.getini("leaseproof_accept_subset"):
            raise ConformanceFailure(
                f"{name} conforms only on a subset {replay}: {verdict.subset()}\n"
                "implement them, or set leaseproof_accept_subset = true to accept a verdict on these alone",
                f"conforms only on a subset ({verdict.subset()})",
            )

    def _trace(self, verdict: Verdict, plan: Plan) -> str:
        """Write the counterexample's trace; the failure's line naming it."""
        from leaseproof.conformance.traces.trace import trace_of, write

        trace = trace_of(verdict.recorded)
        if trace is None:
            return ""

        path = plan.trace_dir / f"leaseproof-{self.name}-counterexample-{verdict.seed}.jsonl"
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            write(trace, path)
        except OSError as exc:
            return f"\nleaseproof_trace_dir: could not write the trace to {path}: {exc.strerror}"
        from leaseproof.conformance.frontends.commands.common import replay_command

        chosen = argparse.Namespace(
            adapter=plan.adapter, adapter_cmd=plan.adapter_cmd, reply_timeout=math.ceil(plan.reply_timeout)
        )
        return (
            f"\ntrace: {path} (the counterexample, {len(trace.steps)} steps;"
            f" replay it from the rootdir with: {replay_command(path, chosen)})"
        )

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> str | TerminalRepr:
        if isinstance(excinfo.value, ConformanceFailure):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style)

    def reportinfo(self) -> tuple[Path, int | None, str]:
        return self.config.rootpath, None, f"leaseproof::{self.name}"


def _profile(config: pytest.Config) -> hypothesis_settings:
    """The loaded Hypothesis profile, with leaseproof's deadline and phases where it keeps the stock ones."""
    profile = hypothesis_settings.default
    assert profile is not None  # Hypothesis loads its default profile on import
    deadline = None if profile.deadline == _STOCK_DEADLINE else profile.deadline
    phases = tuple(profile.phases)
    if frozenset(phases) == _STOCK_PHASES and not config.getoption("--hypothesis-explain", default=False):
        phases = tuple(phase for phase in phases if phase is not Phase.explain)
    return hypothesis_settings(profile, deadline=deadline, phases=phases)


def _adapter(config: pytest.Config, plan: Plan, machine: str, stack: contextlib.ExitStack) -> SomeAdapter:
    """The configured adapter of `machine`, closed with `stack`; a failure to build
    it is a `ConformanceFailure` naming the ini key (or a skip, for a machine the
    adapter does not offer and nobody asked for)."""
    if plan.adapter_cmd:
        from leaseproof.conformance.boundary.wire import AdapterFault, SubprocessAdapter

        try:
            # The command's relative paths are the rootdir's, wherever pytest runs.
            with contextlib.chdir(plan.rootdir):
                child = SubprocessAdapter(plan.adapter_cmd, machine=None, reply_timeout=plan.reply_timeout)
        except AdapterFault as fault:
            raise ConformanceFailure(f"{plan.key}: {fault}{_timeout_note(plan, fault)}") from None
        stack.callback(child.close)
        if machine not in child.machines:
            offered = ", ".join(sorted(child.machines)) or "none"
            if plan.chosen:
                raise ConformanceFailure(
                    f"leaseproof_machines names {machine}, but {plan.key} does not offer it"
                    f" (its hello offers: {offered})"
                )
            pytest.skip(f"{plan.key} does not offer the {machine} machine (its hello offers: {offered})")
        try:
            return child.use(machine)
        except AdapterFault as fault:
            raise ConformanceFailure(f"{plan.key}: {fault}") from None
    return _in_process(config, plan, stack)


def _timeout_note(plan: Plan, fault: object) -> str:
    if "no reply to" not in str(fault):
        return ""
    return f"\n(leaseproof_reply_timeout: {plan.reply_timeout:g} seconds for each reply)"


def _in_process(config: pytest.Config, plan: Plan, stack: contextlib.ExitStack) -> SomeAdapter:
    # The CLI's loader, one spelling of MODULE:FACTORY; its messages name the CLI's flag.
    from leaseproof.conformance.boundary.protocols import NotAnAdapter, as_adapter
    from leaseproof.conformance.frontends.commands.common import UsageError
    from leaseproof.conformance.frontends.commands.running import load_factory, takes_dsn
    from leaseproof.conformance.harness.databases import scratch_database
    from leaseproof.conformance.harness.provision import ProvisioningError

    try:
        factory = load_factory(plan.adapter)
    except UsageError as exc:
        flag = f"--adapter {plan.adapter!r}: "
        text = str(exc)
        raise ConformanceFailure(f"{plan.key}: {text.removeprefix(flag)}") from None
    try:
        if takes_dsn(factory):
            adapter = factory(dsn=stack.enter_context(scratch_database(_server(config))))
        else:
            adapter = factory()
    except ProvisioningError as exc:
        raise ConformanceFailure(f"{plan.key}: no PostgreSQL server for its database (leaseproof_dsn): {exc}") from None
    except Exception as exc:  # noqa: BLE001 - a broken factory is the user's adapter failing
        raise ConformanceFailure(f"{plan.key}: the factory failed: {type(exc).__name__}: {exc}") from None
    try:
        checked = as_adapter(adapter)
    except NotAnAdapter as exc:
        raise ConformanceFailure(f"{plan.key}: {exc}") from None
    stack.callback(checked.close)
    return checked


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    """Each machine's seed and verdict, so a run can be replayed and a subset is seen
    (from the reports, so a pytest-xdist run shows them too)."""
    lines = [
        value
        for reports in terminalreporter.stats.values()
        for report in reports
        if isinstance(report, pytest.TestReport) and report.when == "call"
        for key, value in report.user_properties
        if key == _SUMMARY_PROPERTY
    ]
    if lines:
        terminalreporter.section("leaseproof")
        for line in lines:
            terminalreporter.write_line(str(line))


def _server(config: pytest.Config) -> Server:
    """One provisioned server per test session, stopped when the session ends."""
    if _SERVER not in config.stash:
        from leaseproof.conformance.harness.provision import postgres_server

        stack = contextlib.ExitStack()
        server = stack.enter_context(postgres_server(str(config.getini("leaseproof_dsn")) or None))
        config.stash[_SERVER] = (stack, server)
        config.add_cleanup(stack.close)
    return config.stash[_SERVER][1]


@pytest.fixture(scope="session")
def leaseproof_postgres(pytestconfig: pytest.Config) -> Iterator[str]:
    """The DSN of leaseproof's provisioned PostgreSQL: its maintenance database, as a superuser or as
    the role leaseproof_dsn or LEASEPROOF_DSN names."""
    yield _server(pytestconfig).dsn


@pytest.fixture
def leaseproof_database(pytestconfig: pytest.Config) -> Iterator[str]:
    """The DSN of a fresh, empty database on the provisioned server, dropped after the test."""
    from leaseproof.conformance.harness.databases import scratch_database

    with scratch_database(_server(pytestconfig), prefix="lp_test") as dsn:
        yield dsn


__all__ = ["ConformanceFailure", "ConformanceItem", "Machines", "Plan", "leaseproof_database", "leaseproof_postgres"]
