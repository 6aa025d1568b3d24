"""ql3: a durable task-execution control plane."""

__version__ = "0.1.0"
