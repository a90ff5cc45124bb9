"""What one connection may publish: the authorizer's answers cached per topic (for the rules'
generation, within a bound), the publish-rate bucket (max_publish_rate, max_publish_burst), and
the count of refusals, which the log thins out. Made on first use: most connections never
need one."""

from __future__ import annotations

from typing import TYPE_CHECKING, final

if TYPE_CHECKING:
    from .auth import Authorizer

# The cache of publish rights: at most this many topics, of this many characters in all.
ALLOWED_CACHE_TOPICS = 1024
ALLOWED_CACHE_CHARS = 65_536


@final
class Rights:
    __slots__ = ("allowed", "generation", "size", "denials", "tokens", "tokens_at")

    def __init__(self, burst: int, now: float) -> None:
        self.allowed: dict[str, bool] | None = None  # topic -> may publish, for generation
        self.generation = -1  # the authorizer's rules ``allowed`` holds answers of
        self.size = 0  # characters of the topics in ``allowed``
        self.denials = 0  # PUBLISHes and subscriptions the authorizer refused
        self.tokens = float(burst)  # the publish-rate bucket, full at first
        self.tokens_at = now

    def may_publish(
        self, authorizer: Authorizer, client_id: str, username: str | None, topic: str
    ) -> bool:
        """Whether ``authorizer`` lets the client publish to ``topic``; answers are cached,
        up to ALLOWED_CACHE_TOPICS topics of ALLOWED_CACHE_CHARS characters in all."""
        cache = self.allowed
        if self.generation != authorizer.generation:
            cache = self.allowed = None
            self.size = 0
            self.generation = authorizer.generation
        allowed = None if cache is None else cache.get(topic)
        if allowed is None:
            # An authorizer that asks a service (http_auth) may make this packet wait
            # (Pending): asked through its ask_publish. Not per message: per uncached topic.
            ask = getattr(authorizer, "ask_publish", None)
            if ask is None:
                allowed = authorizer.can_publish(client_id, username, topic)
            else:
                allowed = ask(client_id, username, topic)
            size = self.size + len(topic)
            if cache is None:
                cache = self.allowed = {}
            if len(cache) < ALLOWED_CACHE_TOPICS and size <= ALLOWED_CACHE_CHARS:
                cache[topic] = allowed
                self.size = size
        return allowed

    def denied(self) -> int:
        """Count one refusal; the count so far."""
        self.denials += 1
        return self.denials

    def take_token(self, now: float, rate: float, burst: int) -> bool:
        """One message's token from the bucket refilled at ``rate`` per second up to
        ``burst``; False when it is empty (the message is refused)."""
        tokens = min(float(burst), self.tokens + (now - self.tokens_at) * rate)
        if tokens < 1.0:
            return False
        self.tokens = tokens - 1.0
        self.tokens_at = now
        return True
