"""Storage adapters (SQLite and PostgreSQL) and the migration runner."""
