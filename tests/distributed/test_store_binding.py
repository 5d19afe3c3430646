"""The rendezvous store listens only where it is asked to (docs/reliability.md#the-rendezvous-store):
torch's TCPStore binds every interface whatever the endpoint; `python -m aioareal.distributed.torchrun`
hands it a socket bound to the endpoint's address, and keeps gloo on loopback for a one-machine job."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch.distributed as dist
from store_probe import listening

from aioareal.distributed.torchrun import BoundTCPStore, endpoint_host, is_loopback

LOOPBACK_V4 = "0100007F"  # 127.0.0.1 as /proc/net/tcp writes it
PROBE = Path(__file__).resolve().parents[1] / "store_probe.py"


def test_a_bound_store_listens_on_loopback_only_and_serves_clients():
    server = BoundTCPStore("127.0.0.1", 0, 2, True, wait_for_workers=False)
    mine = [a for a in listening(os.getpid()) if a.endswith(f":{server.port:04X}")]
    assert mine == [f"{LOOPBACK_V4}:{server.port:04X}"]
    client = dist.TCPStore("127.0.0.1", server.port, 2, False)
    client.set("k", "v")
    assert server.get("k") == b"v"


@pytest.mark.parametrize("argv,host", [
    (["--nproc-per-node", "2", "-m", "aioareal"], "127.0.0.1"),
    (["--rdzv-endpoint", "node0:29500", "-m", "aioareal"], "node0"),
    (["--rdzv-endpoint=10.0.0.5:29400", "x.py"], "10.0.0.5"),
    (["--master-addr", "localhost", "x.py"], "localhost"),
])
def test_the_endpoint_host_is_read_from_torchruns_arguments(argv, host):
    assert endpoint_host(argv) == host


def test_loopback_names():
    assert is_loopback("127.0.0.1") and is_loopback("localhost") and not is_loopback("10.0.0.5")


@pytest.mark.slow  # two ranks plus torchrun start torch: ~15 s on a quiet machine, a minute on a busy one
def test_the_readme_single_machine_job_listens_on_loopback_only(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(
        [str(PROBE.parents[1]), str(PROBE.parent), os.environ.get("PYTHONPATH", "")])}
    env.pop("GLOO_SOCKET_IFNAME", None)
    done = subprocess.run([sys.executable, "-m", "aioareal.distributed.torchrun", "--nproc-per-node", "2", str(PROBE)],
                          capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    reports = [json.loads(path.read_text()) for path in sorted(tmp_path.glob("report-*.json"))]
    assert sorted(r["rank"] for r in reports) == ["0", "1"]
    addresses = {a for r in reports for a in r["worker"] + r["torchrun"]}
    assert reports[0]["torchrun"]  # torchrun's store is there to be checked
    assert addresses and all(a.startswith(LOOPBACK_V4 + ":") for a in addresses), addresses
