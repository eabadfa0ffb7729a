"""The VALUE of ``trainstatus set``: the text typed on the command line (or read from stdin) as a value.

JSON when it can have been meant as JSON, the text itself when it cannot; refused, with the
spelling to use, when it is Python's spelling of a JSON word or number, a number a float cannot
hold, a key given twice, or JSON with a mistake in it (see set's help). Its own module because it
is one question, with its own tables, apart from opening and writing the file.

Imports json, re and math, ``base`` (for ``_Fail``) and the loader's duplicate finder; nothing that
opens a file.
"""

from __future__ import annotations

import json
import math
import re
import sys
from typing import Any

from .base import _Fail
from .._load import Corrupt, find_duplicates

__all__ = ["_parse_value", "_read_stdin"]


# Spellings of true/false/null and the non-finite floats that are not JSON's, lowercased: Python's
# (True, None, nan, inf) and their case variants. A careful user meant the value, not the word.
_PYTHON_SPELLINGS = {
    "true": "true", "false": "false", "none": "null", "null": "null",
    "nan": "NaN", "+nan": "NaN", "-nan": "NaN",
    "inf": "Infinity", "+inf": "Infinity", "infinity": "Infinity", "+infinity": "Infinity",
    "-inf": "-Infinity", "-infinity": "-Infinity",
}
# What JSON (with the NaN/Infinity literals Python's json and ML-Agents write) spells as itself.
_JSON_WORDS = {"true", "false", "null", "NaN", "Infinity", "-Infinity"}
_JSON_START = re.compile(r'\s*[\[{"0-9-]')


def _shown(text: str) -> str:
    """VALUE as an error shows it: a long one cut (it may be megabytes read from stdin)."""
    return text if len(text) <= 60 else text[:57] + "..."


def _fail_value(text: str, problem: str, remedy: str) -> _Fail:
    return _Fail(f"VALUE {_shown(text)!r} {problem}; nothing was changed. {remedy}")


class _OutOfRange(Exception):
    def __init__(self, number: str, kind: str, meant: str) -> None:
        self.number = number
        self.kind = kind
        self.meant = meant  # what to write if that is the value meant


def _finite(number: str) -> float:
    """A JSON number as a float, unless it is too large (read as Infinity) or too small (read as 0).

    The literals NaN, Infinity and -Infinity do not pass here (json's parse_constant takes them):
    written out, they are what the user meant.
    """
    value = float(number)
    if math.isinf(value):
        meant = "-Infinity" if value < 0 else "Infinity"
        raise _OutOfRange(number, f"too large for a float: it would be stored as {meant}", meant)
    mantissa = re.split("[eE]", number)[0]
    if value == 0 and re.search("[1-9]", mantissa):
        raise _OutOfRange(number, "too small for a float: it would be stored as 0", "0")
    return value


def _read_stdin() -> str:
    """VALUE ``-``: the value from standard input, without the newline that ends its last line."""
    data = sys.stdin.buffer.read()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _Fail(f"VALUE - (standard input) is not UTF-8 text: {exc.reason} at byte {exc.start}; "
                    "nothing was changed") from None
    return text[:-2] if text.endswith("\r\n") else text[:-1] if text.endswith("\n") else text


def _parse_value(text: str) -> Any:
    """VALUE as JSON, or as the text itself when it cannot have been meant as JSON; see set's help."""
    word = text.strip()
    spelling = _PYTHON_SPELLINGS.get(word.lower())
    if spelling is not None and word not in _JSON_WORDS:
        raise _fail_value(text, f"is Python's spelling; JSON's is {spelling}",
                          f"Pass {spelling}, or pass --string to store the text {text!r}")
    try:
        value = json.loads(text, parse_float=_finite)
    except _OutOfRange as exc:
        held = "is" if exc.number == word else f"holds {exc.number},"
        raise _fail_value(text, f"{held} a number {exc.kind}",
                          f"Write {exc.meant} if that is what you mean, or pass --string to store the text as it "
                          "is") from None
    except RecursionError:
        raise _Fail("VALUE is nested too deeply to be stored") from None
    except json.JSONDecodeError as exc:
        error = exc
    else:
        # json keeps the last of a repeated key, as it does in a file; the user meant one of them.
        try:
            repeated = find_duplicates(text.encode("utf-8", "surrogatepass"))
        except Corrupt:  # parsed once, but the second parse's hook took the last levels of the stack
            raise _Fail("VALUE is nested too deeply to be stored") from None
        if repeated:
            first = repeated[0]
            times = "twice" if len(first.values) == 2 else f"{len(first.values)} times"
            raise _fail_value(
                text, f"gives the key {json.dumps(first.where[-1], ensure_ascii=False)} {times} in one "
                      f"object ({first.name}: {first.listed}), and JSON keeps only the last",
                "Give each key once",
            )
        return value
    number = _python_number(word)
    if number is not None:
        raise _fail_value(text, "is a number JSON does not write that way",
                          f"Write {number}, or pass --string to store the text {text!r}")
    if _JSON_START.match(text):
        at = f"column {error.colno}" if error.lineno == 1 else f"line {error.lineno} column {error.colno}"
        # json's "Unterminated string starting at" already ends with the preposition.
        at = at if error.msg.endswith(" at") else f"at {at}"
        raise _fail_value(text, f"looks like JSON but is not: {error.msg} {at}",
                          "Fix it, or pass --string to store the text as it is")
    return text  # plain text (a word, a file name): stored as the string it is


def _python_number(word: str) -> str | None:
    """The JSON spelling of a number Python reads in ``word`` (+5, .5, 1_000, 007), else None."""
    for kind in (int, float):
        try:
            number = kind(word)
        except ValueError:
            continue
        if isinstance(number, float) and not math.isfinite(number):
            return None  # 1e999 and the like: JSON reads them too, or the words above caught them
        return json.dumps(number)
    return None
