"""What the test folders share (the broker's package holds no test-only code): the in-memory
harness (harness.py) and its SQLite twin (sqlite_harness.py), clients of a real broker (paho and
raw sockets, raw packet builders: clients.py), the programs under test as subprocesses
(launcher.py), throwaway TLS certificates (certs.py) and whole-packet codec helpers (codec.py).
Tests import them as ``support.<module>``; no folder puts another on sys.path for them."""
