"""Durable stores behind the broker's Store interface (broker/store.py)."""

from __future__ import annotations


class StoreError(Exception):
    """The store cannot be used; the message names the file and what to do."""
