"""No source file over 500 lines without a reason: a module that long states why in its
docstring, on a line starting with ``Size:``; otherwise it is split by concept (re-exporting from
the old module keeps its import path)."""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LIMIT = 500


def sources(root: Path) -> list[Path]:
    """Every shipped source file: interfaces/src and packages/*/src."""
    return sorted([*root.glob("interfaces/src/**/*.py"), *root.glob("packages/*/src/**/*.py")])


def has_reason(text: str) -> bool:
    doc = ast.get_docstring(ast.parse(text)) or ""
    return any(line.strip().startswith("Size:") for line in doc.splitlines())


def oversized(paths: Iterable[Path], root: Path) -> list[str]:
    out = []
    for path in paths:
        text = path.read_text()
        lines = len(text.splitlines())
        if lines > LIMIT and not has_reason(text):
            out.append(
                f"{path.relative_to(root)}: {lines} lines > {LIMIT}; split it by concept "
                "(re-export from this module) or give the reason on a 'Size:' line of its docstring"
            )
    return out


def test_no_source_file_over_500_lines_without_a_reason() -> None:
    files = sources(ROOT)
    assert len(files) > 100  # the globs found the tree
    found = oversized(files, ROOT)
    assert not found, "\n".join(found)


def test_the_reason_is_a_size_line_of_the_module_docstring(tmp_path: Path) -> None:
    body = "x = 1\n" * LIMIT
    cases = {
        "plain.py": '"""A module."""\n' + body,
        "reason.py": '"""A module.\n\nSize: one table DeepSpeed defines in one place.\n"""\n'
        + body,
        "comment.py": "# Size: not in the docstring\n" + body,
        "short.py": '"""A module."""\n' + "x = 1\n" * (LIMIT - 1),
    }
    for name, text in cases.items():
        (tmp_path / name).write_text(text)
    found = oversized(sorted(tmp_path.glob("*.py")), tmp_path)
    assert [f.split(":")[0] for f in found] == ["comment.py", "plain.py"], found
