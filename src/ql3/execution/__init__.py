"""Local process execution: durable process identity, the per-attempt shim, stop control, receipts, logs."""
