"""SQLite adapter."""
