"""Lock files (aioareal.io): a planted symbolic link is never followed and its target never truncated;
a FIFO or folder in a lock's place is refused at once, in one line, not waited on."""
from __future__ import annotations

import os
import threading

import pytest

from aioareal.errors import UserError
from aioareal.io import exclusive_lock, open_lock_file


@pytest.mark.parametrize("plant", ["symlink", "dangling symlink", "fifo", "folder"])
def test_a_planted_lock_file_is_refused_and_its_target_kept(tmp_path, plant):
    target = tmp_path / "precious.txt"
    target.write_text("keep me\n")
    lock = tmp_path / ".cache.lock"
    {"symlink": lambda: lock.symlink_to(target), "dangling symlink": lambda: lock.symlink_to(tmp_path / "new"),
     "fifo": lambda: os.mkfifo(lock), "folder": lambda: lock.mkdir()}[plant]()
    with pytest.raises(UserError, match="not a regular file") as error:
        with exclusive_lock(lock):
            pytest.fail("the with-block ran on a planted lock")
    assert "\n" not in str(error.value) and str(lock) in str(error.value)
    assert target.read_text() == "keep me\n" and not (tmp_path / "new").exists()


def test_the_lock_excludes_a_second_holder_until_the_first_leaves(tmp_path):
    lock, order = tmp_path / ".x.lock", []
    with exclusive_lock(lock):
        waiter = threading.Thread(target=lambda: exclusive_lock(lock).__enter__() or order.append("second"))
        waiter.start()
        waiter.join(0.3)
        order.append("first done")
    waiter.join(5)
    assert order == ["first done", "second"]


def test_a_lock_file_that_is_unwritable_is_one_line(tmp_path):
    (tmp_path / "ro").mkdir()
    os.chmod(tmp_path / "ro", 0o500)
    try:
        if os.access(tmp_path / "ro", os.W_OK):
            pytest.skip("running as a user that writes anywhere (root)")
        with pytest.raises(UserError, match="cannot open a lock file"):
            open_lock_file(tmp_path / "ro" / ".l.lock")
    finally:
        os.chmod(tmp_path / "ro", 0o700)
