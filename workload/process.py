"""The process of one rank, whoever starts it (workload.launcher, torchrun, srun): its rendezvous on
this machine listens on loopback only, it exits when the launcher that started it is gone, and on
a CPU it keeps the memory a step frees (as the CUDA caching allocator does on GPUs).
Standard library and torch only (it is part of the emitted job).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import datetime
import os
import socket
import threading
import time
from typing import Any

import torch.distributed as dist


def keep_freed_memory() -> bool:
    """CPU runs: glibc keeps the memory a step frees for the next one (never trims the heap, serves
    blocks up to 32 MiB from it instead of mmap), as the CUDA caching allocator does on GPUs.

    By default every large tensor is a fresh mmap whose pages the kernel faults in one by one:
    on a virtual machine that costs ~2 us per 4 KiB, so a 15 MB gradient buffer took 9 ms to
    allocate against 2 ms to copy. PyTorch's CPU tuning guide gives the same advice (jemalloc or
    tcmalloc). Returns whether glibc took the settings (False on other C libraries).
    """
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3  # glibc's malloc.h
    trim = mallopt(m_trim_threshold, ctypes.c_int(2**31 - 1))
    mmap = mallopt(m_mmap_threshold, ctypes.c_int(32 * 2**20))
    return trim == 1 and mmap == 1



LOOPBACK = ("127.0.0.1", "localhost", "::1")
_LISTENING: list[socket.socket] = []  # the store's listening socket lives as long as the rank


def loopback_rendezvous(rank: int, world: int, timeout: datetime.timedelta) -> dict[str, Any]:
    """init_process_group's store for a run on this machine (MASTER_ADDR a loopback address):
    rank 0 binds the rendezvous to that address itself (torch's own store listens on every
    interface), so nothing of the job is reachable from the network. {} otherwise: a cluster's
    MASTER_ADDR, or torchrun's store, as torch sets them up."""
    addr = os.environ.get("MASTER_ADDR", "")
    if addr not in LOOPBACK or os.environ.get("TORCHELASTIC_RUN_ID"):
        return {}
    port = int(os.environ["MASTER_PORT"])
    listen_fd = None
    if rank == 0:
        family = socket.AF_INET6 if addr == "::1" else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("::1" if addr == "::1" else "127.0.0.1", port))
        sock.listen(max(world, 16))
        _LISTENING.append(sock)
        listen_fd = sock.fileno()
    # TCPStore is torch.distributed's documented API, exported without __all__
    store = dist.TCPStore(  # type: ignore[attr-defined]
        addr, port, world, rank == 0, timeout, master_listen_fd=listen_fd
    )
    return {"store": store, "rank": rank, "world_size": world}


def watch_parent() -> None:
    """Exit when the launcher that set PERFMODEL_PARENT_PID is gone (killed without stopping us):
    a rank must never outlive the command that started it."""
    parent = os.environ.get("PERFMODEL_PARENT_PID")
    if not parent:
        return

    def poll() -> None:
        while os.getppid() == int(parent):
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=poll, name="watch-parent", daemon=True).start()
