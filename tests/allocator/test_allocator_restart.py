"""allocator.py: which malloc run.allocator picks, and the one restart of `python -m aioareal` with
it in LD_PRELOAD (child processes get the user's LD_PRELOAD back)."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aioareal import allocator
from aioareal.errors import UserError


def _finder(*present: str):
    return lambda lib: f"lib{lib}.so.9" if lib in present else None


def test_auto_takes_tcmalloc_then_jemalloc_then_glibc():
    assert allocator.choose("auto", _finder("jemalloc", "tcmalloc_minimal")) == ("tcmalloc", "libtcmalloc_minimal.so.9")
    assert allocator.choose("auto", _finder("jemalloc")) == ("jemalloc", "libjemalloc.so.9")
    assert allocator.choose("auto", _finder()) == ("system", None)
    assert allocator.choose("system", _finder("jemalloc")) == ("system", None)


def test_a_named_allocator_that_is_not_installed_is_a_clear_error():
    with pytest.raises(UserError, match=r"run.allocator=jemalloc.*libjemalloc2"):
        allocator.choose("jemalloc", _finder("tcmalloc"))
    assert allocator.choose("tcmalloc", _finder("tcmalloc")) == ("tcmalloc", "libtcmalloc.so.9")


@given(before=st.one_of(st.none(), st.text(alphabet="abc/. :", max_size=20)))
def test_the_restart_preloads_the_library_first_and_children_get_the_users_preload_back(before):
    env = {"PATH": "/bin"} if before is None else {"PATH": "/bin", "LD_PRELOAD": before}
    restarted = allocator.restart_env(env, "tcmalloc", "libtcmalloc_minimal.so.4")
    assert restarted["LD_PRELOAD"].split()[0] == "libtcmalloc_minimal.so.4"
    assert not allocator.needs_restart(restarted) and allocator.needs_restart(env)
    allocator.settle(restarted)
    restarted.pop(allocator.MARK)
    expected = dict(env)
    if not before:
        expected.pop("LD_PRELOAD", None)
    assert restarted == expected


def test_a_process_restarts_once_with_the_library_loaded(tmp_path):
    """The real exec: a script that asks for an allocator (libresolv, which python does not load
    itself, stands in for one) runs twice, the second time with the library mapped and the mark
    set, and its child sees no LD_PRELOAD."""
    script = tmp_path / "restart.py"
    script.write_text(textwrap.dedent("""
        import os, subprocess, sys
        from aioareal import allocator
        allocator.choose = lambda setting: ("tcmalloc", "libresolv.so.2")
        print("start", flush=True)
        allocator.reexec("auto")
        maps = open("/proc/self/maps").read()
        child = subprocess.run([sys.executable, "-c", "import os; print(os.environ.get('LD_PRELOAD'))"],
                               capture_output=True, text=True).stdout.strip()
        print(allocator.in_use(), "libresolv.so.2" in maps, child)
    """))
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", allocator.MARK)}
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:3] == ["start", "start", "tcmalloc True None"]


def test_glibc_needs_no_restart(monkeypatch):
    monkeypatch.delenv(allocator.MARK, raising=False)
    monkeypatch.setattr(allocator, "choose", lambda setting: ("system", None))
    monkeypatch.setattr(allocator, "_exec", lambda env: pytest.fail("restarted for glibc"))
    allocator.reexec("auto")
    assert allocator.in_use() == "system"


def test_onednn_cache_is_capped_unless_the_user_set_it():
    env: dict[str, str] = {}
    allocator.cap_onednn_cache(env)
    assert env == {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": str(allocator.ONEDNN_CACHE)}
    mine = {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "1024"}
    allocator.cap_onednn_cache(mine)
    assert mine == {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "1024"}


def test_a_fallback_to_glibc_says_what_it_costs(monkeypatch):
    monkeypatch.delenv(allocator.MARK, raising=False)
    line = allocator.note("auto")
    assert line.startswith("allocator: system (run.allocator=auto); neither tcmalloc nor jemalloc was found")
    assert "1.4x" in line and "libtcmalloc-minimal4" in line
    assert allocator.note("system") == "allocator: system (run.allocator=system)"  # asked for: nothing to say
    monkeypatch.setenv(allocator.MARK, "tcmalloc")
    assert allocator.note("auto") == "allocator: tcmalloc (run.allocator=auto)"
