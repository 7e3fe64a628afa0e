"""`--report DIR` of verify, stress, replay and mutants, as a user runs them: real
processes on the test server, the pages they write read as markup, and the verify
and stress pages opened in real headless Chromium (tests/browser.py). The page never
changes the verdict or the exit status; a folder that cannot be made is a usage error
before the run starts."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from browser import Dom, assert_not_blank, page, rendered, screenshot
from helpers import REPO, leaseproof

from leaseproof.conformance.frontends.cli import main
from leaseproof.conformance.harness.server import Server

CORPUS = REPO / "conformance" / "traces" / "corpus"
UNREACHABLE = "host=127.0.0.1 port=1 user=nobody dbname=postgres connect_timeout=2"
# An importable module of in-process adapters for --adapter: the reconcile-unfenced
# mutant, built by a factory of the user's.
UNFENCED_MODULE = """
from leaseproof.impl.mutants import by_name
from leaseproof.impl.mutants.delivery import MUTANTS


def unfenced(dsn):
    return by_name(MUTANTS, "reconcile-unfenced").adapter(dsn)
"""


def _reported(run: subprocess.CompletedProcess[str]) -> list[Path]:
    """The pages a run says it wrote ("report: PATH" lines)."""
    return [Path(line.removeprefix("report: ")) for line in run.stdout.splitlines() if line.startswith("report: /")]


def _besides_the_report(run: subprocess.CompletedProcess[str]) -> list[str]:
    """What a run printed on stdout, less its report lines and the lines with a time in them."""
    return [line for line in run.stdout.splitlines() if not line.startswith("report: ") and "time: " not in line]


def _diverged_step(dom: Dom) -> tuple[int, list[str]]:
    """The one step a counterexample page marks as diverged, and its row tables' headers."""
    (failing,) = dom.find("details", "diverged")
    headers = [th.text for table in dom.find("table", "rows", within=failing) for th in dom.find("th", within=table)]
    return int(failing.attrs["data-step"]), headers


def test_verify_report_writes_the_counterexample_page_with_the_implementations_rows(
    pg_server: Server, tmp_path: Path
) -> None:
    """The bundled mutant runs in verify's forked child; the page's rows come from a second,
    direct adapter of the same mutant. The verdict, the exit status and what verify prints
    besides are the same with or without --report."""
    args = ("verify", "--dsn", pg_server.dsn, "--mutant", "reconcile-unfenced", "--seed", "7")
    plain = leaseproof(*args, cwd=tmp_path)
    folder = tmp_path / "pages" / "verify"  # made, with its parent
    run = leaseproof(*args, "--report", str(folder), cwd=tmp_path)
    assert run.returncode == plain.returncode == 1, run.stdout + run.stderr
    path = folder / "counterexample-delivery-7.html"
    assert f"report: {path}\n" in run.stdout and _reported(run) == [path]
    assert _besides_the_report(run) == _besides_the_report(plain), "--report changed what verify prints"
    assert "fixed scenario 1: stale_holder_finishes_after_newer_holder" in run.stderr  # the progress names it
    dom = page(path)
    number, headers = _diverged_step(dom)
    assert {"before", "model after", "implementation after"} <= set(headers), "the implementation was not run again"
    assert "delivery R1/s1/T2 of community A" in headers
    steps = dom.find("details", "step")
    assert all("unsent" not in s.classes() for s in steps[:number]), "the steps before it were not sent"
    explanation = dom.by_id("explanation").text
    assert f"step {number}" in explanation and "LeaseLost" in explanation and "AlreadyTerminal" in explanation
    # In the browser: the page's script ran, the failing step is open with its rows, and it is drawn.
    shown = rendered(path, tmp_path)
    assert shown.find("html")[0].attrs.get("data-script") == "ran", "the page's script did not run"
    (failing,) = shown.find("details", "diverged")
    assert "open" in failing.attrs and shown.find("table", "rows", within=failing)
    assert_not_blank(screenshot(path, tmp_path))


@pytest.mark.parametrize("kind", ["--adapter", "--adapter-cmd"])
def test_verify_report_of_an_adapter_of_the_users_runs_that_adapter_again(
    kind: str, pg_server: Server, tmp_path: Path
) -> None:
    """An in-process adapter (a factory of the user's), or an adapter command's child (the bundled
    store served over the wire): the page resets the same adapter and runs the trace on it."""
    (tmp_path / "adapters.py").write_text(UNFENCED_MODULE)
    served = f"{shlex.quote(sys.executable)} -m leaseproof.conformance.boundary.serve --mutant reconcile-unfenced"
    value = "adapters:unfenced" if kind == "--adapter" else f"{served} --dsn {shlex.quote(pg_server.dsn)}"
    folder = tmp_path / "pages"
    args = ("--dsn", pg_server.dsn, kind, value, "--machine", "delivery", "--seed", "7", "--report", str(folder))
    run = leaseproof("verify", *args, cwd=tmp_path)
    assert run.returncode == 1, run.stdout + run.stderr
    (path,) = _reported(run)
    assert path == folder / "counterexample-delivery-7.html"
    _, headers = _diverged_step(page(path))
    assert "implementation after" in headers


def test_a_conforming_verify_writes_no_page_and_says_so(pg_server: Server, tmp_path: Path) -> None:
    folder = tmp_path / "pages"
    args = ("--dsn", pg_server.dsn, "--machine", "delivery", "--no-scenarios", "--max-examples", "3", "--seed", "3")
    run = leaseproof("verify", *args, "--report", str(folder), cwd=tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "report: no page for the delivery machine: it conforms" in run.stdout
    assert folder.is_dir() and list(folder.iterdir()) == []


def test_a_page_that_cannot_be_written_is_said_on_stderr_and_the_verdict_stands(
    pg_server: Server, tmp_path: Path
) -> None:
    folder = tmp_path / "pages"
    (folder / "counterexample-delivery-7.html").mkdir(parents=True)  # where the page would go
    args = ("verify", "--dsn", pg_server.dsn, "--mutant", "reconcile-unfenced", "--seed", "7", "--report", str(folder))
    run = leaseproof(*args, cwd=tmp_path)
    assert run.returncode == 1, run.stdout + run.stderr
    assert "verdict: DOES NOT CONFORM" in run.stdout and _reported(run) == []
    (line,) = [line for line in run.stderr.splitlines() if "report page" in line]
    assert line.startswith(f"leaseproof: could not write the report page into {folder}: IsADirectoryError")
    assert "Traceback" not in run.stderr


def test_stress_report_draws_the_failing_history_with_its_leases(pg_server: Server, tmp_path: Path) -> None:
    """claim-read-then-update dies within a few programs of seed 1 (its first, most runs):
    two claimers read one pending row and both claim it."""
    folder = tmp_path / "pages"
    args = ("--machine", "delivery", "--mutant", "claim-read-then-update", "--seed", "1", "--workers", "4")
    run = leaseproof(
        "stress", "--dsn", pg_server.dsn, *args, "--repeats", "1", "--duration", "60", "--report", str(folder),
        cwd=tmp_path,
    )  # fmt: skip
    assert run.returncode == 1, run.stdout + run.stderr
    assert "verdict: NOT LINEARIZABLE" in run.stdout
    (path,) = _reported(run)
    assert path == folder / "stress-delivery-1.html"
    dom = page(path)
    assert "claim" in dom.by_id("explanation").text
    # The terminal says what the page leads with.
    why = next(line for line in run.stdout.splitlines() if line.startswith("why: ")).removeprefix("why: ")
    assert why.startswith("claim") and why in " ".join(dom.by_id("explanation").text.split()), why
    whole = dom.by_id("history-timeline")
    assert dom.find("g", "lease-interval", within=whole), "no lease drawn in the failing history"
    assert dom.find("g", "operation", within=dom.by_id("piece-timeline"))
    shown = rendered(path, tmp_path)
    assert shown.find("html")[0].attrs.get("data-script") == "ran"
    assert shown.find("rect", "lease", within=shown.by_id("history-timeline")), "no lease in the rendered timeline"
    assert_not_blank(screenshot(path, tmp_path, size="1500,1600"))


def test_replay_report_writes_replay_html(pg_server: Server, tmp_path: Path) -> None:
    """Two corpus traces against reap-keeps-generation: its own trace fails on a row's
    generation, the other passes; the page has both, the failing one's steps with its rows."""
    traces = [str(CORPUS / "reap-keeps-generation.jsonl"), str(CORPUS / "claim-newest-first.jsonl")]
    folder = tmp_path / "pages"
    args = ("--dsn", pg_server.dsn, "--mutant", "reap-keeps-generation", "--report", str(folder))
    run = leaseproof("replay", *traces, *args, cwd=tmp_path)
    assert run.returncode == 1, run.stdout + run.stderr
    assert run.stdout.splitlines()[-1] == f"report: {folder / 'replay.html'}"
    dom = page(folder / "replay.html")
    statuses = [tr.attrs["data-status"] for tr in dom.find("tr") if "data-status" in tr.attrs]
    assert statuses == ["FAIL", "pass"]
    (failing,) = dom.find("details", "diverged")
    assert any("differs" in td.classes() for td in dom.find("td", within=failing)), "no field marked as differing"
    assert "agreed with the model at every step" in dom.by_id("trace-1").text


def test_mutants_report_writes_the_kill_matrix_page(pg_server: Server, tmp_path: Path) -> None:
    folder = tmp_path / "pages"
    matrix = ("mutants", "--fast", "--mutant", "reconcile-unfenced", "--dsn", pg_server.dsn, "--report", str(folder))
    run = leaseproof(*matrix)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.splitlines()[-1] == f"report: {folder / 'kill-matrix.html'}"
    dom = page(folder / "kill-matrix.html")
    rows = [tr for tr in dom.find("tr") if "data-mutant" in tr.attrs]
    assert rows and {tr.attrs["data-mutant"] for tr in rows} == {"reconcile-unfenced"}
    assert all(tr.attrs["data-killed"] == "yes" for tr in rows)
    # With --json, stdout is the document alone; the page's line goes to stderr.
    as_json = leaseproof(*matrix, "--json")
    assert as_json.returncode == 0, as_json.stderr
    assert json.loads(as_json.stdout)["rows"]
    assert f"report: {folder / 'kill-matrix.html'}" in as_json.stderr


def test_the_kill_matrix_says_what_stress_saw_and_links_its_page(pg_server: Server, tmp_path: Path) -> None:
    folder = tmp_path / "pages"
    run = leaseproof(
        "mutants", "--fast", "--mutant", "claim-read-then-update", "--dsn", pg_server.dsn, "--report", str(folder)
    )
    assert run.returncode == 0, run.stdout + run.stderr
    (said,) = [line for line in run.stdout.splitlines() if line.startswith("- claim-read-then-update (seed ")]
    why = said.split("): ", 1)[1]
    assert why.startswith("claim of ") and "(outcome not needed)" not in why, why
    dom = page(folder / "kill-matrix.html")
    (link,) = dom.find("a", "counterexample")
    stress_page = page(folder / link.attrs["href"])
    assert " ".join(stress_page.by_id("explanation").text.split()) == why


@pytest.mark.parametrize(
    "command",
    [
        ("verify", "--seed", "1"),
        ("stress", "--duration", "1"),
        ("replay", str(CORPUS / "reconcile-unfenced.jsonl")),
        ("mutants", "--fast", "--mutant", "reconcile-unfenced"),
    ],
    ids=lambda words: words[0],
)
def test_a_report_folder_that_cannot_be_made_is_a_usage_error_before_the_run(
    command: tuple[str, ...], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`leaseproof.main` in this process. The server named is unreachable: had the run
    started, that would be the error."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    for folder, why in ((blocker / "pages", "cannot make the folder: not a directory"), (blocker, "a file of that")):
        assert main([*command, "--dsn", UNREACHABLE, "--report", str(folder)]) == 2
        out, err = capsys.readouterr()
        (line,) = err.splitlines()
        assert line.startswith(f"leaseproof: --report {folder}: ") and why in line, line
        assert out == "", "the run started"


def test_mutants_report_is_not_for_the_generated_mutants(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["mutants", "--generated", "--report", str(tmp_path / "pages"), "--dsn", UNREACHABLE]) == 2
    out, err = capsys.readouterr()
    assert err == "leaseproof: --report writes the kill matrix's page; --generated's mutation score has none\n"
    assert out == "" and not (tmp_path / "pages").exists()
