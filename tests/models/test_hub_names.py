"""A hub model name that cannot be fetched fails at once in one line (models/local_names.py `check_hub`),
not after transformers' minute of retries; a cached one loads from the cache with the hub out of reach."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
from huggingface_hub import constants

from aioareal.errors import UserError
from aioareal.models import local_names
from aioareal.models.local_names import check_hub, hub_reachable

CLOSED = "http://127.0.0.1:9"  # the discard port: nothing listens, the connection is refused at once


@pytest.fixture
def offline_hub(monkeypatch, tmp_path):
    """No hub (a closed local port as the endpoint), an empty cache of our own, offline mode unset."""
    monkeypatch.setattr(constants, "ENDPOINT", CLOSED)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(local_names, "_reachable", {})
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    return tmp_path / "hub"


def cache_repo(cache, repo: str) -> None:
    """A repository as huggingface_hub's cache holds it: refs/main naming a snapshot with config.json."""
    root = cache / ("models--" + repo.replace("/", "--"))
    (root / "refs").mkdir(parents=True)
    (root / "refs" / "main").write_text("abc123")
    (root / "snapshots" / "abc123").mkdir(parents=True)
    (root / "snapshots" / "abc123" / "config.json").write_text("{}")


@pytest.mark.parametrize("name", ["nosuchmodel", "owner/no-such-model"])
def test_an_uncached_name_with_the_hub_unreachable_is_one_line(offline_hub, name):
    with pytest.raises(UserError) as e:
        check_hub(name)
    line = str(e.value)
    assert len(line.splitlines()) == 1 and f"'{name}'" in line and "127.0.0.1 cannot be reached" in line


def test_offline_mode_refuses_an_uncached_name_without_asking_the_network(offline_hub, monkeypatch):
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(local_names, "hub_reachable", lambda endpoint: pytest.fail("asked the network"))
    with pytest.raises(UserError, match="HF_HUB_OFFLINE is set"):
        check_hub("owner/model")


def test_a_cached_name_loads_from_the_cache_in_offline_mode(offline_hub, monkeypatch):
    cache_repo(offline_hub, "owner/model")
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")  # restored after the test, whatever check_hub sets
    check_hub("owner/model")
    assert constants.HF_HUB_OFFLINE is True and os.environ["HF_HUB_OFFLINE"] == "1"


def test_a_reachable_hub_is_left_to_the_loaders(offline_hub, monkeypatch):
    monkeypatch.setattr(local_names, "hub_reachable", lambda endpoint: True)
    check_hub("owner/not-cached")  # the hub will say whether it exists
    assert constants.HF_HUB_OFFLINE is False


def test_reachability_is_asked_once_per_endpoint(offline_hub, monkeypatch):
    calls = []
    real = local_names.socket.create_connection
    monkeypatch.setattr(local_names.socket, "create_connection", lambda *a, **k: calls.append(a) or real(*a, **k))
    assert not hub_reachable(CLOSED) and not hub_reachable(CLOSED)
    assert len(calls) == 1


def test_eval_of_an_unknown_name_offline_is_one_line_and_exit_2(tmp_path):
    env = {**os.environ, "HF_ENDPOINT": CLOSED, "HF_HUB_CACHE": str(tmp_path / "hub"), "OMP_NUM_THREADS": "1"}
    env.pop("HF_HUB_OFFLINE", None)
    done = subprocess.run([sys.executable, "-m", "aioareal", "eval", "nosuchmodel"], capture_output=True, text=True,
                          env=env, timeout=120)
    assert done.returncode == 2
    errors = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and "'nosuchmodel'" in errors[0] and "Retrying" not in done.stderr + done.stdout
