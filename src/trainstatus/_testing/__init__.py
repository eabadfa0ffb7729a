"""The testing kit behind ``trainstatus.testing``: simulated kills and power losses of a trainer.

- ``points``: the crash points of a write and what a simulated kill is (the public names).
- ``kill``: stopping the n-th write at a named point, in this process or with a real SIGKILL.
- ``power``: record a run and hand a check every state a power loss could leave, over ``record``
  (the trace of the ``os`` calls that matter, as they happen), ``interpose`` (shows it the ``os``
  calls on a folder), ``opens`` (and the builtin ``open``'s), ``model`` (the states a power loss
  may leave after each prefix of the trace) and ``fs`` (folders as values).

May import the store and the storage (it hooks the write protocol's named steps); only
``trainstatus.testing`` and the pytest plugin (``src/_trainstatus_pytest.py``) import it.
"""
