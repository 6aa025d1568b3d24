"""Version-control adapters: the ``git`` command behind ``ports/vcs.py``."""
