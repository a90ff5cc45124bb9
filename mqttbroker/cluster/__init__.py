"""Cluster mode: several broker nodes that behave as one broker, on Redis.

- ``routes.py``: the other nodes' topic filters (the route table), mirrored from Redis.
- ``node.py``: one node's link to the cluster (``ClusterNode``, the broker's backplane): its
  lease, its route entries, forwarding through Redis pub/sub (QoS 0) and a Redis Stream per node
  (QoS 1/2), retained messages shared.
- ``store.py``: ``ClusterStore``, the node's store wrapped so that a message forwarded to other
  nodes counts as a write (its acknowledgement waits until Redis has it), and every change to a
  persistent session goes to Redis too.
- ``ownership.py``: who serves a client id, sans I/O: the node's lease as it knows it, the
  steps of a claim, fencing (inputs: what Redis answered and the time; outputs: what to do).
- ``link.py``: that protocol's Redis I/O (leases, the liveness connection, claims, looks at
  another node), each check-and-set one Lua script.
- ``handover.py``: a session moving to the node its client connected to; its form in Redis.
- ``outbox.py``: messages for other nodes kept in the node's own storage while Redis is down.
- ``workers.py``: ``--workers N``, processes of one machine sharing its ports, each a node.

Nothing here is imported unless ``[cluster] redis`` is set; a single node never loads Redis.
"""
