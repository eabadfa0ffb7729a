"""Print pip constraints pinning each direct dependency to the lowest version pyproject.toml allows.

Used by .ci/run's lowest-dependencies leg: the runtime dependencies (filelock, orjson) and the
optional boto3 of the ``s3`` extra, each at its lower bound, so a bound that is not true fails CI.

    python .ci/lowest_constraints.py [path/to/pyproject.toml]   (default: the project's own)

A requirement must name its lowest version: ``>=X`` or ``~=X`` (which pins ``X``), optionally with
upper bounds or exclusions (``>=1,<2``) that ``X`` itself satisfies. Anything else (no bound, ``==``,
``>``, an environment marker, two lower bounds) exits non-zero naming the requirement: there is no
one lowest version to test. So does a package of ``REQUIRED`` missing from its group: dropped
there, the leg would silently install its newest version instead of testing the bound.
"""

import re
import sys
import tomllib
from pathlib import Path

# packaging comes with pytest (the test extra), which .ci/run installs before running this.
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

# What the code imports, by the pyproject group that must declare it ("dependencies" or an extra).
REQUIRED = {"filelock": "dependencies", "orjson": "dependencies", "boto3": "s3"}
LOWER = (">=", "~=")  # "~=3.10" allows 3.10 and up, to below 4


def lowest(requirement: str) -> str:
    """``name==version`` for one requirement; SystemExit naming it when it has no one lowest version."""
    try:
        parsed = Requirement(requirement)
    except InvalidRequirement as exc:
        sys.exit(f"{requirement!r}: not a valid requirement ({exc})")
    if parsed.marker is not None or parsed.url is not None:
        sys.exit(f"{requirement!r}: a direct dependency needs a plain lower bound, without a marker or URL")
    bounds = [spec for spec in parsed.specifier if spec.operator in LOWER]
    if len(bounds) != 1 or any(spec.operator in ("==", "===", ">") for spec in parsed.specifier):
        sys.exit(f"{requirement!r}: a direct dependency needs exactly one '>=' (or '~=') lower bound")
    version = bounds[0].version
    if not re.fullmatch(r"[0-9][0-9A-Za-z.]*", version) or not parsed.specifier.contains(version, prereleases=True):
        sys.exit(f"{requirement!r}: its lower bound {version} is not a version it allows")
    return f"{parsed.name}=={version}"


def constraints(pyproject: Path) -> list[str]:
    project = tomllib.loads(pyproject.read_text())["project"]
    groups = {"dependencies": list(project.get("dependencies", []))}
    for extra in {group for group in REQUIRED.values() if group != "dependencies"}:
        groups[extra] = list(project.get("optional-dependencies", {}).get(extra, []))
    pins = [lowest(requirement) for group in groups.values() for requirement in group]
    declared = {group: {canonicalize_name(Requirement(r).name) for r in requirements}
                for group, requirements in groups.items()}
    for name, group in REQUIRED.items():
        if name not in declared[group]:
            where = "dependencies" if group == "dependencies" else f"[{group}] extra"
            sys.exit(f"{pyproject}: its {where} no longer requires {name}, which trainstatus imports: "
                     f"put it back with a '>=' lower bound (or take it out of REQUIRED in {__file__})")
    return pins


if __name__ == "__main__":
    if len(sys.argv) > 2:
        sys.exit("usage: lowest_constraints.py [pyproject.toml]")
    default = Path(__file__).resolve().parent.parent / "pyproject.toml"
    print("\n".join(constraints(Path(sys.argv[1]) if len(sys.argv) == 2 else default)))
