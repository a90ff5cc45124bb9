"""mqttbroker: an MQTT 5.0 broker (3.1.1 clients welcome) on asyncio."""

__version__ = "0.1.0"
