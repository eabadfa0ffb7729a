"""Which object store adapter opens a URL (``_remote.s3``, ``_remote.gcs``, ``_remote.azure``), each imported only then."""

from __future__ import annotations

from collections.abc import Mapping

from .location import object_store, url_scheme

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy takes it as True)
if TYPE_CHECKING:
    from typing import Any

    from .object_store import ObjectStorage

__all__ = ["object_store_url", "open_object_store"]

# "an s3:// object", "a gs:// object": the article as the scheme is read out
_VOWEL_SOUND = ("s3", "az", "abfs", "abfss")


def object_store_url(location: object) -> str | None:
    """How ``location`` is described in messages (``"an s3:// object"``), or None for a local path."""
    if not isinstance(location, str) or object_store(location) is None:
        return None
    scheme = (url_scheme(location) or "").lower()
    return f"{'an' if scheme in _VOWEL_SOUND else 'a'} {scheme}:// object"


def open_object_store(url: str, storage_options: Mapping[str, Any] | None) -> ObjectStorage:
    kind = object_store(url)
    if kind == "gcs":
        from .gcs import GCSObject

        return GCSObject(url, storage_options)
    if kind == "azure":
        from .azure import AzureBlob

        return AzureBlob(url, storage_options)
    from .s3 import S3Object

    return S3Object(url, storage_options)
