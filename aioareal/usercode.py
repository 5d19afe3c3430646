"""Users' code by import path: 'package.module:name' or 'path/to/file.py:name' (dotted names reach
into the module: 'file.py:Class.method'). Reward functions, episodes and tools are all named this
way; each error says which of them could not be loaded, from where, and what would be right.

Objects handed to the Python API (`aioareal.train(reward_funcs=[lambda ...])`) are named the same
way, as 'python:NAME' (`register`): the config records the name, this process's registry holds the
object. A spawned worker process (reward.isolation=process) has no registry, so such a name works
only where the code runs in this process (api.py refuses the combination up front)."""
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

REGISTERED_PREFIX = "python:"
_registered: dict[str, Any] = {}


def register(obj: Any, name: str) -> str:
    """'python:NAME' for `obj`, which this process's resolve_spec then returns: the latest object
    registered under a name wins (a notebook cell run again replaces its function)."""
    if not name.isidentifier():
        raise UserError(f"'{name}' cannot name a registered object: expected a Python identifier")
    _registered[name] = obj
    return REGISTERED_PREFIX + name


def is_registered(spec: str) -> bool:
    return spec.startswith(REGISTERED_PREFIX)


def _registered_object(spec: str, what: str, error: type[UserError]) -> Any:
    name = spec.removeprefix(REGISTERED_PREFIX)
    if name not in _registered:
        raise error(f"{what} '{spec}' was handed to aioareal from Python in another process; pass it again "
                    "(aioareal.train(..., resume=RUN_DIR) with the same objects), or name it by import path "
                    "('package.module:function' or 'path/to/file.py:function')")
    return _registered[name]


def resolve_spec(spec: str, what: str, error: type[UserError] = UserError) -> Any:
    """The object `spec` names; `what` ("reward function", "episode", "tool") names it in errors."""
    if is_registered(spec):
        return _registered_object(spec, what, error)
    target, attr = _split(spec, what, error)
    module = _import_file(spec, target, what, error) if _is_file(target) else _import_module(spec, target, what, error)
    try:
        return functools.reduce(getattr, attr.split("."), module)
    except AttributeError:
        names = [n for n, v in vars(module).items() if callable(v) and not n.startswith("_")
                 and getattr(v, "__module__", None) == module.__name__]
        raise error(f"{what} '{spec}': '{target}' has no attribute '{attr}' "
                    f"(its functions: {', '.join(names) or 'none'})") from None


def check_spec(spec: str, what: str, error: type[UserError] = UserError) -> None:
    """What can be checked of `spec` without running any of the user's code: its form, that its file
    exists, that its top-level module can be found. A run checks this before torch loads, so a typo
    is an error in a second rather than after the ~7 s of importing torch and transformers."""
    if is_registered(spec):
        _registered_object(spec, what, error)
        return
    target, _ = _split(spec, what, error)
    if _is_file(target):
        if not Path(target).expanduser().is_file():
            raise error(_no_file(spec, target, what))
        return
    top = target.split(".")[0]
    try:
        missing = top not in sys.modules and importlib.util.find_spec(top) is None  # finds, runs nothing
    except (ImportError, ValueError):
        return  # a name find_spec cannot look up: resolve_spec reports it as it imports
    if missing:
        raise error(_no_module(spec, top, target, what))


def _split(spec: str, what: str, error: type[UserError]) -> tuple[str, str]:
    target, sep, attr = spec.rpartition(":")
    if not sep or not target or not attr:
        raise error(f"{what} '{spec}': expected 'package.module:function' or 'path/to/file.py:function'")
    return target, attr


def _is_file(target: str) -> bool:
    return target.endswith(".py") or "/" in target or "\\" in target


def _no_file(spec: str, target: str, what: str) -> str:
    return f"{what} '{spec}': no such file {target}"


def _no_module(spec: str, missing: str, target: str, what: str) -> str:
    return (f"{what} '{spec}': no module named '{missing}' (is its directory on PYTHONPATH? "
            f"or give a file: 'path/to/{target.split('.')[-1]}.py:function')")


def _import_module(spec: str, name: str, what: str, error: type[UserError]) -> Any:
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name and (name == e.name or name.startswith(e.name + ".")):
            raise error(_no_module(spec, e.name, name, what)) from None
        raise error(f"{what} '{spec}': importing '{name}' failed: {first_line(e)}") from None
    except Exception as e:
        raise error(f"{what} '{spec}': importing '{name}' failed: "
                    f"{type(e).__name__}: {first_line(e)}{user_frame(e)}") from None


def _import_file(spec: str, target: str, what: str, error: type[UserError]) -> Any:
    path = Path(target).expanduser().resolve()
    if not path.is_file():
        raise error(_no_file(spec, target, what))
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
