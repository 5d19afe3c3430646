"""`python -m aioareal.distributed.torchrun ARGS`: torchrun, with every store it serves bound to its
host's address (`master_listen_fd`) instead of every interface, and for a loopback address gloo's and
NCCL's sockets kept on loopback too (why: docs/reliability.md#the-rendezvous-store).
"""
from __future__ import annotations

import ipaddress
import os
import socket
import sys
from typing import Any

import torch.distributed as dist
from torch._C import _distributed_c10d

LOOPBACK_IFNAME = "lo"
_TCPStore = _distributed_c10d.TCPStore


class BoundTCPStore(_TCPStore):
    """A TCPStore whose server listens on `host_name`'s address only (its clients are unchanged)."""

    def __init__(self, host_name: str, port: int = 0, world_size: int | None = None, is_master: bool = False,
                 *args: Any, **kwargs: Any) -> None:
        self._socket: socket.socket | None = None
        if is_master and kwargs.get("master_listen_fd") is None and len(args) < 4:
            self._socket = bound_socket(host_name, port)
            kwargs["master_listen_fd"] = self._socket.fileno()
            port = self._socket.getsockname()[1]
        super().__init__(host_name, port, world_size, is_master, *args, **kwargs)


def bound_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket on `host`'s first address (the one TCPStore's clients dial first)."""
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(address)
    sock.listen(socket.SOMAXCONN)
    return sock


def is_loopback(host: str) -> bool:
    try:
        return all(ipaddress.ip_address(info[4][0]).is_loopback for info in socket.getaddrinfo(host, None))
    except (OSError, ValueError):
        return False


def install() -> None:
    """Make every TCPStore made from here on a BoundTCPStore, however torch's modules name it."""
    dist.TCPStore = BoundTCPStore
    for name, module in list(sys.modules.items()):
        if name.startswith("torch.distributed") and getattr(module, "TCPStore", None) is _TCPStore:
            module.TCPStore = BoundTCPStore


def endpoint_host(argv: list[str]) -> str:
    """The host torchrun's store serves on: --rdzv-endpoint's, else --master-addr, else 127.0.0.1."""
    for flag in ("--rdzv-endpoint", "--rdzv_endpoint", "--master-addr", "--master_addr"):
        for i, arg in enumerate(argv):
            value = argv[i + 1] if arg == flag and i + 1 < len(argv) else arg.partition("=")[2]
            if (arg == flag or arg.startswith(flag + "=")) and value:
                return value.rsplit(":", 1)[0] if flag.startswith("--rdzv") and value.count(":") == 1 else value
    return "127.0.0.1"


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if is_loopback(endpoint_host(argv)):
        os.environ.setdefault("GLOO_SOCKET_IFNAME", LOOPBACK_IFNAME)
        os.environ.setdefault("NCCL_SOCKET_IFNAME", LOOPBACK_IFNAME)
    install()
    from torch.distributed import run  # after install: its modules bind the bound store by name

    install()  # and any module it imported that took the name already
    run.main(argv)


if __name__ == "__main__":
    main()
