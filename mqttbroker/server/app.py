"""Lifecycle: start the listeners, drive the broker's clock, stop cleanly on SIGINT/SIGTERM."""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from .. import compiled
from ..broker.core import Broker
from ..broker.store import Store
from ..config import Config
from ..ops.admin import AdminServer
from ..ops.alerts import Survey
from ..ops.sys_tree import SysTree
from ..protocol.reasons import ReasonCode
from ..security import build_security, listener_anonymous
from ..storage import StoreError
from .listeners import Listener, start_listener
from .polling import BusyPoll

log = logging.getLogger("mqttbroker")

TICK_SECONDS = 0.5


class Server:
    def __init__(self, config: Config) -> None:
        self.config = config
        self.security = build_security(config)  # SecurityFileError (a ConfigError) if bad
        for listener in config.listeners:
            # Each listener's rule for clients without a user name, settled once.
            listener.allow_anonymous = listener_anonymous(listener, config.security.allow_anonymous)
        self.store = self._make_store(config)
        self.broker = Broker(
            config.broker,
            store=self.store,
            authenticator=self.security.authenticator,
            authorizer=self.security.authorizer,
        )
        self.sys_tree = SysTree(self.broker, config.broker.sys_interval)
        self.survey = Survey(self.broker, config.alerts.oldest_queued_age, config.listeners)
        self.admin: AdminServer | None = None
        if config.admin.port:  # a token file or variable that gives nothing: ConfigError
            self.admin = AdminServer(
                config.admin, self.broker, self.survey, self.security.authenticator, self.ready
            )
        self.stopping = False
        self.listeners: list[Listener] = []
        self._ticker: asyncio.Task[None] | None = None
        self._executor: ThreadPoolExecutor | None = None
        self.addresses: list[tuple[str, int]] = []
        self.busy_poll: BusyPoll | None = None

    @staticmethod
    def _make_store(config: Config) -> Store:
        if config.storage.backend == "memory":
            return Store()
        from ..storage.sqlite import SQLiteStore

        storage = config.storage
        return SQLiteStore(
            config.store_path, storage.sync, storage.on_corrupt, storage.commit_interval
        )

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        if compiled.mode == "compiled":
            log.info("hot path: compiled (mypyc)")
        else:  # a stale build is worth a warning: the speed a user expects is not there
            (log.warning if compiled.stale else log.info)(
                "hot path: pure Python (%s)", compiled.reason
            )
        broker = self.broker
        await self.store.load(broker)
        broker.tick()  # expire what expired while the broker was down

        window = self.config.busy_poll_us
        if window:
            self.busy_poll = BusyPoll(loop, broker.flush, window / 1_000_000)
            broker.wake = self.busy_poll.wake
            log.info("busy polling for %d microseconds after each pass that sends", window)
        else:

            def wake() -> None:
                loop.call_soon(broker.flush)

            broker.wake = wake
        if self.security.authenticator is not None and self.config.security.password_file:
            broker.offload = self._offloader(loop)
        for index, config in enumerate(self.config.listeners):
            listener = await start_listener(broker, config, f"listener[{index}]")
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

    def ready(self) -> str | None:
        """/readyz: why the broker cannot serve now (None: it can)."""
        if self.stopping:
            return "shutting down"
        if len(self.listeners) < len(self.config.listeners):
            return "not every listener is bound yet"
        if getattr(self.store, "failing", False):
            return "the store cannot commit (see the log)"
        return None

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(TICK_SECONDS)
            self.broker.tick()
            self.sys_tree.tick()
            self.survey.tick()
            if self.admin is not None:
                self.admin.tick()

    def _offloader(
        self, loop: asyncio.AbstractEventLoop
    ) -> Callable[[Callable[[], int], Callable[[int], None]], None]:
        """Password checks (PBKDF2: milliseconds each) run on worker threads, which hashlib
        lets run beside the event loop; the answer comes back on the loop."""
        executor = self._executor = ThreadPoolExecutor(
            max_workers=2, thread_name_prefix="password-check"
        )

        def offload(work: Callable[[], int], done: Callable[[int], None]) -> None:
            def finished(future: asyncio.Future[int]) -> None:
                try:
                    result = future.result()
                except Exception:
                    log.exception("password check failed")
                    result = ReasonCode.UNSPECIFIED_ERROR
                done(result)

            loop.run_in_executor(executor, work).add_done_callback(finished)

        return offload

    async def stop(self) -> None:
        log.info("shutting down: disconnecting %d clients", len(self.broker.connections))
        self.stopping = True
        if self.busy_poll is not None:
            self.busy_poll.stop()  # the DISCONNECTs below must not start it again
        for listener in self.listeners:
            listener.close()
        if self._ticker is not None:
            self._ticker.cancel()
        self.broker.shutdown()
        await self.store.close()
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
        await asyncio.sleep(0.05)  # let the transports write their DISCONNECTs
        for listener in self.listeners:
            await listener.wait_closed()
        if self.admin is not None:
            await self.admin.stop()
        log.info("stopped")

    def reload_security(self) -> None:
        """SIGHUP: read the password and ACL files again; connections stay up, and a file that
        does not load is reported and its previous contents kept."""
        log.info("SIGHUP: reloading the password and ACL files")
        self.security.reload()
        self.broker.recheck_subscriptions()

    async def run_until_signalled(self) -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):  # before "listening" is logged
            loop.add_signal_handler(signum, stop.set)
        if hasattr(signal, "SIGHUP"):  # not on Windows
            loop.add_signal_handler(signal.SIGHUP, self.reload_security)
        await self.start()
        await stop.wait()
        await self.stop()


def run(config: Config) -> None:
    """Run the broker until SIGINT/SIGTERM, on uvloop when it is installed."""
    try:
        _run(config)
    except StoreError as exc:
        log.error("cannot start: %s", exc)
        raise SystemExit(1) from None


def _tune_gc(threshold: int) -> None:
    """Run the cycle collector less often (``gc_threshold``), and keep what exists when the
    broker starts (modules, configuration) out of its full collections for good."""
    if threshold:
        gc.set_threshold(threshold, 10, 10)
    gc.collect()
    gc.freeze()


def _run(config: Config) -> None:
    _tune_gc(config.gc_threshold)
    try:
        import uvloop
    except ImportError:
        asyncio.run(Server(config).run_until_signalled())
    else:
        log.debug("using uvloop")
        uvloop.run(Server(config).run_until_signalled())
