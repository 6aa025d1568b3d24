"""Notification senders (adapters): a signed webhook and apprise. Wired by bootstrap only."""
