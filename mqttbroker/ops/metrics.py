"""``/metrics``: the broker's figures in the Prometheus text format, through prometheus-client.

A custom Collector reads, when scraped, the counters the broker keeps anyway (a
:class:`~mqttbroker.broker.stats.Snapshot` of them, the store's commit histogram...) and the
figures of the last
:class:`~mqttbroker.ops.alerts.Survey` (at most one walk over the sessions a second, however
often it is scraped). Nothing is counted per message for it: no locks, no label lookups. The
registry also has prometheus-client's process and platform collectors (CPU, memory, open files).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, PlatformCollector, ProcessCollector
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import Collector

from ..broker.core import Broker
from ..broker.stats import REFUSAL_REASONS
from .alerts import Survey

__all__ = ["CONTENT_TYPE_LATEST", "REFUSAL_REASONS", "BrokerCollector", "Metrics"]


class BrokerCollector(Collector):
    def __init__(
        self, broker: Broker, survey: Survey, listeners: list[str], holds: Callable[[], int]
    ) -> None:
        self.broker = broker
        self.survey = survey
        self.listeners = listeners  # every listener's name, so idle ones show 0
        self.holds = holds  # the TCP pollers' sleeps for gather_us, in all

    def collect(self) -> Iterator[Metric]:
        broker = self.broker
        figures = self.survey.current()
        snap = broker.stats.snapshot(broker.connections, figures.census.dropped)
        router = broker.router

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            return CounterMetricFamily(f"mqttbroker_{name}", doc, value=value)

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            return GaugeMetricFamily(f"mqttbroker_{name}", doc, value=value)

        received = CounterMetricFamily(
            "mqttbroker_messages_received",
            "PUBLISH packets accepted from clients, by QoS",
            labels=["qos"],
        )
        for qos, count in enumerate(snap.received_by_qos):
            received.add_metric([str(qos)], count)
        yield received
        yield counter(
            "messages_delivered",
            "PUBLISH packets sent to subscribers (resends included)",
            snap.delivered,
        )
        dropped = CounterMetricFamily(
            "mqttbroker_messages_dropped", "Messages not delivered, by reason", labels=["reason"]
        )
        # "queue": a session's queue was full, or a QoS 0 message found its client not reading.
        dropped.add_metric(["queue"], snap.queue_dropped)
        dropped.add_metric(["not_authorized"], snap.denied)
        yield dropped
        refused = CounterMetricFamily(
            "mqttbroker_connections_refused",
            "Connections refused: by the connection limits, or their CONNECT, by reason",
            labels=["reason"],
        )
        for reason, count in snap.refusals_by_reason().items():
            refused.add_metric([reason], count)
        yield refused
        yield counter("connects", "CONNECT packets received", snap.connects)
        yield counter("bytes_received", "MQTT bytes read from clients", snap.bytes_received)
        yield counter("bytes_sent", "MQTT bytes written to clients", snap.bytes_sent)
        connections = GaugeMetricFamily(
            "mqttbroker_connections", "Connected clients, by listener", labels=["listener"]
        )
        for name in self.listeners:
            connections.add_metric([name], figures.census.connections.get(name, 0))
        yield connections
        sessions = GaugeMetricFamily("mqttbroker_sessions", "Sessions, by state", labels=["state"])
        sessions.add_metric(["online"], figures.census.sessions_online)
        sessions.add_metric(["offline"], figures.census.sessions_offline)
        yield sessions
        yield gauge("subscriptions", "Subscriptions (shared members included)", router.trie.count)
        yield gauge("retained_messages", "Retained messages ($SYS aside)", len(router.retained))
        yield gauge("queued_messages", "Messages waiting in session queues", figures.queued)
        yield gauge(
            "inflight_messages",
            "QoS 1/2 messages sent and not yet acknowledged",
            figures.census.inflight,
        )
        yield gauge(
            "oldest_queued_message_age_seconds",
            "Age of the oldest message waiting in any session's queue",
            figures.oldest_age,
        )
        yield gauge("stuck_sessions", "Sessions past alerts.oldest_queued_age", len(figures.stuck))
        yield counter("stuck_session_alerts", "Sessions that became stuck", self.survey.alerts)
        yield counter(
            "gather_holds",
            "Loop passes held back after a busy pass, to read more at once (gather_us)",
            self.holds(),
        )
        times = getattr(broker.store, "commit_times", None)
        if times is not None:
            buckets: list[tuple[str, float]] = []
            cumulative = 0
            for bound, count in zip((*times.BOUNDS, float("inf")), times.counts, strict=True):
                cumulative += count
                buckets.append(("+Inf" if bound == float("inf") else repr(bound), cumulative))
            yield HistogramMetricFamily(
                "mqttbroker_store_commit_seconds",
                "Duration of the durable store's commits",
                buckets=buckets,
                sum_value=times.total,
            )


class Metrics:
    """The registry ``/metrics`` serves."""

    def __init__(
        self, broker: Broker, survey: Survey, listeners: list[str], holds: Callable[[], int]
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(BrokerCollector(broker, survey, listeners, holds))
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class HttpAuthCollector(Collector):
    """The HTTP auth backend's counters (``HttpBackend.counts``, kept by the backend anyway):
    calls made, answers from the cache, allow/deny/ignore answers, and calls that found the
    service down (their reason is in the log)."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend

    def collect(self) -> Iterator[Metric]:
        counts = self.backend.counts
        yield CounterMetricFamily(
            "mqttbroker_http_auth_calls", "Calls to the HTTP auth service", value=counts["calls"]
        )
        yield CounterMetricFamily(
            "mqttbroker_http_auth_cache_hits",
            "HTTP auth answers taken from the cache",
            value=counts["cache_hits"],
        )
        answers = CounterMetricFamily(
            "mqttbroker_http_auth_answers", "The HTTP auth service's answers", labels=["result"]
        )
        for result in ("allow", "deny", "ignore"):
            answers.add_metric([result], counts[result])
        yield answers
        yield CounterMetricFamily(
            "mqttbroker_http_auth_down",
            "HTTP auth calls that found the service down (time-out, refused, 5xx, bad body)",
            value=counts["down"],
        )
