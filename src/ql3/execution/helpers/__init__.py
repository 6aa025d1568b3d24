"""Helpers a task's scripts import: ``notify.py`` (``from notify import send``) and ``sendNotify.js``
(``require('sendNotify')``). The launcher puts this directory at the end of ``PYTHONPATH`` and
``NODE_PATH`` (docs/notifications.md "From a script")."""
