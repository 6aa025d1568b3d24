"""Thin routes: validate, authorize, call one use case inside one transaction, map the result."""
