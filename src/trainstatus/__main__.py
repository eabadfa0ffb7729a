"""``python -m trainstatus``: the same command line as the ``trainstatus`` console script."""

from ._cli_main import main

if __name__ == "__main__":
    raise SystemExit(main())
