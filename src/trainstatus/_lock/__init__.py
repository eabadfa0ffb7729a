"""The cross-process lock of a status file: ``flock`` (or a soft lease on NFS), with fair turns.

- ``path_lock``: ``PathLock``, one per status file per process (a thread lock in front of the file
  lock), the soft lease, and what a timeout says; ``lock_for`` hands them out.
- ``descriptor``: the held ``flock`` descriptor and its wait: in line (``fair``), in the kernel
  (``kernel_wait``), or handing the change over to the holder (``mailbox``).
- ``kernel_wait``: threads blocked in the kernel, so a waiter can still time out and see Ctrl-C.
- ``fair``: the waiting list in the lock file; the longest waiter goes first.
- ``mailbox``: group commit across processes, the boxes a waiter posts its change in.
- ``holders``: who holds the lock (pid, program or whole command line, machine), read only for a
  message: a timeout's here (the program only), ``trainstatus check``'s in ``_cli``.
- ``version``: the status file's own versions, ``flock``ed while a write builds on them, so that a
  lock file deleted or replaced by hand never lets two writers in at once.
- ``attributes``: chattr's immutable and append-only marks, read only for the message of a write
  refused with ``EPERM`` (the lock file here, the status file and its folder in ``_storage``).

May import: ``_codec`` (a box decodes entries), ``_errors``, ``_interrupts``, ``_lazy``; never the
store or the storage above it. filelock is imported on first use.
"""
