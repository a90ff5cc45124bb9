"""mqttbroker: an MQTT 5.0 broker (3.1.1 clients welcome) on asyncio."""

from . import compiled

__version__ = "0.1.0"

compiled.select()  # compiled hot path or its pure-Python source, before either is imported
