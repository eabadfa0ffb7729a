"""``python -m trainstatus``: the same command line as the ``trainstatus`` console script."""

from _trainstatus_cli import main  # Ctrl-C handled before the command line is imported

if __name__ == "__main__":
    raise SystemExit(main())
