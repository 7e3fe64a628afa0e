"""Loading what a user names as `MODULE:NAME` (an in-process adapter's factory, a queue subject's class)."""

from __future__ import annotations

import importlib
import os
import sys


class LoadError(ValueError):
    """`MODULE:NAME` names nothing that can be loaded; the message says why."""


def import_target(spec: str, form: str) -> object:
    """NAME of MODULE, MODULE found as `python -m` finds it: in the current folder first, then on
    sys.path (the installed `leaseproof` script does not put the current folder there itself). `form`:
    what a malformed spec is told it should be ("MODULE:FACTORY, e.g. ...")."""
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise LoadError(f"expected {form}")
    here = os.getcwd()
    if here not in sys.path and "" not in sys.path:
        sys.path.insert(0, here)
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise LoadError(f"cannot load it: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - whatever the user's module raised on import is the reason
        raise LoadError(f"cannot load it: importing {module_name} raised {type(exc).__name__}: {exc}") from None
    try:
        return getattr(module, attribute)
    except AttributeError as exc:
        raise LoadError(f"cannot load it: {exc}") from None
