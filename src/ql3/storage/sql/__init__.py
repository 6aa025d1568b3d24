"""Shared named SQL."""
