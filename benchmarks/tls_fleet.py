"""Thousands of idle MQTT connections over TLS, for scenario 6 with ``--tls``.

:class:`CFleet` runs the C TLS opener (benchmarks/c/open_many_tls.c, built by the runner): it
makes the sockets, does the handshakes (the certificate verified against the run's CA, one TLS
version, sessions resumed or not), sends each request (encoded here, benchmarks/wire.py), reads
each CONNACK, and holds the connections, which live in its process, until :meth:`close`.
:class:`AsyncioFleet` is what runs without a C compiler: the generator's asyncio clients
(client.open_client over ``client.TLS_CONTEXT``), which resume no session.

Either is used the same way: ``fleet = ...(...)`` (with resumption, the C opener's priming round
runs here), ``opened = fleet.storm()`` (the timed part: from the first connect to the last
CONNACK), then ``dropped = fleet.close()`` (how many the broker had closed meanwhile; the C
opener's ``fleet.publishes`` is then how many PUBLISH packets they had been sent).
"""

from __future__ import annotations

import asyncio
import json
import os
import select
import socket
import struct
import subprocess
import time
from collections.abc import Sequence
from typing import Any, NamedTuple

from . import client, procfs

RESUMPTION = ("off", "slot", "shared")


class Stormed(NamedTuple):
    """What setting the connections up took: the opener's clock and CPU from the first connect
    to the last CONNACK, and how many of the handshakes the broker resumed (None: not known)."""

    connections: int
    elapsed_s: float
    cpu_s: float
    resumed: int | None


class CFleet:
    """The C TLS opener's process, holding its connections until :meth:`close`."""

    def __init__(
        self,
        program: str,
        host: str,
        port: int,
        requests: Sequence[tuple[bytes, bool]],
        ca: str,
        tls_version: str,
        resumption: str = "off",
        concurrency: int = 100,
        timeout: float = 120.0,
        version: int = 5,
        split: bool = False,
    ) -> None:
        if resumption not in RESUMPTION:
            raise ValueError(f"resumption is one of {RESUMPTION}, not {resumption!r}")
        self.count = len(requests)
        self.timeout = timeout
        # (the program takes an IPv4 address: a name is resolved here)
        address = socket.getaddrinfo(host, port, socket.AF_INET, socket.SOCK_STREAM)[0][4][0]
        cmd = [program, str(address), str(port), str(version), str(concurrency), str(timeout)]
        cmd += [ca, tls_version, resumption] + (["split"] if split else [])
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self._buf = b""
        records = [struct.pack("=I", len(requests))]
        for request, subscribing in requests:
            records.append(struct.pack("=BI", subscribing, len(request)))
            records.append(request)
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write(b"".join(records))
            self.proc.stdin.flush()
            ready = self._line(timeout * 2 if resumption == "slot" else timeout)
        except BaseException:
            self.kill()
            raise
        self.sessions: int = ready["sessions"]  # slots with a session to offer
        self.primed_s: float = ready["primed_s"]
        self.receive_max: list[int] = []
        self.publishes = 0  # (known once closed)

    def _line(self, timeout: float) -> dict[str, Any]:
        """The program's next JSON line; ConnectionError with its error, or when it ends."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout + 30
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise ConnectionError(f"the TLS opener said nothing for {timeout + 30:.0f} s")
            chunk = os.read(fd, 65536)
            if not chunk:
                code = self.proc.wait()
                raise ConnectionError(f"the TLS opener ended with exit status {code}")
            self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        try:
            result: dict[str, Any] = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ConnectionError(f"the TLS opener printed {line[:200]!r}") from exc
        if "error" in result:
            self.proc.wait()
            raise ConnectionError(result["error"])
        return result

    def _tell(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(b"g")
        self.proc.stdin.flush()

    def storm(self) -> Stormed:
        """Set every connection up (the timed part); they stay open, idle."""
        try:
            self._tell()
            result = self._line(self.timeout)
        except BaseException:
            self.kill()
            raise
        self.receive_max = result["receive_max"]
        return Stormed(self.count, result["elapsed_s"], result["cpu_s"], result["resumed"])

    def close(self) -> int:
        """DISCONNECT and close every connection: how many the broker had closed before (0
        once closed). :attr:`publishes` is then how many PUBLISH packets the broker had sent
        them since their CONNACKs (read without waiting, first)."""
        if self.proc.returncode is not None:
            return 0
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            result = self._line(60)
            self.publishes = int(result["publishes"])
            return int(result["dropped"])
        finally:
            self.kill()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None and not pipe.closed:
                pipe.close()


class AsyncioFleet:
    """Without a C compiler: the generator's asyncio clients over ``client.TLS_CONTEXT``,
    ``concurrency`` being set up at once; no session resumption."""

    def __init__(
        self, host: str, port: int, client_ids: Sequence[str], version: int, concurrency: int
    ) -> None:
        if client.TLS_CONTEXT is None:
            raise ValueError("AsyncioFleet speaks TLS: set client.TLS_CONTEXT")
        self.host, self.port, self.version = host, port, version
        self.client_ids = list(client_ids)
        self.concurrency = concurrency
        self.count = len(self.client_ids)
        self.sessions = 0
        self.primed_s = 0.0
        self.clients: list[client.Client] = []

    async def storm(self) -> Stormed:
        gate = asyncio.Semaphore(self.concurrency)

        async def one(client_id: str) -> client.Client:
            async with gate:
                return await client.open_client(self.host, self.port, client_id, self.version)

        t0, c0 = time.perf_counter(), procfs.own_cpu_seconds()
        results = await asyncio.gather(*(one(i) for i in self.client_ids), return_exceptions=True)
        elapsed, cpu = time.perf_counter() - t0, procfs.own_cpu_seconds() - c0
        self.clients = [r for r in results if isinstance(r, client.Client)]
        failed = [r for r in results if isinstance(r, BaseException)]
        if failed:
            await self.close()
            raise ConnectionError(f"{len(failed)} TLS connection(s) failed: {failed[0]!r}")
        return Stormed(self.count, elapsed, cpu, None)

    async def close(self) -> int:
        dropped = sum(1 for c in self.clients if c.lost.done())
        await client.close_clients(self.clients)
        self.clients = []
        return dropped
