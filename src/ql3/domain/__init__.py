"""Pure rules: entities, state machines, digests, validation and errors. No I/O, no clock reads."""
