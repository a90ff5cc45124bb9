"""What the test folders share (the broker's package holds no test-only code): the in-memory
harness (harness.py) and its SQLite twin (sqlite_harness.py), and whole-packet codec helpers
(codec.py). Tests import them as ``support.<module>``."""
