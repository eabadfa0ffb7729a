"""A Griffe extension for the API reference (mkdocs.yml): private bases are left out.

``TrainingStatusError`` and ``TrainingStatusWarning`` share their context attributes and pickling
through a private mixin (``trainstatus._errors._Context``). A reader of the reference should see
the bases they can catch or subclass (``Exception``, ``OSError``, ``TrainingStatusError``), not
an implementation detail they can neither import nor rely on.
"""

from __future__ import annotations

from typing import Any

import griffe


def _private(base: Any) -> bool:
    # A base is an expression (``_Context``, ``module._Context``) or a plain string.
    return str(base).rpartition(".")[2].startswith("_")


class PublicBases(griffe.Extension):
    """Drop every base whose name starts with an underscore from the classes griffe loads."""

    def on_class_instance(self, *, cls: griffe.Class, **kwargs: Any) -> None:
        cls.bases = [base for base in cls.bases if not _private(base)]
