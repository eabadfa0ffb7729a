"""Where the document lives: the storage seam, and its local-file and in-memory sides.

- ``base``: the seam the store talks to (``Storage``: read the document and a version token,
  replace it if nobody else did) and the ``Conflict`` a conditional write raises. The object stores
  of ``_remote`` implement it too.
- ``local``: ``LocalFile``, a status file on a local (or NFS) filesystem, written under its lock by
  ``atomic``'s protocol. Helped by ``pin`` (a descriptor on the version last seen), ``keeper`` (what
  each write keeps in the history), ``closer`` (the thread that closes and prunes off the write's
  path), ``aside`` (copies kept aside, leftovers) and ``messages`` (what its errors say).
- ``atomic``: the write protocol as named steps (temp file, write, fsync, rename, directory fsync),
  each one a test can fault.
- ``history``: the earlier versions kept beside the file, and reading them back.
- ``filenames``: the names of everything beside a status file (lock, lease, temp files, copies).
- ``memory``: ``Memory``, the seam with the document kept in this process only.

May import: ``_lock``, ``_errors``, ``_lazy``, ``_log``; never the store, ``_codec`` or the edges.
"""
