"""The dependency rule at run time: what a distribution reaches without an import statement.

import-linter checks imports. A distribution can also reach another through
- a registry lookup (``ds.interfaces.registry``: ``get``, ``has_provider``, ``list_providers``) of
  an entry-point group that other distributions provide,
- a string naming a ds module (``[python, "-m", "ds.launcher", ...]``, ``importlib.import_module``),
- a ``DS_*`` environment variable it sets for another distribution's code to act on.

Each must reach a distribution it declares, directly or through what those declare (extras do not
count: they are not installed by default). Allowed besides: a lookup of a group the distribution
provides itself, and optional plug-ins: probes (``has_provider``, ``list_providers``) and any
lookup in a module that probes the same group first or in a ``try`` that handles the missing
provider. A variable is satisfied when the distribution itself, or one it declares, reads it.

Checked for interfaces/ and every distribution under packages/ (the framework adapters under
integrations/ reach the composition root through ``ds.initialize`` by design: docs/architecture.md).
"""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import tomllib

from ds.interfaces import registry

ROOT = Path(__file__).resolve().parents[2]

LOOKUPS = {"get", "has_provider", "list_providers"}
PROBES = {"has_provider", "list_providers"}
# What a ``try`` must handle for the lookup inside it to count as optional.
HANDLED = {"ProviderNotFoundError", "DsError", "Exception", "BaseException", "LookupError"}
MODULE = re.compile(r"ds(\.[A-Za-z_]\w*)+")
ENTRY = re.compile(r"ds(\.[A-Za-z_]\w*)+(:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*)?")  # module[:attr]
ENV = re.compile(r"DS_[A-Z0-9_]+")


@dataclass
class Dist:
    name: str
    root: Path
    declares: set[str]
    provides: set[str]  # entry-point groups
    modules: set[str] = field(default_factory=set)  # top ds modules: ds.full, ds.integrations.hf


def distributions(root: Path) -> dict[str, Dist]:
    out: dict[str, Dist] = {}
    for pyproject in sorted(root.glob("*/pyproject.toml")) + sorted(
        root.glob("*/*/pyproject.toml")
    ):
        if not (pyproject.parent / "src" / "ds").is_dir():
            continue
        project = tomllib.loads(pyproject.read_text())["project"]
        deps = {re.split(r"[ <>=!~;\[]", d, maxsplit=1)[0] for d in project.get("dependencies", [])}
        dist = Dist(
            project["name"],
            pyproject.parent,
            {d for d in deps if d.startswith("ds-")},
            set(project.get("entry-points", {})),
        )
        src = pyproject.parent / "src"
        for init in src.rglob("*.py"):
            parts = init.relative_to(src).parts
            # the first package level that is not a bare namespace (ds, ds.integrations)
            depth = 3 if parts[:2] == ("ds", "integrations") else 2
            if len(parts) > depth or (len(parts) == depth and parts[-1].endswith(".py")):
                mod = ".".join(parts[:depth]).removesuffix(".py")
                dist.modules.add(mod)
        out[dist.name] = dist
    return out


def reach(dists: dict[str, Dist], name: str) -> set[str]:
    """``name`` and every distribution it declares, transitively."""
    seen, todo = set(), [name]
    while todo:
        d = todo.pop()
        if d not in seen:
            seen.add(d)
            todo.extend(dists[d].declares if d in dists else ())
    return seen


def checked(dists: dict[str, Dist], root: Path) -> list[Dist]:
    """interfaces/ and the distributions under packages/."""
    return [
        d
        for d in dists.values()
        if d.root == root / "interfaces" or d.root.parent == root / "packages"
    ]


@dataclass(frozen=True)
class Use:
    where: str  # path:line
    kind: str  # lookup | module | env-write | env-read
    what: str  # group, module or variable
    optional: bool = False


def _constants(tree: ast.Module) -> dict[str, str]:
    """Module-level ``NAME = "string"`` assignments."""
    out = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            for t in node.targets:
                if isinstance(t, ast.Name) and isinstance(node.value.value, str):
                    out[t.id] = node.value.value
    return out


def _string(node: ast.AST | None, consts: dict[str, str]) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.Name):
        return consts.get(node.id)
    return None


def _group(node: ast.AST | None, consts: dict[str, str]) -> str | None:
    if isinstance(node, ast.Attribute) and getattr(node.value, "id", "") == "registry":
        value = getattr(registry, node.attr, None)
        return value if isinstance(value, str) else None
    return _string(node, consts)


def _handles_missing(handler: ast.ExceptHandler) -> bool:
    if handler.type is None:
        return True
    names = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    return any(
        (n.id if isinstance(n, ast.Name) else getattr(n, "attr", "")) in HANDLED for n in names
    )


def _docstrings(nodes: list[ast.AST]) -> set[int]:
    out = set()
    for node in nodes:
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                out.add(id(body[0].value))
    return out


def uses(path: Path, rel: str) -> Iterator[Use]:
    """Every registry lookup, ds module named in a string and DS_* variable set or read."""
    text = path.read_text()
    if not any(s in text for s in ("registry", "DS_", '"ds.', "'ds.")):
        return  # nothing here can name a group, a ds module or a DS_ variable
    tree = ast.parse(text, str(path))
    nodes = list(ast.walk(tree))
    consts = _constants(tree)
    docs = _docstrings(nodes)
    imported = {  # lookups imported by name: from ds.interfaces.registry import get
        a.asname or a.name: a.name
        for n in nodes
        if isinstance(n, ast.ImportFrom) and n.module == "ds.interfaces.registry"
        for a in n.names
        if a.name in LOOKUPS
    }
    guarded: set[int] = set()  # nodes inside a try that handles a missing provider
    for node in nodes:
        if isinstance(node, ast.Try) and any(_handles_missing(h) for h in node.handlers):
            for stmt in node.body:
                guarded.update(id(n) for n in ast.walk(stmt))
    found: list[Use] = []
    for node in nodes:
        at = f"{rel}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.Call):
            f = node.func
            fn = None
            if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name):
                if f.value.id == "registry" and f.attr in LOOKUPS:
                    fn = f.attr
            elif isinstance(f, ast.Name) and f.id in imported:
                fn = imported[f.id]
            if fn is not None:
                group = _group(node.args[0] if node.args else None, consts)
                optional = fn in PROBES or id(node) in guarded
                found.append(Use(at, f"lookup:{fn}", group or "?", optional))
            name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
            key = _string(node.args[0], consts) if node.args else None
            if key and ENV.fullmatch(key):
                if name in ("get", "getenv"):
                    found.append(Use(at, "env-read", key))
                elif name in ("setdefault", "putenv"):
                    found.append(Use(at, "env-write", key))
            for kw in node.keywords:
                if kw.arg and ENV.fullmatch(kw.arg):
                    found.append(Use(at, "env-write", kw.arg))
        elif isinstance(node, ast.Subscript):
            key = _string(node.slice, consts)
            if key and ENV.fullmatch(key):
                kind = "env-write" if isinstance(node.ctx, ast.Store) else "env-read"
                found.append(Use(at, kind, key))
        elif isinstance(node, ast.Compare) and isinstance(node.ops[0], (ast.In, ast.NotIn)):
            key = _string(node.left, consts)
            if key and ENV.fullmatch(key):
                found.append(Use(at, "env-read", key))
        elif isinstance(node, ast.Dict):
            for k in node.keys:
                key = _string(k, consts)
                if key and ENV.fullmatch(key):
                    found.append(Use(at, "env-write", key))
        elif (
            isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs
        ):
            if ENTRY.fullmatch(node.value):
                found.append(Use(at, "module", node.value.split(":", 1)[0]))
        elif isinstance(node, ast.JoinedStr) and node.values:
            head = node.values[0]
            if isinstance(head, ast.Constant) and isinstance(head.value, str):
                text = head.value.rstrip(".")
                if MODULE.fullmatch(text):
                    found.append(Use(at, "module", text))
    # A lookup in a module that probes its group first handles a missing provider.
    probed = {u.what for u in found if u.kind in ("lookup:has_provider", "lookup:list_providers")}
    for u in found:
        if u.kind == "lookup:get" and u.what in probed:
            u = Use(u.where, u.kind, u.what, True)
        yield u


def _owner(dists: dict[str, Dist], module: str) -> str | None:
    best: tuple[int, str] | None = None
    for d in dists.values():
        for m in d.modules:
            if (module == m or module.startswith(m + ".")) and (best is None or len(m) > best[0]):
                best = (len(m), d.name)
    return best[1] if best else None


def scan(root: Path) -> tuple[dict[str, Dist], dict[str, list[Use]]]:
    """The distributions under ``root`` and what each one's source uses."""
    dists = distributions(root)
    per_dist = {
        d.name: [
            u
            for path in sorted((d.root / "src").rglob("*.py"))
            for u in uses(path, str(path.relative_to(root)))
        ]
        for d in dists.values()
    }
    return dists, per_dist


@functools.cache
def _scan_repo() -> tuple[dict[str, Dist], dict[str, list[Use]]]:
    return scan(ROOT)


def violations(
    root: Path, scanned: tuple[dict[str, Dist], dict[str, list[Use]]] | None = None
) -> list[str]:
    dists, per_dist = scanned or scan(root)
    providers: dict[str, set[str]] = {}
    for d in dists.values():
        for g in d.provides:
            providers.setdefault(g, set()).add(d.name)
    readers: dict[str, set[str]] = {}
    for name, found in per_dist.items():
        for u in found:
            if u.kind == "env-read":
                readers.setdefault(u.what, set()).add(name)
    out: list[str] = []
    for d in checked(dists, root):
        mine = reach(dists, d.name)
        for u in per_dist[d.name]:
            if u.kind.startswith("lookup"):
                if u.optional:
                    continue
                if u.what == "?":
                    out.append(
                        f"{d.name}: {u.where}: a registry lookup of a group this check "
                        "cannot read; name the group with a registry constant"
                    )
                    continue
                by = providers.get(u.what, set())
                if not by & mine:
                    who = ", ".join(sorted(by)) or "no distribution"
                    out.append(
                        f"{d.name}: {u.where}: looks up group {u.what!r}, provided by "
                        f"{who}, which {d.name} does not declare"
                    )
            elif u.kind == "module":
                owner = _owner(dists, u.what)
                if owner is not None and owner not in mine:
                    out.append(
                        f"{d.name}: {u.where}: names module {u.what!r} of {owner}, "
                        f"which {d.name} does not declare"
                    )
            elif u.kind == "env-write":
                by = readers.get(u.what, set())
                if by and not by & mine:
                    out.append(
                        f"{d.name}: {u.where}: sets {u.what} for "
                        f"{', '.join(sorted(by))} to read, which {d.name} does not "
                        "declare"
                    )
    return out


def test_no_distribution_reaches_one_it_does_not_declare() -> None:
    found = violations(ROOT, _scan_repo())
    assert not found, "\n".join(found)


def test_every_distribution_is_checked() -> None:
    dists, per_dist = _scan_repo()
    names = {d.name for d in checked(dists, ROOT)}
    assert {"ds-interfaces", "ds-autotune", "ds-full", "ds-launcher", "ds-sim"} <= names
    assert len(names) == 1 + len(list((ROOT / "packages").glob("*/pyproject.toml")))
    assert dists["ds-full"].modules == {"ds.full"}
    # the check sees each kind of use where the tree has one
    kinds = {u.kind for d in checked(dists, ROOT) for u in per_dist[d.name]}
    assert {"lookup:get", "lookup:list_providers", "module", "env-read", "env-write"} <= kinds


def _tree(tmp: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp / rel).write_text(text)
    return tmp


def _pyproject(name: str, deps: list[str], groups: dict[str, dict[str, str]] | None = None) -> str:
    lines = ["[project]", f'name = "{name}"', f"dependencies = {deps!r}"]
    for g, entries in (groups or {}).items():
        lines.append(f'[project.entry-points."{g}"]')
        lines += [f'{k} = "{v}"' for k, v in entries.items()]
    return "\n".join(lines) + "\n"


def test_the_check_names_package_group_and_provider(tmp_path: Path) -> None:
    """An undeclared lookup, module and variable are each reported; declaring the provider,
    probing first or handling the missing provider clears the lookup."""
    tool = (
        "import os, sys\n"
        "from ds.interfaces import registry\n"
        "TRIAL = 'DS_TRIAL'\n"
        "def run():\n"
        "    fn = registry.get(registry.INITIALIZE, 'default')\n"
        "    env = dict(os.environ)\n"
        "    env[TRIAL] = '1'\n"
        "    return [sys.executable, '-m', 'ds.root.cli']\n"
    )
    root = _tree(
        tmp_path,
        {
            "interfaces/pyproject.toml": _pyproject("ds-interfaces", []),
            "interfaces/src/ds/interfaces/__init__.py": "",
            "packages/tool/pyproject.toml": _pyproject("ds-tool", ["ds-interfaces==0.1"]),
            "packages/tool/src/ds/tool/run.py": tool,
            "packages/root/pyproject.toml": _pyproject(
                "ds-root",
                ["ds-interfaces", "ds-tool"],
                {"ds.initialize": {"default": "ds.root:init"}},
            ),
            "packages/root/src/ds/root/__init__.py": "import os\nos.environ.get('DS_TRIAL')\n",
        },
    )
    found = violations(root)
    assert len(found) == 3, found
    assert (
        "ds-tool: packages/tool/src/ds/tool/run.py:5: looks up group 'ds.initialize', "
        "provided by ds-root, which ds-tool does not declare"
    ) in found
    assert any("names module 'ds.root.cli' of ds-root" in f for f in found)
    assert any("sets DS_TRIAL for ds-root to read" in f for f in found)
    for fixed in (
        tool.replace(
            "    fn = registry.get",
            "    registry.has_provider(registry.INITIALIZE, 'x')\n    fn = registry.get",
        ),
        tool.replace(
            "    fn = registry.get(registry.INITIALIZE, 'default')\n",
            "    try:\n        registry.get(registry.INITIALIZE, 'default')\n"
            "    except ProviderNotFoundError:\n        pass\n",
        ),
    ):
        (root / "packages/tool/src/ds/tool/run.py").write_text(fixed)
        assert not [f for f in violations(root) if "looks up" in f]
