"""Loads a file of the repository that is not in an installed package (scripts/, bench/) as
a module, for the tests that call its functions."""
from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parent.parent


def load(relpath: str) -> ModuleType:
    """The module in REPO/relpath (e.g. "scripts/layers_counts.py"), executed once per call."""
    path = REPO / relpath
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
