"""What the test folders share (the broker's package holds no test-only code), one module per job:
the in-memory harness (harness.py) and its SQLite twin (sqlite_harness.py), clients of a real
broker (paho and raw sockets, raw packet builders: clients.py), the programs under test as
subprocesses and Mosquitto's client programs (launcher.py), the programs outside Python a test
may need (external_tools.py), the ending of what a fixture started (cleanup.py), throwaway TLS
certificates (certs.py), whole-packet codec helpers (codec.py), hypothesis strategies of valid
packets (strategies.py), the admin server's HTTP client checked against the OpenAPI document
(admin_client.py) and its dashboard in a headless Chromium (dashboard_page.py), a local HTTP
service and the operator's auth service (http_service.py), a redis-server of the test's own
(redis_server.py) and clients of a cluster's nodes (cluster_clients.py), the client side of
SCRAM (scram_client.py), password files in our and Mosquitto's formats (password_files.py), the
rig of brokers and webhook endpoints of the bridge and webhook tests (webhook_rig.py), a broker
with passwords and an ACL (secure_broker.py), listeners of every kind and byte-exact clients of
them (listeners.py), the programs in examples/ (example_programs.py), a broker that must exit
(broker_exits.py) and the benchmark's C programs (c_programs.py). Tests import them as
``support.<module>``; no folder puts another on sys.path for them, and no folder keeps helpers
of its own beside its tests."""
