"""Users' code by import path: 'package.module:name' or 'path/to/file.py:name' (dotted names reach
into the module: 'file.py:Class.method'). Reward functions, episodes and tools are all named this
way; each error says which of them could not be loaded, from where, and what would be right."""
from __future__ import annotations

import functools
import hashlib
import importlib
import importlib.util
import sys
import traceback
from pathlib import Path
from typing import Any

from .errors import UserError


def resolve_spec(spec: str, what: str, error: type[UserError] = UserError) -> Any:
    """The object `spec` names; `what` ("reward function", "episode", "tool") names it in errors."""
    target, sep, attr = spec.rpartition(":")
    if not sep or not target or not attr:
        raise error(f"{what} '{spec}': expected 'package.module:function' or 'path/to/file.py:function'")
    is_file = target.endswith(".py") or "/" in target or "\\" in target
    module = _import_file(spec, target, what, error) if is_file else _import_module(spec, target, what, error)
    try:
        return functools.reduce(getattr, attr.split("."), module)
    except AttributeError:
        names = [n for n, v in vars(module).items() if callable(v) and not n.startswith("_")
                 and getattr(v, "__module__", None) == module.__name__]
        raise error(f"{what} '{spec}': '{target}' has no attribute '{attr}' "
                    f"(its functions: {', '.join(names) or 'none'})") from None


def _import_module(spec: str, name: str, what: str, error: type[UserError]) -> Any:
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name and (name == e.name or name.startswith(e.name + ".")):
            raise error(f"{what} '{spec}': no module named '{e.name}' (is its directory on PYTHONPATH? "
                        f"or give a file: 'path/to/{name.split('.')[-1]}.py:function')") from None
        raise error(f"{what} '{spec}': importing '{name}' failed: {first_line(e)}") from None
    except Exception as e:
        raise error(f"{what} '{spec}': importing '{name}' failed: "
                    f"{type(e).__name__}: {first_line(e)}{user_frame(e)}") from None


def _import_file(spec: str, target: str, what: str, error: type[UserError]) -> Any:
    path = Path(target).expanduser().resolve()
    if not path.is_file():
        raise error(f"{what} '{spec}': no such file {target}")
    # One module per file, whoever loads it (a file of reward functions and episodes imports once).
    name = f"aioareal_user_{path.stem}_{hashlib.sha1(str(path).encode()).hexdigest()[:8]}"
    if name in sys.modules:
        return sys.modules[name]
    module_spec = importlib.util.spec_from_file_location(name, path)
    assert module_spec is not None and module_spec.loader is not None
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module  # dataclasses and pickling look the module up by name
    try:
        module_spec.loader.exec_module(module)
    except Exception as e:
        del sys.modules[name]
        raise error(f"{what} '{spec}': loading {target} failed: "
                    f"{type(e).__name__}: {first_line(e)}{user_frame(e)}") from None
    return module


def first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [""])[0]


def user_frame(e: BaseException) -> str:
    """' (at file.py:12)': the innermost frame of the traceback, where the user's code went wrong."""
    if isinstance(e, SyntaxError) and e.filename:
        return f" (at {e.filename}:{e.lineno})"
    frames = traceback.extract_tb(e.__traceback__)
    return f" (at {frames[-1].filename}:{frames[-1].lineno})" if frames else ""
