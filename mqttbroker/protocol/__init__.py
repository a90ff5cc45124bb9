"""The MQTT wire format, and nothing else: bytes <-> packet objects. No asyncio, no broker state.

``fastpath.decode_packet`` is the one decoder the broker calls (hand-written for the hot
packets, ``grammar`` for the rest); ``grammar`` is the reference codec of every packet.
"""
