"""The codec: values to the exact bytes they occupy in the file, and the file back to values.

A ``set`` encodes only the value it changes (an ``Entry``: its bytes, indented for their place);
writing the document is then a join of bytes (``renderer``). orjson is the fast path; what it
cannot write as it should (NaN and Infinity, lone surrogates, integers past 64 bits) is written by
the paths beside it, never changed in silence.

- ``values``: ``Entry``, orjson's set-up, one value's bytes and ``decode``. Below the others.
- ``names``: category and key names, their bytes, and the names that are refused.
- ``document``: the whole file rendered from entries, and taken apart into entries again.
- ``refusals``: why a value cannot be stored, in words.
- ``json_fallback``: Python's json, for what orjson refuses.
- ``nonfinite``: NaN and Infinity found behind orjson's ``null`` and written as literals.
- ``encoding``: ``encode_value`` and ``encode_loaded``, which pick one of the ways above.
- ``renderer``: the file's bytes kept between writes, rebuilt only where a write changed them.

May import: ``_errors`` and ``_lazy`` only; nothing of the store, the storage or the edges.
orjson and json are imported on first use (``from trainstatus import StatusStore`` loads neither).
"""
