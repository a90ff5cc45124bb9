"""The asyncio edges: sockets in, bytes to the sans-I/O core, bytes out."""


class StartError(Exception):
    """The broker cannot start (a listener that cannot listen); the message names it and why."""
