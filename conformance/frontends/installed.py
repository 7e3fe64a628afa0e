"""Where the files installed with leaseproof are: the spec pages, the corpus, the Node.js example.

They are package data, so the README's commands can be followed outside a
checkout (`leaseproof path NAME` prints a folder; `leaseproof spec --check`
reads the installed pages there). Each folder is found through
`importlib.resources`: in an installed wheel it is site-packages', in an
editable install the checkout's own. Light on purpose: the commands that use
it start at once.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

# Each name: the package that holds the folder, the folder below it ("" the package's
# own), and what is there.
FOLDERS: dict[str, tuple[str, str, str]] = {
    "specs": (
        "leaseproof.specs",
        "",
        "the spec pages (delivery.md, lifecycle.md, adapter-protocol.md, guarantees.md), the protocol's JSON "
        "Schema and the guarantee traces",
    ),
    "corpus": (
        "leaseproof.conformance.traces",
        "corpus",
        "the regression corpus: the minimal counterexample of every shipped mutant, one trace (.jsonl) each",
    ),
    "node-example": (
        "leaseproof.conformance",
        "examples/node",
        "the Node.js example adapter of both machines (adapter.js; no npm packages)",
    ),
}


class NotInstalled(Exception):
    """The folder is not where the installed package says it is."""


def installed(name: str) -> Path:
    """The folder `name` (a key of FOLDERS) as installed: site-packages', or an editable install's checkout's."""
    package, below, _ = FOLDERS[name]
    try:
        root = resources.files(package)
    except ModuleNotFoundError as exc:
        raise NotInstalled(f"{name}: the package {package} is not installed ({exc})") from None
    folder = root.joinpath(*below.split("/")) if below else root
    # A wheel installs as files; anything else (a zip import) has no folder to name.
    if not isinstance(folder, Path) or not folder.is_dir():
        raise NotInstalled(f"{name}: {folder} is not a folder; reinstall leaseproof (pip install leaseproof)")
    return folder
