"""Use cases, written once against the storage port."""
