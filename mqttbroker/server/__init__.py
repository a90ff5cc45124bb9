"""The asyncio edges: sockets in, bytes to the sans-I/O core, bytes out."""
