"""Run under torchrun by test_store_binding.py: joins a 2-rank gloo job as the README's CPU example
does, then writes, as JSON in `report-RANK.json` in the working directory, the addresses its own process and
torchrun's (its parent) listen on. A file per rank, not stdout: two ranks printing at once can interleave."""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

import torch.distributed as dist


def listening(pid: int) -> list[str]:
    """Local addresses ("0100007F:1F90", /proc/net/tcp's hex) of the TCP sockets `pid` listens on."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            found = re.fullmatch(r"socket:\[(\d+)\]", os.readlink(f"/proc/{pid}/fd/{fd}"))
        except OSError:
            continue
        if found:
            inodes.add(found.group(1))
    out = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in open(table).read().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                out.append(fields[1])
    return out


if __name__ == "__main__":
    dist.init_process_group("gloo")
    dist.barrier()
    report = {"rank": os.environ["RANK"], "worker": listening(os.getpid()), "torchrun": listening(os.getppid())}
    Path(f"report-{os.environ['RANK']}.json").write_text(json.dumps(report))
    dist.barrier()
    dist.destroy_process_group()
