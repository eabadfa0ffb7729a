"""Print pip constraints pinning each direct dependency to the lowest version pyproject.toml allows.

Used by .ci/run's lowest-dependencies leg: the runtime dependencies (filelock, orjson) and the
optional boto3 of the ``s3`` extra, each at its ``>=`` bound, so a bound that is not true fails CI.
"""

import re
import sys
import tomllib
from pathlib import Path

project = tomllib.loads((Path(__file__).resolve().parent.parent / "pyproject.toml").read_text())["project"]
requirements = list(project["dependencies"]) + list(project["optional-dependencies"]["s3"])
for requirement in requirements:
    match = re.fullmatch(r"\s*([A-Za-z0-9_.-]+)\s*>=\s*([0-9][0-9A-Za-z.]*)\s*", requirement)
    if match is None:
        sys.exit(f"{requirement!r}: a direct dependency needs a plain '>=' lower bound")
    print(f"{match.group(1)}=={match.group(2)}")
