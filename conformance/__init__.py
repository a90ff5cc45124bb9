"""MQTT 5.0 conformance suite: black-box tests of a broker over sockets (see README.md)."""
