"""The asyncio edges: sockets in, bytes to the sans-I/O core, bytes out."""

from ..config import StartError

__all__ = ["StartError"]
