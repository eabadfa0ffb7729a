"""Where a status document may live: the URL schemes trainstatus knows, and the refusal of others.

A path is a URL when it starts with an RFC 3986 scheme followed by ``://`` (``gs://``, ``file://``,
``HTTP://``). Only an object store's (``s3://``; ``gs://``, ``gcs://``; ``az://``, ``abfs://``,
``abfss://``, as fsspec spells them) is opened as one; any other would be taken for a local path and
written under the current directory (``./gs:/bucket/...``), so it is refused before anything is
read or created. ``://`` further down a path (``runs/a://b``) does not make it a URL, nor does a
scheme-like start without ``//`` (``C:/x``, ``note:1``): only the start of a path names a scheme.

``file://`` URLs are refused too, with the local path they name in the message: accepting them
would mean deciding percent-decoding and host rules that a plain path never needs, for no gain.
"""

from __future__ import annotations

import os

from .._errors import TrainingStatusValueError

__all__ = ["SUPPORTED", "check_location", "file_url_advice", "is_s3_url", "object_store", "url_scheme"]

# A URL scheme (RFC 3986): a letter, then letters, digits, "+", "." or "-"; checked without re,
# which every start that opens a store would otherwise import.
_LETTERS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")
_SCHEME_CHARS = _LETTERS | frozenset("0123456789+.-")
SUPPORTED = "s3://, gs:// and az:// URLs and local paths"

# scheme -> the object store it names (the module of its adapter: _remote.s3, _remote.gcs, _remote.azure)
_OBJECT_STORES = {"s3": "s3", "gs": "gcs", "gcs": "gcs", "az": "azure", "abfs": "azure", "abfss": "azure"}


def is_s3_url(location: str) -> bool:
    return location[:5].lower() == "s3://"


def object_store(location: str) -> str | None:
    """``"s3"``, ``"gcs"`` or ``"azure"`` for a URL of that object store, else None."""
    scheme = url_scheme(location)
    return None if scheme is None else _OBJECT_STORES.get(scheme.lower())


def url_scheme(path: str) -> str | None:
    """The scheme ``path`` starts with, as written (``"gs"`` for ``gs://b/k``), or None."""
    end = path.find("://")  # no scheme character is ":", so a scheme ends at the first "://"
    if end < 1 or path[0] not in _LETTERS or not _SCHEME_CHARS.issuperset(path[:end]):
        return None
    return path[:end]


def file_url_advice(url: str) -> str:
    """What to give instead of the ``file://`` URL ``url``: the local path it names, if any."""
    import urllib.parse  # only for a file:// URL given by mistake: 3 ms of every start otherwise

    parts = urllib.parse.urlsplit(url)
    if parts.netloc not in ("", "localhost"):
        return (
            f"it names a file on the host {parts.netloc!r}, which trainstatus cannot reach; mount "
            "that filesystem here and give the local path"
        )
    if not parts.path:
        return "give the local path of the file instead"
    # Non-UTF-8 escapes decode as os.fsdecode would decode those bytes in a path.
    local = urllib.parse.unquote(parts.path, errors="surrogateescape")
    return f"give the local path it names instead: {local!r}"


def check_location(path: str | bytes) -> None:
    """Refuse a ``scheme://`` URL trainstatus cannot open; accept object stores' and local paths.

    Raises ``TrainingStatusValueError`` (``path`` set) naming the scheme, what is supported and
    what to do. Nothing is read or created, so it can run before anything else touches ``path``.
    """
    text = os.fsdecode(path) if isinstance(path, bytes) else path
    scheme = url_scheme(text)
    if scheme is None or scheme.lower() in _OBJECT_STORES:
        return
    if scheme.lower() == "file":
        advice = file_url_advice(text)
    else:
        advice = (
            f"copy the file to a local path or to an object store trainstatus opens, or, for a local directory named "
            f"'{scheme}:', write './{text}'"
        )
    raise TrainingStatusValueError(
        f"Cannot open {text!r}: {scheme}:// URLs are not supported; trainstatus opens {SUPPORTED}. "
        f"Nothing was read or created; {advice}.",
        path=text,
    )
