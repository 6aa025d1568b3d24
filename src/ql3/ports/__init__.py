"""Interfaces (typing.Protocol). Each method's docstring is its contract."""
