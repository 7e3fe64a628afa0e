"""The architecture page's map (docs/architecture.md) is true of the tree, both ways.

The page names folders: backticked in its text and its
table, bare in its diagram. Every path it names must exist; every package
folder under impl/ and conformance/, and every folder directly below either,
must be named there, so a new folder cannot appear without its place on the
map. A table row's backticked module names must be files of its folder.
Besides the map: tests/ mirrors the tree it tests, its test file names are
unique (pytest imports them by basename), and the wheel lists every package.

And the layering, read from every import of the package's modules: no cycle
between concept folders (model/; impl/'s and conformance/'s folders, each with
the folders below it); model/ imports nothing else of the project; impl/ only
model/ and itself; nothing under conformance/ but frontends/ imports
frontends/ (the command line, the pytest plugin and the catalogue are the top).

Each check is a function from a section (or a tree) to what is wrong with it;
the last tests prove that each one notices.
"""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

import pytest
from helpers import REPO

# What the map must cover: the package folders of impl/ and conformance/.
MAPPED = ("impl", "conformance")
PATH = re.compile(r"(?<![\w./-])((?:model|impl|conformance|specs|tests|\.typecheck)/(?:[\w.-]+/)*[\w.-]*)")
ROW = re.compile(r"^\| `([\w./-]+/)` \| (.*) \|$", re.M)
MODULE = re.compile(r"`(\w+\.py)`")


def architecture(readme: str) -> str:
    """The text of a page's architecture section, up to the next section (the checks' own tests
    build such pages)."""
    start = readme.index("\n## Architecture\n")
    end = readme.find("\n## ", start + 1)
    return readme[start : len(readme) if end == -1 else end]


def named_paths(section: str) -> set[str]:
    """Every repository path the section names; a folder's ends in '/'."""
    return {path.rstrip(".") for path in PATH.findall(section)}


def _folders(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_dir() and "__pycache__" not in p.parts)


def required_folders(root: Path) -> set[str]:
    """The folders the map must name: each package folder under MAPPED, and each folder just below one."""
    required = set()
    for top in MAPPED:
        for folder in [root / top, *_folders(root / top)]:
            if (folder / "__init__.py").is_file() or folder.parent == root / top:
                required.add(folder.relative_to(root).as_posix() + "/")
    return required


def missing(section: str, root: Path) -> list[str]:
    """The paths the section names that the tree does not have."""
    return sorted(path for path in named_paths(section) if not (root / path).exists())


def unnamed(section: str, root: Path) -> list[str]:
    """The folders the tree has and the map must name, but does not."""
    return sorted(required_folders(root) - {path for path in named_paths(section) if path.endswith("/")})


def misplaced_modules(section: str, root: Path) -> list[str]:
    """Module names in a table row that are no file of that row's folder (or a folder below it)."""
    return [
        f"{folder}: {module}"
        for folder, description in ROW.findall(section)
        for module in MODULE.findall(description)
        if not any((root / folder).rglob(module))
    ]


def unmirrored(root: Path) -> list[str]:
    """Folders of tests/ that mirror no folder of the tree."""
    return [
        folder.relative_to(root).as_posix()
        for folder in _folders(root / "tests")
        if not (root / folder.relative_to(root / "tests")).is_dir()
    ]


def repeated_test_names(root: Path) -> list[str]:
    """Test file names that occur more than once under tests/."""
    names = [path.name for path in (root / "tests").rglob("test_*.py")]
    return sorted({name for name in names if names.count(name) > 1})


def unpackaged(pyproject: str, root: Path) -> list[str]:
    """Package folders of model/, impl/ and conformance/ that the wheel's package list leaves out."""
    listed = set(tomllib.loads(pyproject)["tool"]["setuptools"]["packages"])
    packages = {
        "leaseproof." + init.parent.relative_to(root).as_posix().replace("/", ".")
        for top in ("model", *MAPPED)
        for init in (root / top).rglob("__init__.py")
    }
    return sorted(packages - listed)


# The package's folders and the import names they are mapped onto (pyproject.toml).
PACKAGE = {"model": "leaseproof.model", "impl": "leaseproof.impl", "conformance": "leaseproof.conformance"}


def _concept(module: str) -> str:
    """The concept folder a module is in: `leaseproof.model`, or the first folder below
    impl/ or conformance/ (`leaseproof.conformance.queues` for its `subjects` too)."""
    parts = module.split(".")
    return ".".join(parts[:2] if parts[1] == "model" else parts[:3])


def imports(root: Path) -> dict[tuple[str, str], str]:
    """Every import of one concept folder by another, as (importer, imported) -> a file that does it."""
    modules: dict[str, Path] = {}
    for top, name in PACKAGE.items():
        for path in (root / top).rglob("*.py"):
            parts = [name, *path.relative_to(root / top).with_suffix("").parts]
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    found: dict[tuple[str, str], str] = {}
    for module, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            named: list[str] = []
            if isinstance(node, ast.Import):
                named = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                named = [node.module]
            for name in named:
                if name.startswith("leaseproof.") and name.count(".") >= 2 - name.startswith("leaseproof.model"):
                    edge = (_concept(module), _concept(name))
                    if edge[0] != edge[1]:
                        found.setdefault(edge, path.relative_to(root).as_posix())
    return found


def layering(found: dict[tuple[str, str], str]) -> list[str]:
    """What breaks the layering: each import a rule forbids, and each cycle between concept folders."""
    wrong = []
    for (importer, imported), where in sorted(found.items()):
        if importer == "leaseproof.model":
            wrong.append(f"model/ imports {imported} ({where})")
        elif importer.startswith("leaseproof.impl.") and not imported.startswith(
            ("leaseproof.impl.", "leaseproof.model")
        ):
            wrong.append(f"impl/ imports {imported} ({where})")
        elif imported == "leaseproof.conformance.frontends" and importer.startswith("leaseproof.conformance."):
            wrong.append(f"{importer} imports the frontends ({where})")
    reach: dict[str, set[str]] = {}
    for importer, imported in found:
        reach.setdefault(importer, set()).add(imported)

    def reaches(start: str, goal: str) -> bool:
        seen, todo = set(), [start]
        while todo:
            folder = todo.pop()
            if folder == goal:
                return True
            if folder not in seen:
                seen.add(folder)
                todo.extend(reach.get(folder, ()))
        return False

    for (importer, imported), where in sorted(found.items()):
        if importer < imported and reaches(imported, importer):
            wrong.append(f"a cycle: {importer} and {imported} import each other, at least through others ({where})")
    return wrong


def _section() -> str:
    return (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")


# -- the tree and the map agree --------------------------------------------------------------------


def test_every_path_the_map_names_exists() -> None:
    assert missing(_section(), REPO) == []


def test_every_package_folder_is_on_the_map() -> None:
    assert unnamed(_section(), REPO) == []


def test_the_map_names_each_module_in_its_own_folder() -> None:
    assert misplaced_modules(_section(), REPO) == []


def test_the_map_names_the_boxes_of_every_command() -> None:
    section = _section()
    for folder in ("conformance/lockstep/", "conformance/boundary/", "impl/delivery/", "impl/lifecycle/"):
        assert folder in section
    assert {"verify", "stress", "explore", "spec", "mutants"} <= set(re.findall(r"^(\w+)[ ,]", section, re.M))


def test_tests_mirror_the_tree() -> None:
    assert unmirrored(REPO) == []
    assert repeated_test_names(REPO) == []


def test_the_wheel_lists_every_package() -> None:
    assert unpackaged((REPO / "pyproject.toml").read_text(encoding="utf-8"), REPO) == []


def test_the_layering_holds() -> None:
    found = imports(REPO)
    assert ("leaseproof.conformance.frontends", "leaseproof.conformance.lockstep") in found  # it reads imports
    assert layering(found) == []


# -- each check notices a drift ---------------------------------------------------------------------


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A small tree: impl/ with one package and its data folder, tests/ mirroring it."""
    for folder in ("impl/store", "impl/migrations", "impl/store/data", "tests/impl"):
        (tmp_path / folder).mkdir(parents=True)
    for package in ("impl", "impl/store"):
        (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / "impl/store/sql.py").write_text("")
    (tmp_path / "conformance").mkdir()
    return tmp_path


SECTION = """
## Architecture

```text
verify ---> store impl/store/
```

| folder | what belongs there |
| --- | --- |
| `impl/` | the implementation |
| `impl/store/` | the store (`sql.py`) |
| `impl/migrations/` | the schema |
"""


def test_the_checks_pass_a_true_map(tree: Path) -> None:
    section = architecture(SECTION + "\n## Next\n\n`impl/gone/` is not on the map.\n")
    assert missing(section, tree) == unnamed(section, tree) == misplaced_modules(section, tree) == []
    assert unmirrored(tree) == repeated_test_names(tree) == []


def test_a_named_folder_that_is_gone_is_missing(tree: Path) -> None:
    assert missing(SECTION.replace("impl/store/`", "impl/stores/`"), tree) == ["impl/stores/"]
    assert missing(SECTION.replace("impl/store/\n", "impl/stor/\n"), tree) == ["impl/stor/"]


def test_a_package_folder_or_a_top_folder_off_the_map_is_unnamed(tree: Path) -> None:
    (tree / "impl/hooks").mkdir()
    (tree / "impl/store/deep").mkdir()
    (tree / "impl/store/deep/__init__.py").write_text("")
    assert unnamed(SECTION, tree) == ["impl/hooks/", "impl/store/deep/"]
    off = SECTION.replace("| `impl/migrations/` | the schema |\n", "")
    assert unnamed(off, tree) == ["impl/hooks/", "impl/migrations/", "impl/store/deep/"]


def test_a_module_named_in_the_wrong_row_is_misplaced(tree: Path) -> None:
    drifted = SECTION.replace("| the schema |", "| the schema (`sql.py`) |")
    assert misplaced_modules(drifted, tree) == ["impl/migrations/: sql.py"]


def test_a_test_folder_that_mirrors_nothing_or_a_repeated_name_is_found(tree: Path) -> None:
    (tree / "tests/lockstep").mkdir()
    (tree / "tests/impl/test_a.py").write_text("")
    (tree / "tests/lockstep/test_a.py").write_text("")
    assert unmirrored(tree) == ["tests/lockstep"]
    assert repeated_test_names(tree) == ["test_a.py"]


def test_a_package_left_out_of_the_wheel_is_found(tree: Path) -> None:
    listed = '[tool.setuptools]\npackages = ["leaseproof.impl"]\n'
    assert unpackaged(listed, tree) == ["leaseproof.impl.store"]


def _package(tree: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = tree / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tree


def test_a_cycle_or_a_forbidden_import_breaks_the_layering(tmp_path: Path) -> None:
    tree = _package(
        tmp_path,
        {
            "model/__init__.py": "",
            "model/rules.py": "",
            "impl/store/sql.py": "from leaseproof.model import rules\n",
            "conformance/spec/explore.py": "from leaseproof.conformance.frontends.progress import ProgressLine\n",
            "conformance/frontends/progress.py": "",
            "conformance/frontends/commands/explore.py": "from leaseproof.conformance.spec import explore\n",
            "conformance/lockstep/verify.py": "from leaseproof.conformance.traces.trace import record\n",
            "conformance/traces/trace.py": "import leaseproof.conformance.boundary.codec\n",
            "conformance/boundary/codec.py": "from leaseproof.conformance.lockstep import world\n",
            "conformance/queues/matrix.py": "from leaseproof.conformance.queues.subjects import make\n",
            "conformance/queues/subjects/__init__.py": "from leaseproof.conformance.queues import protocol\n",
        },
    )
    assert layering(imports(tree)) == [
        "leaseproof.conformance.spec imports the frontends (conformance/spec/explore.py)",
        "a cycle: leaseproof.conformance.boundary and leaseproof.conformance.lockstep import each other, at least"
        " through others (conformance/boundary/codec.py)",
        "a cycle: leaseproof.conformance.frontends and leaseproof.conformance.spec import each other, at least"
        " through others (conformance/frontends/commands/explore.py)",
        "a cycle: leaseproof.conformance.lockstep and leaseproof.conformance.traces import each other, at least"
        " through others (conformance/lockstep/verify.py)",
    ]
    (tree / "model/rules.py").write_text("from leaseproof.impl.store import sql\n")
    (tree / "impl/store/sql.py").write_text("from leaseproof.conformance.spec import explore\n")
    wrong = layering(imports(tree))
    assert "model/ imports leaseproof.impl.store (model/rules.py)" in wrong
    assert "impl/ imports leaseproof.conformance.spec (impl/store/sql.py)" in wrong
