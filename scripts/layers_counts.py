"""The shape figures of docs/layers.md, computed from the tree (never typed by hand):

    python scripts/layers_counts.py            # print the markdown section
    python scripts/layers_counts.py --write    # replace it in docs/layers.md (between markers)

What is counted (ast walk of every .py file; `tests/`, `bench/`, `.venv` excluded unless said):

- adapter classes: every class defined in a module of a protocol package (`rmb_relay`,
  `rmb_peer`, `remp_node`, `marlin_cluster`) that imports asyncio itself (the asyncio
  side of a daemon; the cores may not import it), with its line count (target <= 400);
- loops: functions outside the cores that drain a core with `while (x := next_event())`
  (the runner's pass; target one: daemon_runtime.runner);
- guards: definitions of the error guard under any of its names (`bug`, `_bug`, `guard`,
  `_guard`, `_internal_error`);
- rate-limited loggers: classes with an `allow` method whose source speaks of suppressed
  lines;
- LogRecord classes: classes whose fields include `event`, `level` and `attrs` (a log line
  before it is written);
- in-memory test networks: classes, tests included, that schedule deliveries themselves
  (a `deliver_due` or `next_delivery` method); harnesses over one of them are not counted.
"""
from __future__ import annotations

import ast
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PROTOCOLS = ("rmb_relay", "rmb_peer", "remp_node", "marlin_cluster")
PACKAGES = PROTOCOLS + ("daemon_runtime", "deploy", "spark")
GUARD_NAMES = {"bug", "_bug", "guard", "_guard", "_internal_error"}
BEGIN, END = "<!-- layers_counts: begin -->", "<!-- layers_counts: end -->"


def _files(roots) -> list[Path]:
    out = []
    for root in roots:
        out += sorted(p for p in (REPO / root).rglob("*.py") if "__pycache__" not in p.parts)
    return out


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), str(path))


def _imports_asyncio(tree: ast.Module) -> bool:
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "asyncio" for a in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "asyncio":
            return True
    return False


def _rel(path: Path) -> str:
    return path.relative_to(REPO).as_posix()


def adapter_classes() -> list[tuple[str, str, int]]:
    rows = []
    for path in _files(PROTOCOLS):
        tree = _tree(path)
        if not _imports_asyncio(tree):
            continue
        for node in tree.body:
            if isinstance(node, ast.ClassDef):
                rows.append((_rel(path), node.name, node.end_lineno - node.lineno + 1))
    return rows


def _called(func: ast.expr) -> str | None:
    if isinstance(func, ast.Attribute):
        return func.attr
    return func.id if isinstance(func, ast.Name) else None


def loops() -> list[str]:
    found = []
    for path in _files(PACKAGES):
        tree = _tree(path)
        if not _imports_asyncio(tree):
            continue          # a core draining a part of itself is not an adapter loop
        for fn in ast.walk(tree):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                if (isinstance(node, ast.While) and isinstance(node.test, ast.Compare)
                        and isinstance(node.test.left, ast.NamedExpr)
                        and isinstance(node.test.left.value, ast.Call)
                        and _called(node.test.left.value.func) == "next_event"):
                    found.append(f"{_rel(path)}:{fn.name}")
                    break
    return found


def _classes(roots):
    for path in _files(roots):
        src = path.read_text()
        tree = ast.parse(src, str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                yield path, src, node


def guards() -> list[str]:
    out = []
    for path in _files(PACKAGES):
        for node in ast.walk(_tree(path)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in GUARD_NAMES:
                out.append(f"{_rel(path)}:{node.name}")
    return out


def log_limiters() -> list[str]:
    out = []
    for path, src, node in _classes(PACKAGES):
        methods = {n.name for n in node.body if isinstance(n, ast.FunctionDef)}
        body = ast.get_source_segment(src, node) or ""
        if "allow" in methods and "suppress" in body.lower():
            out.append(f"{_rel(path)}:{node.name}")
    return out


def log_records() -> list[str]:
    out = []
    for path, _src, node in _classes(PACKAGES):
        fields = {n.target.id for n in node.body
                  if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
        if {"event", "level", "attrs"} <= fields:
            out.append(f"{_rel(path)}:{node.name}")
    return out


def test_networks() -> list[str]:
    out = []
    for path, _src, node in _classes(PACKAGES + ("tests",)):
        methods = {n.name for n in node.body if isinstance(n, ast.FunctionDef)}
        if methods & {"deliver_due", "next_delivery"}:
            out.append(f"{_rel(path)}:{node.name}")
    return out


def section() -> str:
    rows = adapter_classes()
    lines = [BEGIN, "", "Computed by `python scripts/layers_counts.py --write` (see its docstring for",
             "what counts); rerun it after a change of shape.", "",
             "| module | adapter class | lines |", "|---|---|---:|"]
    for mod, cls, n in rows:
        lines.append(f"| `{mod}` | `{cls}` | {n}{' (over 400)' if n > 400 else ''} |")
    over = [r for r in rows if r[2] > 400]
    lines += ["", f"{len(rows)} adapter classes, {len(over)} over 400 lines"
              + (": " + ", ".join(f"`{c}` {n}" for _m, c, n in over) if over else "") + ".", "",
              "| what (target: one) | count | where |", "|---|---:|---|"]
    for name, found in (("loops around a core", loops()), ("error guards", guards()),
                        ("rate-limited loggers", log_limiters()),
                        ("LogRecord classes", log_records()),
                        ("in-memory test networks", test_networks())):
        lines.append(f"| {name} | {len(found)} | {', '.join(f'`{f}`' for f in found)} |")
    lines += ["", END]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    text = section()
    if "--write" not in argv:
        print(text)
        return 0
    doc = REPO / "docs" / "layers.md"
    old = doc.read_text()
    if BEGIN in old and END in old:
        new = old[:old.index(BEGIN)] + text + old[old.index(END) + len(END):]
    else:
        new = old.rstrip("\n") + "\n\n## Shape figures\n\n" + text + "\n"
    doc.write_text(new)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
