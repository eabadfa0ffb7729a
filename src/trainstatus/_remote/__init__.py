"""Object stores: the status document as one object, kept with conditional writes, not a lock.

- ``object_store``: ``ObjectStorage``, the conditional-write protocol once (read with a version
  token, write only if it still matches, create only if absent), over an adapter per service.
- ``s3``, ``gcs``, ``azure``: the adapters (boto3, google-cloud-storage, azure-storage-blob), each
  importing its SDK only when such a URL is opened.
- ``probe``: before the first write, proof that the server honours conditional writes.
- ``location``: which URL schemes name an object store, and the refusal of any other.
- ``backends``: which adapter opens a URL.

May import: ``_storage`` (the seam), ``_errors``, ``_interrupts``, ``_lazy``, ``_log``; never the
store itself. ``import trainstatus`` loads no SDK: they are optional extras.
"""
