"""Cluster mode (docs/cluster.md): ``ql3 control`` replicas and remote ``ql3 worker`` processes.

Replicas share one PostgreSQL database and coordinate only through row locks, version CAS, the
database clock and LISTEN/NOTIFY; a remote worker reaches them over HTTP with a worker credential.
"""
