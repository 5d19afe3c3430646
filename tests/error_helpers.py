"""What a command's outcome must look like when given bad input, shared by the fuzz tests
(tests/architecture/test_fuzz_inputs.py, test_fuzz_commands.py): success, or exactly one printable
line 'error: ...' on stderr and exit code 2, never a traceback."""
from __future__ import annotations

import contextlib
import io
from collections.abc import Callable
from typing import Any

from aioareal.errors import guarded


def outcome(fn: Callable[[], Any]) -> tuple[int, str]:
    """Run `fn` as a command runs (errors.guarded): (exit code, stderr). Anything but a user error
    escapes as the exception and fails the test with its traceback."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = guarded(False, lambda: (fn(), 0)[1])
    return code, err.getvalue()


def assert_clean(code: int, err: str) -> None:
    """Success, or one printable line 'error: ...' and exit code 2."""
    if code == 0:
        assert err == ""
        return
    assert code == 2, (code, err)
    assert err.endswith("\n") and err.count("\n") == 1, repr(err)
    assert err.startswith("error: ") and "Traceback" not in err, repr(err)
    # no control character reaches the terminal (ZWJ and the soft hyphen are invisible, not control)
    assert all(c.isprintable() or c in "\u200d\u00ad" for c in err[:-1]), repr(err)


def check(fn: Callable[[], Any]) -> None:
    assert_clean(*outcome(fn))
