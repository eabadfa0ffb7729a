"""The ``trainstatus`` command line: one module per command family, each loaded only when it runs.

The entry is ``main`` (imported by ``src/_trainstatus_cli.py``, which handles Ctrl-C before the
package is imported). ``show PATH`` is answered without argparse; every other command goes through
``parser``, whose table names each command's module and function as strings, so ``--help`` and
``show``/``get`` import neither the store nor orjson.

- ``names``: what every part shares (the program's name, defaults, the command table's ``Command``).
- ``main``, ``parser``: the entry and the argparse parser.
- ``base``: exit statuses, one-line errors and warnings, reading a file or an object.
- ``target``: the file a command names, and how a changing command opens its store.
- ``read``: ``show`` and ``get``, read with Python's json alone.
- ``values``: the VALUE typed for ``set``.
- ``write``: ``set`` and ``delete``; ``check``; ``corrupt`` (copies kept aside); ``history``
  (``history``, ``diff``, ``restore``); ``checkpoints`` (``prune-missing``).
- ``entries``: how two lists of entries (checkpoint lists) differ, for ``diff``.
- ``lock``: what ``check`` and a timeout's message say about who holds a store's lock (found by
  ``_lock.holders``, as the library's own messages find it).

Output is for people (JSON for values, ``--json`` where a script wants it); exit statuses are in
``base``. May import anything of the package; nothing in the package imports this one.
"""
