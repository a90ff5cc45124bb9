"""What the test folders share (the broker's package holds no test-only code): the in-memory
harness (harness.py) and its SQLite twin (sqlite_harness.py), clients of a real broker (paho and
raw sockets, raw packet builders: clients.py), the programs under test as subprocesses and
Mosquitto's client programs (launcher.py), throwaway TLS certificates (certs.py), whole-packet
codec helpers (codec.py) and hypothesis strategies of valid packets (strategies.py); and the
helpers of single folders: integrations.py, sessions.py, transports.py, examples.py,
lifecycle.py, benchmark_c.py. Tests import them as ``support.<module>``; no folder puts another
on sys.path for them."""
