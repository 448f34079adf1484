"""Importing the user's own modules at start-up (`actor_rollout_ref.model.external_lib`, verl's key).

A module named there is imported by the driver before the config is checked and by every worker before it builds
its model, so whatever it registers (an advantage estimator, a policy loss, a reward manager, a tool, a rollout
engine, a Hugging Face model class) is known everywhere a registry is read. The value is a module name importable
from the launch directory or PYTHONPATH (`my_plugins`, `my_pkg.losses`), a path to a `.py` file, or a list of these.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from collections.abc import Iterable
from types import ModuleType


class ExternalLibError(ImportError):
    """An `external_lib` entry that could not be imported; the message names the key and the entry."""


def _entries(value: str | Iterable[str] | None) -> list[str]:
    if not value:
        return []
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return [str(part) for part in value]


def import_external_libs(value: str | Iterable[str] | None,
                         key: str = "actor_rollout_ref.model.external_lib") -> list[ModuleType]:
    """Import every module (or `.py` file) of `value`; raise ExternalLibError naming `key` when one fails."""
    modules = []
    for entry in _entries(value):
        try:
            if entry.endswith(".py"):
                path = os.path.abspath(os.path.expanduser(entry))
                if not os.path.isfile(path):
                    raise FileNotFoundError(f"no such file: {path}")
                name = f"quiver_external_{os.path.splitext(os.path.basename(path))[0]}"
                module = sys.modules.get(name)
                if module is None:
                    spec = importlib.util.spec_from_file_location(name, path)
                    module = importlib.util.module_from_spec(spec)
                    sys.modules[name] = module
                    spec.loader.exec_module(module)
            else:
                module = importlib.import_module(entry)
        except Exception as err:
            sys.modules.pop(f"quiver_external_{os.path.splitext(os.path.basename(entry))[0]}", None)
            raise ExternalLibError(f"{key}: could not import {entry!r}: {type(err).__name__}: {err} (a module "
                                   "name importable from the launch directory or PYTHONPATH, or a .py file)") from err
        modules.append(module)
    return modules
