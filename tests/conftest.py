"""The suite's shared fixtures are one plugin, ``tests/support/plugin.py``; helpers:  ``tests/support/``."""

pytest_plugins = ["tests.support.plugin"]
