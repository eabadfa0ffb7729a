"""The single source of the package version (read by pyproject.toml and written into metadata)
and of the status file format version, both needed by the light command-line parser."""

__version__ = "0.1.0"

STATUS_FORMAT_VERSION = "0.3.0"
"""The layout version written in ``metadata.stats_format_version``; ML-Agents' current one."""
