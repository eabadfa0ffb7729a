"""The single source of the package version (read by pyproject.toml and written into metadata)."""

__version__ = "0.1.0"
