"""The broker's limits and feature switches, with the defaults a fresh install runs with. The
TOML config's ``[broker]`` table maps onto these fields one to one (see config/sections.py)."""

from __future__ import annotations

from dataclasses import dataclass

from .topics import SHARE_STRATEGIES

# max_connections_per_address on listeners other machines reach, unless configured.
PER_ADDRESS_DEFAULT = 64


@dataclass(slots=True)
class BrokerOptions:
    # Largest packet accepted from a client, fixed header included (0x95 past it). Announced as
    # Maximum Packet Size in CONNACK.
    max_packet_size: int = 1_048_576
    # Largest CONNECT (and AUTH before CONNACK) accepted: refused with 0x95 from its fixed
    # header, so an unauthenticated client cannot make the broker hold or decode much.
    max_connect_size: int = 16_384
    # User Properties one packet may carry (0: no limit); past it the packet is refused (0x83)
    # and its properties not decoded further.
    max_user_properties: int = 64
    # Output waiting for one client (the socket's buffer included). Past the transport's
    # high-water mark (4 MiB) the broker stops reading from the client and sending to it; past
    # this bound (0: none) it closes the connection (MQTT 5: DISCONNECT 0x97 first).
    max_output_buffer: int = 16 * 1_048_576
    # Receive Maximum announced to clients: QoS 1/2 PUBLISHes a client may have unacknowledged.
    receive_maximum: int = 1024
    # Topic Alias Maximum announced to clients (0 disables inbound aliases).
    topic_alias_maximum: int = 64
    # Highest QoS accepted from publishers (Maximum QoS in CONNACK); subscriptions are granted at most this.
    maximum_qos: int = 2
    retain_available: bool = True
    wildcard_subscriptions: bool = True
    subscription_identifiers: bool = True
    shared_subscriptions: bool = True
    # How a shared subscription picks the member for each message: "round_robin", "random",
    # "sticky" (per publisher) or "hash" (per topic).
    shared_subscription_strategy: str = "round_robin"
    # Largest keep alive a client may ask for; 0 = no limit. A client asking for more (or for 0)
    # is told this value as Server Keep Alive.
    max_keepalive: int = 0
    # Seconds a new connection has to send its CONNECT.
    connect_timeout: float = 10.0
    # The info lines per client connected, disconnected or lost (broker/connection_log.py):
    # at most connection_log_rate a second (0: no limit), the rest of that second counted in one
    # line; connection_log_interval = N: none, one line every N seconds counting them instead.
    connection_log_rate: int = 100
    connection_log_interval: float = 0.0
    # Largest Session Expiry Interval granted (seconds); 3.1.1 persistent sessions get this too.
    max_session_expiry: int = 0xFFFFFFFF
    # Offline queue bounds per session; QoS 0 is queued for offline sessions only if enabled.
    max_queued_messages: int = 1000
    max_queued_bytes: int = 16 * 1_048_576
    queue_qos0: bool = False
    # Largest number of unacknowledged QoS 1/2 messages sent to one client (further capped by the
    # client's own Receive Maximum).
    max_inflight: int = 65535
    # Limits (0: none). Connections past max_connections (in all, or from one address) are
    # closed at once; a topic or filter past the length/levels limit is invalid (0x90/0x8F);
    # subscriptions past the per-client limit get 0x97; a client publishing faster than
    # max_publish_rate messages/s (bursts of max_publish_burst allowed) is disconnected with
    # 0x96; new retained topics past max_retained get 0x97 (QoS 0: dropped and counted).
    max_connections: int = 100_000
    # ...from one address. None (absent): 64 on listeners other machines reach, no limit on
    # local-only ones (loopback, no proxy); a number applies on every listener (0: no limit).
    max_connections_per_address: int | None = None
    max_topic_length: int = 4096
    max_topic_levels: int = 128
    max_subscriptions_per_client: int = 1000
    max_publish_rate: float = 0.0
    max_publish_burst: int = 1000
    max_retained: int = 1_000_000
    # Persistent sessions (Session Expiry Interval > 0, or 3.1.1 clean session 0): in all, and
    # per user name (anonymous sessions count only in all). A new one past either is refused
    # with CONNACK 0x97 (3.1.1: 0x03). Subscription bytes: the UTF-8 lengths of one session's
    # topic filters, summed; a new filter past it gets SUBACK 0x97 (3.1.1: 0x80). 0: no limit.
    max_sessions: int = 100_000
    max_sessions_per_user: int = 1000
    max_subscription_bytes: int = 1_048_576
    # A session belongs to the user that created it (its user name, a certificate's name, or
    # None for anonymous). A client of another user reusing its client id is refused
    # ("refuse": CONNACK 0x87, 3.1.1: 0x05) or gets a fresh session and the old one is
    # discarded ("new"). While the owner is connected the newcomer is refused either way,
    # unless allow_takeover_by_other_user (then: closed with 0x8E, session discarded).
    session_owner_mismatch: str = "refuse"
    allow_takeover_by_other_user: bool = False
    # Client ids bound to user names: "%u" is the user name, "*" any characters, e.g. "%u-*".
    # A client id that does not match is refused with 0x85 (3.1.1: 0x02); a client without a
    # user name must then leave its id to the broker. Ids the broker assigns are exempt.
    # Empty: no rule.
    client_id_pattern: str = ""
    # Seconds between publications of the $SYS/broker/... counters (0: none).
    sys_interval: float = 10.0
    # Packets plus deliveries one connection's input may cause before the broker flushes output
    # and serves other connections; the rest of that input waits for the next event-loop pass.
    input_budget: int = 10000
    # Match-cache entries (topic -> matching subscriptions) kept before the cache is cleared.
    match_cache_size: int = 65536
    # ...and bytes of topic names in it: long topics fill it by size, not only by count.
    match_cache_bytes: int = 64 * 1_048_576
    # Prefix of generated client identifiers.
    client_id_prefix: str = "auto-"
    # Response Information returned to MQTT 5 clients that ask for it (Request Response
    # Information 1); "%c" is replaced by the client id. Empty: none is returned.
    response_information: str = ""
    # Redirect every MQTT 5 client elsewhere: CONNACK 0x9C (use another server) or, with
    # server_moved, 0x9D (server moved), carrying this Server Reference. Empty: serve clients.
    server_reference: str = ""
    server_moved: bool = False

    def check(self) -> None:
        """Raise ValueError naming the field whose value is out of range."""
        if not 0 < self.max_packet_size <= 268_435_460:
            raise ValueError("max_packet_size must be between 1 and 268435460")
        if not 0 < self.receive_maximum <= 65535:
            raise ValueError("receive_maximum must be between 1 and 65535")
        if not 0 <= self.topic_alias_maximum <= 65535:
            raise ValueError("topic_alias_maximum must be between 0 and 65535")
        if self.maximum_qos not in (0, 1, 2):
            raise ValueError("maximum_qos must be 0, 1 or 2")
        if not 0 <= self.max_keepalive <= 65535:
            raise ValueError("max_keepalive must be between 0 and 65535")
        if self.connect_timeout <= 0:
            raise ValueError("connect_timeout must be positive")
        if not 0 <= self.max_session_expiry <= 0xFFFFFFFF:
            raise ValueError("max_session_expiry must be between 0 and 4294967295")
        if self.max_queued_messages < 0 or self.max_queued_bytes < 0:
            raise ValueError("max_queued_messages and max_queued_bytes must not be negative")
        if not 0 < self.max_inflight <= 65535:
            raise ValueError("max_inflight must be between 1 and 65535")
        if self.shared_subscription_strategy not in SHARE_STRATEGIES:
            raise ValueError(
                "shared_subscription_strategy must be round_robin, random, sticky or hash"
            )
        if self.max_connections_per_address is not None and self.max_connections_per_address < 0:
            raise ValueError("max_connections_per_address must not be negative")
        for name in (
            "max_connections",
            "max_topic_length",
            "max_topic_levels",
            "max_subscriptions_per_client",
            "max_publish_burst",
            "max_retained",
            "max_sessions",
            "max_sessions_per_user",
            "max_subscription_bytes",
            "match_cache_size",
            "match_cache_bytes",
            "max_user_properties",
            "max_output_buffer",
            "max_publish_rate",
            "sys_interval",
            "connection_log_interval",
            "connection_log_rate",
        ):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must not be negative")
        if self.input_budget < 1:
            raise ValueError("input_budget must be at least 1")
        if not 0 < self.max_connect_size <= 268_435_460:
            raise ValueError("max_connect_size must be between 1 and 268435460")
        if self.session_owner_mismatch not in ("refuse", "new"):
            raise ValueError('session_owner_mismatch must be "refuse" or "new"')
