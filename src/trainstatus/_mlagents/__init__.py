"""Unity ML-Agents: the drop-in ``GlobalTrainingStatus`` and the plugin ``mlagents-learn`` loads.

- ``status``: ``StatusType``, ``StatusMetaData`` and ``GlobalTrainingStatus``, ML-Agents' API over a
  ``StatusStore`` (``trainstatus.GlobalTrainingStatus`` loads it on first use).
- ``plugin``: the entry points of pyproject.toml's ``mlagents.*`` groups; inside ``mlagents-learn``
  it routes ML-Agents' own class, checkpoint manager and model saver through trainstatus.

May import the store, ``_checkpoints`` and ``_storage``; only ``trainstatus`` (lazily) and
ML-Agents' entry points import it. ML-Agents itself is imported only inside ``mlagents-learn``.
"""
