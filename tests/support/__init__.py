"""What the test folders share (the broker's package holds no test-only code)."""
