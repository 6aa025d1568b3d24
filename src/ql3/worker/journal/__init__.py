"""The worker host's local crash barrier: one SQLite row per offer, committed before every effect.

The journal is local delivery state, not an authority (docs/contracts.md §3, docs/architecture.md
"The life of a run"). ``launching`` is committed before the executor is asked to spawn; a
``launching`` row found after a restart becomes ``recovery_required: launch_outcome_unknown`` and is
never spawned again.

The journal keeps only what recovery needs. ``offer_json`` is the offer as the worker stores it: the
fence without its lease token and the spec's identity and stop policy, never the command, the working
directory or environment values (the caller strips them, see ``worker.intake``). The lease token, which
a restarted worker needs to prove its authority, is kept only sealed (``lease_token_sealed``): encrypted
and authenticated with a worker-local key in ``<path>.key`` (32 random bytes, ``0600``), bound to its
offer id, so the journal file alone (a copy, a backup, a leaked WAL) holds no usable secret. A record
is pruned as soon as its attempt settles. The file is ``0600`` in a ``0700`` directory, and only one
owner (an ``flock`` on ``<path>.lock``) may use it at a time. The raw completion token is never stored,
only its sha256.

This package is the SQLite adapter behind the ``Journal`` port (``ports/execution.py``); its states,
transitions, records and errors are in ``domain/journal.py``. By what each file holds: ``validation``
(bounds and input checks), ``seal`` (the sealed lease token), ``files`` (private files, the owner lock,
fsync), ``schema`` (schema, statements, row mapping, opening and migration) and ``store``
(``WorkerJournal``). Import each name from the module it lives in.
"""
