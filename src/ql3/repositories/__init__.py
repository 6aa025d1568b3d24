"""Repositories: one module per aggregate, the only code that runs named queries (``tx.one``,
``tx.all``, ``tx.run``) and the only code that reads storage rows. Each function takes the open
``Transaction`` of the use case that calls it (so a use case stays one unit of work) and returns
frozen domain records, never rows (docs/architecture.md, "Layers")."""
