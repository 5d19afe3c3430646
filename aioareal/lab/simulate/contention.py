"""How the parts of a cell share hardware, on the virtual clock.

A cell (docs/architecture.md rule 7) is one generator, one trainer and one event loop. On one device (the CPU,
or one GPU holding both models) the two contend: while both work, each runs slower than alone by
the profile's measured contention factor (processor sharing: a train step's remaining work drains
at 1/factor while the generator decodes, at full speed while it idles). On two devices they do not
contend, but a published version crosses the link between them. N cells train one model: each
step ends with an all-reduce of the gradients over the link, and no cell steps before all have
their batch (versions advance in lockstep).
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass

from ...errors import UserError
from .cost_profile import Profile

ROLES = ("gen", "train")
EPS = 1e-12  # seconds of work below which a job counts as done (float rounding of the clock)
# Per-hop latency of a ring all-reduce (NCCL over NVLink/PCIe is some microseconds per hop).
ALLREDUCE_HOP_S = 10e-6
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass
class Topology:
    cells: int = 1
    devices_per_cell: int = 1  # 1: generator and trainer share a device; 2: one each
    link_gbps: float = 0.0  # device-to-device GB/s; 0: take the profile's

    def check(self, profile: Profile) -> None:
        if self.cells < 1 or self.devices_per_cell not in (1, 2):
            raise UserError(f"--cells must be >= 1 and --devices-per-cell 1 or 2, got {self.cells} and "
                            f"{self.devices_per_cell}")
        if (self.cells > 1 or self.devices_per_cell == 2) and self.link(profile) <= 0:
            raise UserError(f"{profile.name}: two-device and multi-cell layouts need a link bandwidth: the "
                            "profile has no link_gbps, pass --link-gbps")

    def link(self, profile: Profile) -> float:
        return self.link_gbps or profile.link_gbps

    def publish_s(self, profile: Profile) -> float:
        """Staging a version; across the link when the generator has a device of its own."""
        if self.devices_per_cell == 1:
            return profile.publish_s
        weight_bytes = profile.param_count * DTYPE_BYTES.get(profile.dtype, 2)
        return profile.publish_s + weight_bytes / (self.link(profile) * 1e9)

    def allreduce_s(self, profile: Profile) -> float:
        """Ring all-reduce of fp32 gradients over N cells: 2(N-1)/N of the bytes cross each link."""
        n = self.cells
        if n == 1:
            return 0.0
        grad_bytes = profile.param_count * 4
        return 2 * (n - 1) / n * grad_bytes / (self.link(profile) * 1e9) + 2 * (n - 1) * ALLREDUCE_HOP_S

    def label(self) -> str:
        per = ("generator + trainer on one device" if self.devices_per_cell == 1
               else "generator and trainer on two devices")
        return f"{self.cells} cell{'s' if self.cells > 1 else ''}, {per}"


class Device:
    """The hardware of one cell. `wake[role]` is set whenever something that role is waiting on
    changed: the other side started or stopped working, or (for the generator) a new version."""

    def __init__(self, profile: Profile, shared: bool) -> None:
        c = profile.contention
        self.slowdown = {"gen": c.gen, "train": c.train} if shared else {"gen": 1.0, "train": 1.0}
        self.active: set[str] = set()
        self.wake = {role: asyncio.Event() for role in ROLES}

    def factor(self, role: str) -> float:
        other = "train" if role == "gen" else "gen"
        return self.slowdown[role] if other in self.active else 1.0

    def set_active(self, role: str, on: bool) -> None:
        if (role in self.active) == on:
            return
        if on:
            self.active.add(role)
        else:
            self.active.discard(role)
        other = "train" if role == "gen" else "gen"
        if self.slowdown[other] != 1.0:
            self.wake[other].set()  # its speed just changed

    async def work(self, role: str, seconds: float) -> None:
        """Do `seconds` of work (as measured alone), slower while the other side works too."""
        loop = asyncio.get_running_loop()
        remaining = seconds
        while remaining > EPS:
            factor = self.factor(role)
            start = loop.time()
            await sleep_unless(self.wake[role], remaining * factor)
            remaining -= (loop.time() - start) / factor


async def sleep_unless(wake: asyncio.Event, seconds: float) -> bool:
    """Sleep `seconds`, or less if `wake` is set meanwhile (cleared first); True if woken early.
    (asyncio.wait_for would do, but makes a task per call: this runs a million times per simulation.)"""
    wake.clear()
    timer = asyncio.get_running_loop().call_later(seconds, wake.set)
    await wake.wait()
    woken = not timer.cancelled() and timer.when() > asyncio.get_running_loop().time()
    timer.cancel()
    return woken


class Lockstep:
    """N trainers step together: each waits until all have computed their gradients."""

    def __init__(self, parties: int) -> None:
        self.parties, self.arrived, self.event = parties, 0, asyncio.Event()

    async def wait(self) -> None:
        if self.parties == 1:
            return
        event = self.event
        self.arrived += 1
        if self.arrived == self.parties:
            self.arrived, self.event = 0, asyncio.Event()
            event.set()
        else:
            await event.wait()
