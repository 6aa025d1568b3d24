"""The HTTP edge: a FastAPI app factory, thin routes, DTOs, one error table and bearer auth."""
