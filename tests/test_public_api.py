"""The public surface: ``__all__``, importability, typing marker, version, import cost."""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.resources
import os
import subprocess
import sys
import tomllib
import types

import trainstatus

EXPECTED_ALL = [
    "STATUS_FORMAT_VERSION",
    "CheckpointList",
    "GlobalTrainingStatus",
    "StatusMetaData",
    "StatusStore",
    "StatusType",
    "TrainingStatusBackendError",
    "TrainingStatusCheckpointError",
    "TrainingStatusCheckpointNotShared",
    "TrainingStatusCollectiveError",
    "TrainingStatusCheckpointWarning",
    "TrainingStatusConflictError",
    "TrainingStatusCorruptError",
    "TrainingStatusCorruptWarning",
    "TrainingStatusDependencyError",
    "TrainingStatusError",
    "TrainingStatusHistoryWarning",
    "TrainingStatusInUseError",
    "TrainingStatusLockTimeout",
    "TrainingStatusMissingWarning",
    "TrainingStatusReadError",
    "TrainingStatusTypeError",
    "TrainingStatusUnfinishedWrite",
    "TrainingStatusValueError",
    "TrainingStatusVersionError",
    "TrainingStatusVersionWarning",
    "TrainingStatusWarning",
    "TrainingStatusWriteError",
    "__version__",
]

PROJECT_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_python(code: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          cwd=PROJECT_ROOT, timeout=60, check=False)


def test_all_is_exactly_the_expected_names() -> None:
    assert sorted(trainstatus.__all__) == sorted(EXPECTED_ALL)
    assert len(trainstatus.__all__) == len(set(trainstatus.__all__)), "duplicates in __all__"


def test_every_exported_name_is_importable() -> None:
    namespace: dict[str, object] = {}
    exec("from trainstatus import *", namespace)  # noqa: S102 - what `import *` really gives
    for name in EXPECTED_ALL:
        assert hasattr(trainstatus, name), name
        module = importlib.import_module("trainstatus")
        assert getattr(module, name) is getattr(trainstatus, name)
    star = {n for n in namespace if n != "__builtins__"}
    assert star == set(EXPECTED_ALL)


def test_no_private_name_is_exported() -> None:
    for name in trainstatus.__all__:
        is_dunder = name.startswith("__") and name.endswith("__")
        assert is_dunder or not name.startswith("_"), name


def test_every_public_attribute_is_in_all() -> None:
    # Names without a leading underscore are public; each of them must be declared. dir(), not
    # vars(): the store's names are imported on first use (issue 13), and dir() lists them before
    # that as after. ("@py_builtins" and "@pytest_ar" are pytest's: it rewrites the asserts of
    # every package that ships a pytest11 plugin, as trainstatus does.) The public submodules
    # trainstatus.testing and trainstatus.integrations show up here once imported (never by
    # import trainstatus).
    def shown(names: dict[str, object] | list[str]) -> set[str]:
        items = names.items() if isinstance(names, dict) else ((n, getattr(trainstatus, n, None)) for n in names)
        return {n for n, v in items if not n.startswith(("_", "@"))
                and not (n in ("testing", "integrations") and isinstance(v, types.ModuleType))}

    public = shown(dir(trainstatus))
    assert public == set(EXPECTED_ALL) - {"__version__"}
    assert shown(vars(trainstatus)) <= public


def test_exported_classes_and_constants() -> None:
    assert trainstatus.STATUS_FORMAT_VERSION == "0.3.0"
    for name in EXPECTED_ALL:
        if name.startswith("TrainingStatus"):
            assert isinstance(getattr(trainstatus, name), type), name


def test_py_typed_is_shipped() -> None:
    marker = importlib.resources.files("trainstatus").joinpath("py.typed")
    assert marker.is_file()
    with open(os.path.join(PROJECT_ROOT, "pyproject.toml"), "rb") as f:
        config = tomllib.load(f)
    assert "py.typed" in config["tool"]["setuptools"]["package-data"]["trainstatus"]


def test_version_matches_the_installed_metadata() -> None:
    assert trainstatus.__version__ == importlib.metadata.version("trainstatus")
    assert isinstance(trainstatus.__version__, str)


def test_import_does_not_import_numpy_or_boto3() -> None:
    # boto3 (the s3 extra) costs ~150 ms to import: only an s3:// store pays for it. The
    # integrations' libraries (torch, SB3, Lightning, Transformers) are imported only by the module
    # of each integration.
    result = run_python(
        "import sys\n"
        "import trainstatus\n"
        "import trainstatus.integrations\n"
        "store = trainstatus.StatusStore\n"
        "heavy = ('numpy', 'boto3', 'botocore', 'torch', 'stable_baselines3', 'gymnasium', 'lightning',\n"
        "         'lightning_fabric', 'transformers', 'accelerate', 'safetensors', 'huggingface_hub', 'ray',\n"
        "         'pyarrow')\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in heavy))\n"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_storing_plain_values_does_not_import_numpy(tmp_path: object) -> None:
    target = os.path.join(str(tmp_path), "status.json")
    result = run_python(
        "import sys\n"
        "import trainstatus\n"
        f"s = trainstatus.StatusStore({target!r})\n"
        "s.set('cat', 'key', {'a': [1, 2.5, float('nan')], 'b': None, 'c': (True, 'x')})\n"
        "s = trainstatus.StatusStore(s.path)\n"
        "print(s.get('cat', 'key')['a'][:2])\n"
        "print('numpy' in sys.modules)\n"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[:2] == ["[1, 2.5]", "False"]


def _import_graph() -> dict[str, set[str]]:
    """Each module of the package -> the package's modules it imports, lazy imports included: a
    function-level ``from . import``, ``lazy_module("...")``, ``importlib.import_module`` of a
    constant and the command line's dispatch table (``_Command("_cli", ...)``)."""
    import ast

    root = os.path.dirname(trainstatus.__file__)
    modules: dict[str, str] = {}
    for directory, _, files in os.walk(root):
        for file in files:
            if file.endswith(".py"):
                relative = os.path.relpath(os.path.join(directory, file), os.path.dirname(root))[:-3]
                name = relative.replace(os.sep, ".").removesuffix(".__init__")
                modules[name] = os.path.join(directory, file)
    graph: dict[str, set[str]] = {}
    for name, file in modules.items():
        package = name if file.endswith("__init__.py") else name.rpartition(".")[0]
        with open(file, encoding="utf-8") as f:
            tree = ast.parse(f.read())
        found: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                base = package
                for _ in range(node.level - 1):
                    base = base.rpartition(".")[0]
                target = (base + ("." + node.module if node.module else "")) if node.level else (node.module or "")
                submodules = {f"{target}.{alias.name}" for alias in node.names} & modules.keys()
                found |= submodules or ({target} & modules.keys())
            elif isinstance(node, ast.Import):
                found |= {alias.name for alias in node.names} & modules.keys()
            elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
                called = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
                value = node.args[0].value
                if called in ("lazy_module", "import_module") and isinstance(value, str):
                    found |= {package + value if value.startswith(".") else value} & modules.keys()
                elif called in ("Command", "_Command") and isinstance(value, str):
                    found |= {f"{package}.{value}"} & modules.keys()
        graph[name] = found - {name}
    return graph


def _circle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle in ``graph`` (its modules in order, the first repeated last), or None."""
    done: set[str] = set()
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        if module in path:
            return path[path.index(module):] + [module]
        if module in done:
            return None
        path.append(module)
        for imported in sorted(graph[module]):
            circle = visit(imported)
            if circle is not None:
                return circle
        path.pop()
        done.add(module)
        return None

    for module in sorted(graph):
        circle = visit(module)
        if circle is not None:
            return circle
    return None


def test_the_package_s_imports_form_no_circle() -> None:
    """What two modules share belongs in a third below both (the lock-timeout message once lived in
    ``_cli`` and was imported back by ``_cli_base``, which ``_cli`` imports)."""
    graph = _import_graph()
    assert {"trainstatus._cli.write", "trainstatus._cli.base", "trainstatus._cli.main", "trainstatus._cli.parser"} <= graph.keys()
    assert "trainstatus._cli.write" in graph["trainstatus._cli.parser"]  # the dispatch table is seen
    assert "trainstatus._cli.read" in graph["trainstatus._cli.main"]  # and show's own, without argparse
    assert _circle(graph) is None


def test_the_circle_finder_finds_one() -> None:
    assert _circle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert _circle({"a": {"b"}, "b": set()}) is None


# The layers of the package (docs/getting-started.md, "Working on trainstatus"). The families below
# the store may import only what is listed here (a top-level module by its name, a family by its
# folder); the edges (the command line, the testing kit, the ML-Agents plugin, the integrations) are
# imported by nothing in the package but their own modules and their public face.
_BELOW_THE_STORE = {
    "_codec": {"_errors", "_lazy"},
    "_lock": {"_codec", "_errors", "_interrupts", "_lazy"},
    "_storage": {"_lock", "_errors", "_lazy", "_log"},
    "_remote": {"_storage", "_errors", "_interrupts", "_lazy", "_log"},
}
_EDGES = {
    "_cli": set(),  # entered from outside the package: src/_trainstatus_cli.py
    "_testing": {"trainstatus.testing"},
    "_mlagents": {"trainstatus"},  # trainstatus.GlobalTrainingStatus, imported on first use
    "integrations": set(),
}
_LONGEST_MODULE = 420  # lines: one concern a module, about 400 lines at the most (STYLE.md, "Size")


def _family(module: str) -> str:
    """``trainstatus._lock.fair`` -> ``_lock``; a top-level module is its own family."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else module


def _layer_problems(graph: dict[str, set[str]]) -> list[str]:
    problems = []
    for module, imported in sorted(graph.items()):
        family = _family(module)
        for target in sorted(imported):
            target_family = _family(target)
            if target_family == family:
                continue
            allowed = _BELOW_THE_STORE.get(family)
            if allowed is not None and target_family not in allowed:
                problems.append(f"{module} imports {target}: {family}/ may import only {sorted(allowed)}")
            if target_family in _EDGES and module not in _EDGES[target_family]:
                problems.append(f"{module} imports {target}: nothing in the package imports {target_family}/")
    return problems


def test_each_family_imports_only_the_layers_below_it() -> None:
    graph = _import_graph()
    assert {_family(m) for m in graph} >= set(_BELOW_THE_STORE) | set(_EDGES)
    assert _layer_problems(graph) == []


def test_the_layer_check_finds_an_import_up_or_into_an_edge() -> None:
    graph = {"trainstatus._codec.values": {"trainstatus._store"}, "trainstatus._store": {"trainstatus._cli.base"},
             "trainstatus._cli.base": {"trainstatus._store"}, "trainstatus.testing": {"trainstatus._testing.kill"}}
    assert _layer_problems(graph) == [
        "trainstatus._codec.values imports trainstatus._store: _codec/ may import only ['_errors', '_lazy']",
        "trainstatus._store imports trainstatus._cli.base: nothing in the package imports _cli/",
    ]


# The families inside trainstatus.integrations: the layer every integration rides on, below the
# libraries' own modules. A shared family imports none of the others' and no library's; a
# library's helpers (_accelerate/, ...) import the shared families and nothing of another library.
_INTEGRATION_SHARED = {
    "_formats": set(),  # the checkpoint formats, checked from their metadata
    "_ranks": set(),  # the many-rank record and decision, over torch.distributed
    "_shared": set(),  # the resume's choice and the list's upkeep, with or without ranks
}
_INTEGRATION_LIBRARIES = ("accelerate", "dcp", "deepspeed", "lightning", "ray", "sb3", "transformers")


def _integration_part(module: str) -> str | None:
    """``trainstatus.integrations._ranks.saving`` -> ``_ranks``; ``...integrations.dcp`` -> ``dcp``."""
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[1] == "integrations" else None


def _integration_problems(graph: dict[str, set[str]]) -> list[str]:
    problems = []
    for module, imported in sorted(graph.items()):
        part = _integration_part(module)
        if part is None:
            continue
        for target in sorted(imported):
            other = _integration_part(target)
            if other is None or other == part:
                continue
            if part in _INTEGRATION_SHARED and other not in _INTEGRATION_SHARED[part]:
                problems.append(f"{module} imports {target}: integrations/{part}/ may import only "
                                f"{sorted(_INTEGRATION_SHARED[part]) or 'the core'}")
            elif part not in _INTEGRATION_SHARED and other not in _INTEGRATION_SHARED \
                    and other.lstrip("_") != part.lstrip("_"):
                problems.append(f"{module} imports {target}: a library's modules import only their own helpers "
                                "and the shared families")
    return problems


def test_the_integrations_families_import_only_the_shared_layers() -> None:
    graph = _import_graph()
    parts = {_integration_part(module) for module in graph} - {None}
    assert parts >= set(_INTEGRATION_SHARED) | set(_INTEGRATION_LIBRARIES) | {"_accelerate", "_lightning", "_ray"}
    assert _integration_problems(graph) == []


def test_the_integrations_check_finds_an_import_across_libraries_or_up() -> None:
    graph = {"trainstatus.integrations._ranks.saving": {"trainstatus.integrations._shared.choice"},
             "trainstatus.integrations._lightning.common": {"trainstatus.integrations._accelerate.folders",
                                                           "trainstatus.integrations._formats.torch_zip"},
             "trainstatus.integrations.lightning": {"trainstatus.integrations._lightning.common"},
             "trainstatus.integrations.dcp": {"trainstatus.integrations.accelerate"}}
    assert _integration_problems(graph) == [
        "trainstatus.integrations._lightning.common imports trainstatus.integrations._accelerate.folders: a "
        "library's modules import only their own helpers and the shared families",
        "trainstatus.integrations._ranks.saving imports trainstatus.integrations._shared.choice: "
        "integrations/_ranks/ may import only the core",
        "trainstatus.integrations.dcp imports trainstatus.integrations.accelerate: a library's modules import only "
        "their own helpers and the shared families",
    ]


def test_no_module_is_longer_than_about_400_lines() -> None:
    root = os.path.dirname(trainstatus.__file__)
    long = {}
    for directory, _, files in os.walk(root):
        for file in files:
            if file.endswith(".py"):
                with open(os.path.join(directory, file), encoding="utf-8") as f:
                    lines = sum(1 for _ in f)
                if lines > _LONGEST_MODULE:
                    long[os.path.relpath(os.path.join(directory, file), root)] = lines
    assert long == {}, "split these along a seam a newcomer would look for (STYLE.md, 'Size')"
