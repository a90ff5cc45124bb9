"""Operations: what the broker tells about itself ($SYS topics)."""
