"""Benchmarks for mqttbroker: a load generator and a runner that measures any MQTT broker beside
Mosquitto. See benchmarks/README.md; run with ``python -m benchmarks``."""
