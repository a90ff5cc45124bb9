"""What /proc tells about a process: CPU seconds, resident memory, listening TCP ports; the bytes
a port's connections hold unread; and the generator's own CPU time (os.times). Linux only; every
reader returns None where /proc is absent."""

from __future__ import annotations

import os
import resource

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def own_cpu_seconds() -> float:
    times = os.times()
    return times.user + times.system


def _user_and_kernel(pid: int | None) -> tuple[float, float] | None:
    """User and system (kernel) CPU seconds used by ``pid`` so far."""
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rindex(b")") + 2 :].split()  # the command name may contain spaces
    return int(fields[11]) / _TICK, int(fields[12]) / _TICK  # utime, stime (fields 14 and 15)


def cpu_seconds(pid: int | None) -> float | None:
    """User + system CPU seconds used by ``pid`` so far."""
    times = _user_and_kernel(pid)
    return None if times is None else times[0] + times[1]


def kernel_cpu_seconds(pid: int | None) -> float | None:
    """System CPU seconds used by ``pid`` so far: its time in the kernel (system calls, and on
    loopback the network processing they trigger for the other end too)."""
    times = _user_and_kernel(pid)
    return None if times is None else times[1]


def _threads(pid: int | None, name: str) -> list[bytes] | None:
    """The file ``name`` of each thread of ``pid`` now alive (/proc/<pid>/task/*/<name>), a
    thread that ended meanwhile left out; None without /proc/<pid>/task."""
    if pid is None:
        return None
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    texts = []
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/{name}", "rb") as f:
                texts.append(f.read())
        except OSError:
            continue
    return texts


def threads_cpu_ns(pid: int | None) -> int | None:
    """CPU nanoseconds the threads of ``pid`` now alive have run (their first schedstat field):
    exact where :func:`cpu_seconds` counts clock ticks (10 ms), for windows of a fraction of a
    second; None without /proc/<pid>/task/*/schedstat."""
    texts = _threads(pid, "schedstat")
    total = sum(int(text.split()[0]) for text in texts or () if text.strip())
    return total or None


def wakeups(pid: int | None) -> int | None:
    """Times the threads of ``pid`` now alive have gone to sleep and been woken since they
    started (their voluntary context switches): on a virtual machine each such round trip is
    tens of microseconds of CPU (the core's idle state left and entered again), the dearest
    part of a message to a broker that is woken for nearly every one. None without /proc."""
    texts = _threads(pid, "status")
    if texts is None:
        return None
    key = b"voluntary_ctxt_switches:"
    return sum(
        int(line.split()[1]) for text in texts for line in text.splitlines() if line.startswith(key)
    )


def steal_seconds() -> float | None:
    """CPU seconds the hypervisor gave to others while this machine's CPUs wanted to run, all
    CPUs together so far (/proc/stat's steal). On a shared host it comes in waves, and a
    window with much of it says more about the neighbours than about the broker: a vCPU taken
    away in the middle of the broker's work, its caches cold when it returns."""
    try:
        with open("/proc/stat", "rb") as f:
            fields = f.readline().split()
    except OSError:
        return None
    return int(fields[8]) / _TICK if len(fields) > 8 and fields[0] == b"cpu" else None


def steal_pct(before: float | None, after: float | None, seconds: float) -> float | None:
    """The hypervisor's share of the machine's cores over ``seconds`` between two
    :func:`steal_seconds` readings, in %: a run with more than a few % of it measured the
    neighbours too (benchmarks/README.md, "Scenario 9 in detail"). None without /proc/stat."""
    if before is None or after is None or seconds <= 0:
        return None
    return round(100 * (after - before) / (seconds * (os.cpu_count() or 1)), 1)


def broker_cpu_seconds(pid: int | None) -> float | None:
    """CPU seconds of ``pid``'s threads from the scheduler (:func:`threads_cpu_ns`), or by
    clock ticks (:func:`cpu_seconds`) without schedstat."""
    ns = threads_cpu_ns(pid)
    return ns / 1e9 if ns is not None else cpu_seconds(pid)


def per_item_us(ns0: int | None, ns1: int | None, items: int) -> float | None:
    """Microseconds of CPU per item between two :func:`threads_cpu_ns` readings."""
    if ns0 is None or ns1 is None or items <= 0:
        return None
    return round((ns1 - ns0) / 1000 / items, 2)


def rss_kb(pid: int | None) -> int | None:
    """VmRSS of ``pid`` in KiB."""
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def listening_ports(pid: int) -> list[int]:
    """TCP ports ``pid`` listens on (sockets in state LISTEN among its file descriptors)."""
    inodes = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if link.startswith("socket:["):
                inodes.add(link[8:-1])
    except OSError:
        return []
    ports = [
        int(parts[1].rsplit(":", 1)[1], 16)
        for table in ("tcp", "tcp6")
        for parts in _tcp_table(f"/proc/{pid}/net/{table}") or []
        if len(parts) > 9 and parts[3] == "0A" and parts[9] in inodes
    ]
    return sorted(set(ports))


def _tcp_table(path: str) -> list[list[str]] | None:
    """The rows of a /proc/net/tcp-style table, split into fields (local address 1, state 3
    with 01 established and 0A listening, tx_queue:rx_queue 4, inode 9); None if unreadable."""
    try:
        with open(path) as f:
            next(f)  # the header
            return [line.split() for line in f]
    except (OSError, StopIteration):
        return None


def unread_bytes(port: int) -> list[int] | None:
    """Bytes received and not yet read by the application on each established TCP connection
    whose local port is ``port`` (the rx_queue of /proc/net/tcp, or of tcp6 when tcp has none:
    the receiver's rcv_nxt - copied_seq): on a broker's port, how far behind its readers are.
    None without /proc/net/tcp. Each table read walks the kernel's whole table of connections
    (about 4 ms here), during which the calling thread does nothing else."""
    want = f":{port:04X}"
    found = None
    for table in ("tcp", "tcp6"):
        rows = _tcp_table(f"/proc/net/{table}")
        if rows is None:
            continue
        found = [
            int(parts[4].split(":")[1], 16)  # tx_queue:rx_queue
            for parts in rows
            if len(parts) > 4 and parts[3] == "01" and parts[1].endswith(want)
        ]
        if found:
            break
    return found


def raise_fd_limit(want: int = 1 << 20) -> int:
    """Raise RLIMIT_NOFILE's soft limit towards ``want`` (up to the hard limit); returns it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = want if hard == resource.RLIM_INFINITY else min(want, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    return soft


def filesystem(path: str) -> str | None:
    """The type of the filesystem ``path`` is on (``ext4``, ``tmpfs``...), from /proc/mounts."""
    real = os.path.realpath(path)
    best, kind = "", None
    try:
        with open("/proc/mounts") as f:
            for line in f:
                parts = line.split()
                if len(parts) < 3:
                    continue
                mount = parts[1].replace("\\040", " ")
                inside = real == mount or real.startswith(mount.rstrip("/") + "/")
                if inside and len(mount) >= len(best):
                    best, kind = mount, parts[2]
    except OSError:
        return None
    return kind
