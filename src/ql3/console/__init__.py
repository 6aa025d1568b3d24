"""The web console: static assets served by the same process at ``/``."""
