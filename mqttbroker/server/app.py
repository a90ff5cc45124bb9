"""Lifecycle: lock the data directory, load the store, start the listeners, drive the broker's
clock, stop cleanly on SIGINT/SIGTERM.

A start that fails (a StoreError or a StartError) or is interrupted by SIGINT/SIGTERM releases
what it had opened (listeners, the store and its thread, the lock) before the process exits, so
it never lingers. Exit statuses: 0 stopped by a signal (while starting, too), 2 could not start
(configuration or start error: one log line names the cause), 1 an unexpected error.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
import sys
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import TYPE_CHECKING, Any

from .. import compiled
from ..broker.auth import LoginRequest
from ..broker.connection import Connection
from ..broker.core import Broker
from ..broker.state import CLOSED
from ..broker.store import Store
from ..config import Config
from ..integrations import Integrations
from ..ops.admin import AdminServer
from ..ops.alerts import Survey
from ..ops.sys_tree import SysTree
from ..protocol import packets as pk
from ..protocol.reasons import ReasonCode
from ..security import build_security, listener_policy
from ..security.chain import Login
from ..security.dynsec import DynsecService
from ..storage import StoreError
from ..storage.lock import DataDirLock
from . import StartError, streams
from .listeners import Listener, start_listener
from .memory import Trimmer
from .polling import BusyPoll

if TYPE_CHECKING:
    from ..cluster.node import ClusterNode

log = logging.getLogger("mqttbroker")

TICK_SECONDS = 0.5


class Server:
    def __init__(self, config: Config) -> None:
        self.config = config
        self.security = build_security(config)  # SecurityFileError (a ConfigError) if bad
        self.store = self._make_store(config)
        cluster_store = None
        if config.cluster.redis:  # only then is Redis loaded
            from ..cluster.store import ClusterStore

            self.store = cluster_store = ClusterStore(self.store)
        self.broker = Broker(
            config.broker,
            store=self.store,
            authenticator=self.security.broker_authenticator,
            authorizer=self.security.broker_authorizer,
        )
        self.cluster: ClusterNode | None = None
        if cluster_store is not None:
            from ..cluster.node import ClusterNode

            durable = config.storage.backend != "memory"
            self.cluster = ClusterNode(
                config.cluster,
                self.broker,
                cluster_store,
                config.store_path.parent if durable else None,
            )
        self.sys_tree = SysTree(self.broker, config.broker.sys_interval)
        self.survey = Survey(self.broker, config.alerts.oldest_queued_age, config.listeners)
        self.admin: AdminServer | None = None
        if config.admin.port:  # a token file or variable that gives nothing: ConfigError
            self.admin = AdminServer(
                config.admin,
                self.broker,
                self.survey,
                self.security.authenticator,
                self.ready,
                self.gather_holds,
            )
        self.stopping = False
        self.listeners: list[Listener] = []
        self._ticker: asyncio.Task[None] | None = None
        self.trimmer = Trimmer()  # the allocator's free memory back after a burst
        self._executor: ThreadPoolExecutor | None = None
        self.addresses: list[tuple[str, int]] = []
        self.busy_poll: BusyPoll | None = None
        self._lock: DataDirLock | None = None
        self._serving = False
        self.integrations: Integrations | None = None  # bridges and webhooks, once loaded
        self.dynsec: DynsecService | None = None  # the dynamic security's commands, if enabled
        self._tasks: set[asyncio.Task[None]] = set()  # logins and rights asked, under way
        # JWT clients by client id: the connection each token logged in (disconnected when it
        # expires, if still that connection)
        self._token_conns: dict[str, Connection] = {}
        self._rights_expire_at = 0.0  # when the HTTP rights connections cached go stale
        if self.admin is not None and self.security.http is not None:
            from ..ops.metrics import HttpAuthCollector

            self.admin.metrics.registry.register(HttpAuthCollector(self.security.http))

    @staticmethod
    def _make_store(config: Config) -> Store:
        if config.storage.backend == "memory":
            return Store()
        from ..storage.sqlite import SQLiteStore

        storage = config.storage
        return SQLiteStore(
            config.store_path,
            storage.sync,
            storage.on_corrupt,
            storage.commit_interval,
            storage.defer_wait,
        )

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        missing = streams.missing()
        if missing is not None:  # built with the compiled modules, yet not there: say so, loudly
            log.warning(
                "hot path: compiled (mypyc); but not the broker's own TCP transport (%s): plain "
                "TCP on the event loop's transport, slower and bigger per connection; reinstall "
                "to build it",
                missing,
            )
        elif compiled.mode == "compiled":
            log.info(
                "hot path: compiled (mypyc)%s",
                "; plain TCP on the broker's own transport (epoll)" if streams.available() else "",
            )
        elif compiled.degraded:  # the speed a user expects is not there: say why, loudly
            log.warning(
                "hot path: pure Python, several times slower than the compiled form (%s)",
                compiled.reason,
            )
        else:
            log.info("hot path: pure Python (%s)", compiled.reason)
        broker = self.broker
        if self.config.storage.backend != "memory":
            lock = DataDirLock(self.config.data_dir)
            lock.acquire()  # before the store: a second broker never touches the database
            self._lock = lock
        if self.cluster is not None:
            await self.cluster.connect()  # before the sessions come back: their routes
        broker.restore(await self.store.load(broker.clock))
        self.integrations = Integrations(broker, self.config)  # they claim their sessions
        self.sys_tree.sources.append(self.integrations.sys_figures)
        broker.restored()  # caps counted, rules applied to what the store put back
        if self.security.dynsec is not None:
            self.dynsec = DynsecService(
                broker,
                self.security.dynsec,
                self.security.dynsec_path or None,
                loop.create_task,
                partial(loop.run_in_executor, None),
            )
            if self.admin is not None:
                self.admin.dynsec.service = self.dynsec  # the admin API's dynsec operations
        broker.tick()  # expire what expired while the broker was down
        if self.cluster is not None:
            await self.cluster.start()

        window = self.config.busy_poll_us
        if window:
            self.busy_poll = BusyPoll(loop, broker.scheduler.flush, window / 1_000_000)
            broker.scheduler.wake = self.busy_poll.wake
            log.info("busy polling for %d microseconds after each pass that sends", window)
        else:
            scheduler = broker.scheduler
            scheduler.wake = partial(loop.call_soon, scheduler.flush)  # a C call, once per pass
            scheduler.hook_passes = True  # the own transport's passes flush at their end
        if self.config.gather_us and streams.available():
            log.info(
                "gathering input for up to %d microseconds after each busy pass (plain TCP)",
                self.config.gather_us,
            )
        if self.security.http is not None:
            await self.security.http.start()
        if self.security.chain_authorizer is not None:
            self.security.chain_authorizer.spawn = self._spawn
        if self.security.chain is not None:
            broker.offload = self._offloader(loop)
        for index, config in enumerate(self.config.listeners):
            policy = listener_policy(config, self.config.security.allow_anonymous)
            listener = await start_listener(
                broker,
                config,
                f"listener[{index}]",
                policy,
                self.config.workers > 1,
                self.config.gather_us / 1_000_000,
            )
            self.listeners.append(listener)
            self.addresses.extend(listener.addresses)
        if self.admin is not None:
            await self.admin.start(
                [
                    (port, listener.config)
                    for listener in self.listeners
                    if listener.config.protocol == "ws"
                    for _, port in listener.addresses
                ]
            )
        self._ticker = asyncio.create_task(self._tick())
        self.integrations.start()
        self._serving = True

    def gather_holds(self) -> int:
        """The plain TCP listeners' sleeps for ``gather_us`` so far (/metrics)."""
        return sum(
            listener.server.poller.holds
            for listener in self.listeners
            if isinstance(listener.server, streams.StreamServer)
        )

    def ready(self) -> str | None:
        """/readyz: why the broker cannot serve now (None: it can)."""
        if self.stopping:
            return "shutting down"
        if len(self.listeners) < len(self.config.listeners):
            return "not every listener is bound yet"
        if getattr(self.store, "failing", False):
            return "the store cannot commit (see the log)"
        if self.cluster is not None:
            return self.cluster.unready()
        return None

    async def _tick(self) -> None:
        """Keep-alive, expiry, delayed wills, the allocator's free memory given back after a
        burst of connections (memory.Trimmer), $SYS, the survey: an error in one pass is logged
        and the next pass runs all the same (none may stop the others for good)."""
        while True:
            await asyncio.sleep(TICK_SECONDS)
            try:
                if self.config.gc_threshold:
                    # Age what is young: the collector walks a young container whole each time
                    # it runs, and one can grow large while young, since most of what the
                    # broker keeps per message is not tracked and hardly advances the count
                    # that starts a collection (a long offline queue, walked whole by the
                    # first collection that sees it). Walked now, it is small; then old.
                    gc.collect(1)
                self.broker.tick()
                self.trimmer.tick(self.broker.stats.connects, len(self.broker.connections))
                self._security_tick()
                self.sys_tree.tick()
                self.survey.tick()
                if self.admin is not None:
                    self.admin.tick()
            except Exception:
                log.exception("error in the broker's periodic pass")

    def _spawn(self, coroutine: Any) -> None:
        """Run ``coroutine`` on the loop, keeping a reference until it is done."""
        task = asyncio.get_running_loop().create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _offloader(
        self, loop: asyncio.AbstractEventLoop
    ) -> Callable[[Connection, pk.Connect, bool | None], None]:
        """Logins go through the chain of sources (security/chain.py) in a task of their own:
        password checks (PBKDF2: milliseconds each) on worker threads, which hashlib lets run
        beside the event loop, JWT on the loop, the HTTP service with aiohttp on the loop. The
        answer comes back to the connection on the loop (conn.password_checked)."""
        executor = self._executor = ThreadPoolExecutor(
            max_workers=2, thread_name_prefix="password-check"
        )
        run_blocking = partial(loop.run_in_executor, executor)

        def offload(conn: Connection, packet: pk.Connect, anonymous: bool | None) -> None:
            self._spawn(self._login(run_blocking, conn, packet, anonymous))

        return offload

    async def _login(
        self,
        run_blocking: Callable[[Callable[[], Any]], Any],
        conn: Connection,
        packet: pk.Connect,
        anonymous: bool | None,
    ) -> None:
        security = self.security
        assert security.chain is not None
        client_id = packet.client_id
        try:
            login = await security.chain.login(
                run_blocking,
                LoginRequest(client_id, packet.username, packet.password, anonymous, conn.address),
            )
            rights = security.chain_authorizer
            if not login.code and rights is not None:
                rights.addresses[client_id] = conn.address
                http = security.http
                if packet.will is not None and http is not None and http.settings.acl_url:
                    # asked now, cached: the will is checked when the client is gone
                    await http.authorize(
                        client_id, login.username, conn.address, packet.will.topic, "publish"
                    )
        except Exception:
            log.exception("client %s: login check failed", client_id)
            login = Login(ReasonCode.UNSPECIFIED_ERROR, None)
        tokens = security.tokens
        if tokens is not None and not login.code and conn.state != CLOSED:
            # before the CONNECT goes on: the input held behind it may publish at once
            if login.token is not None:
                tokens.accepted(client_id, login.token)
                self._token_conns[client_id] = conn
            else:  # another source logged this client id in: an earlier token's rights go
                tokens.forget(client_id)
                self._token_conns.pop(client_id, None)
        conn.password_checked(login.code, login.username)

    def _security_tick(self) -> None:
        """Close the connections whose token expired (MQTT 5: DISCONNECT 0x87 "token
        expired"; 3.1.1: closed), and let the HTTP service's answers age."""
        security = self.security
        tokens = security.tokens
        if tokens is not None:
            for client_id in tokens.expired():
                conn = self._token_conns.pop(client_id, None)
                if conn is None or conn.state == CLOSED or conn.client_id != client_id:
                    continue  # gone, or taken over by a login of its own
                log.info("client %s: its token expired; disconnecting", client_id)
                conn.disconnect(ReasonCode.NOT_AUTHORIZED, "token expired")
        rights = security.chain_authorizer
        if rights is not None:
            rights.tick()
            http = security.http
            if http is not None and http.settings.acl_url:
                now = self.broker.clock()
                if now >= self._rights_expire_at:
                    self._rights_expire_at = now + max(http.settings.cache_ttl, TICK_SECONDS)
                    rights.expire()

    async def stop(self) -> None:
        """Stop what ``start`` started, also when it failed or was interrupted part way."""
        if self._serving:
            log.info("shutting down: disconnecting %d clients", len(self.broker.connections))
        self.stopping = True
        if self.busy_poll is not None:
            self.busy_poll.stop()  # the DISCONNECTs below must not start it again
        for listener in self.listeners:
            listener.close()
        if self._ticker is not None:
            self._ticker.cancel()
        if self.dynsec is not None:
            self.dynsec.close()
        self.broker.shutdown()
        if self.integrations is not None:
            await self.integrations.stop()
        if self.security.http is not None:
            await self.security.http.close()
        if self.cluster is not None:
            await self.cluster.stop()
        await self.store.close()
        if self._lock is not None:
            self._lock.release()
            self._lock = None
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
        if self._serving:
            await asyncio.sleep(0.05)  # let the transports write their DISCONNECTs
        for listener in self.listeners:
            await listener.wait_closed()
        if self.admin is not None:
            await self.admin.stop()
        self._serving = False

    def reload_security(self) -> None:
        """SIGHUP: read the password and ACL files and the JWT keys again; connections stay
        up, and a file that does not load is reported and its previous contents kept."""
        log.info("SIGHUP: reloading the password and ACL files and the JWT keys")
        self.security.reload()
        self.broker.recheck_subscriptions()

    async def run_until_signalled(self, stop_requested: Sequence[int] = ()) -> None:
        """Start, serve until SIGINT/SIGTERM, stop. A signal while starting (or before the loop
        ran: the signals recorded in ``stop_requested``) interrupts the start; a start error
        propagates once what was opened is released."""
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):  # before "listening" is logged
            loop.add_signal_handler(signum, stop.set)
        if stop_requested:  # read once our handlers are in place: no signal falls between
            stop.set()
        if hasattr(signal, "SIGHUP"):  # not on Windows
            loop.add_signal_handler(signal.SIGHUP, self.reload_security)
        starting = asyncio.create_task(self.start())
        stopping = asyncio.create_task(stop.wait())
        try:
            await asyncio.wait((starting, stopping), return_when=asyncio.FIRST_COMPLETED)
            if not starting.done():
                log.info("stop requested while starting")
                starting.cancel()
            try:
                await starting
            except asyncio.CancelledError:
                if not stop.is_set():
                    raise  # we were cancelled ourselves
            else:
                # What starting built (the event loop's machinery, the listeners, what the
                # store restored) is kept out of the cycle collector's walks too, as what was
                # there before (_tune_gc): left young, the first collection under load walked
                # it all, besides what had grown meanwhile (see _tick).
                gc.freeze()
                await stopping
        finally:
            stopping.cancel()
            await self.stop()
        log.info("stopped")


def run(config: Config, stop_requested: Sequence[int] = ()) -> int:
    """Run the broker until SIGINT/SIGTERM, on uvloop when it is installed; the exit status (0,
    or 2 when it cannot start: the reason is logged)."""
    try:
        _run(config, stop_requested)
    except (StoreError, StartError) as exc:
        log.error("cannot start: %s", exc)
        return 2
    return 0


def _tune_gc(threshold: int) -> None:
    """Pace the cycle collector (``gc_threshold``): the youngest generation every ``threshold``
    net allocations, the middle one every fifth of those (it walks what survived them, a bounded
    number of objects, so that a growing queue of stored messages never stops the broker for
    long), a full collection at most every thousandth. And keep what
    exists when the broker starts (modules, configuration) out of its collections for good
    (what starting builds joins it: Server.run_until_signalled)."""
    if threshold:
        if sys.version_info < (3, 14):
            gc.set_threshold(threshold, 5, 200)
        else:  # an incremental collector may give the other two values other meanings
            gc.set_threshold(threshold)
    gc.collect()
    gc.freeze()


def _size_fd_table(count: int) -> int:
    """Size the process's file descriptor table for ``count`` descriptors (``fd_table``), at
    most the open-file limit, before the broker starts a thread: Linux then grows it at once,
    rather than doubling it as connections arrive, each doubling in a process with threads
    waiting for an RCU grace period with the broker stopped. Returns the size asked for (0:
    nothing done, on other systems or with 0)."""
    if count <= 0 or not sys.platform.startswith("linux"):
        return 0
    import resource

    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft != resource.RLIM_INFINITY:
        count = min(count, soft)
    fd = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    try:
        if count - 1 > fd:  # the table then holds descriptor count - 1, and keeps that size
            os.close(os.dup2(fd, count - 1, inheritable=False))
    except OSError as exc:
        log.warning("fd_table: cannot size the descriptor table for %d: %s", count, exc)
        return 0
    finally:
        os.close(fd)
    log.debug("descriptor table sized for %d descriptors", count)
    return count


def _run(config: Config, stop_requested: Sequence[int]) -> None:
    _tune_gc(config.gc_threshold)
    _size_fd_table(config.fd_table)
    server = Server(config)
    try:
        import uvloop
    except ImportError:
        asyncio.run(server.run_until_signalled(stop_requested))
    else:
        log.debug("using uvloop")
        uvloop.run(server.run_until_signalled(stop_requested))
