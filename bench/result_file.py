"""One JSON result per benchmark run, written to `bench/results/` (the data behind
docs/benchmarks.md, which `scripts/benchmarks_table.py` regenerates from these files).

A bench script calls, at the end of its main::

    from result_file import write_result          # bench/ is sys.path[0] when run as a script
    write_result("remp_daemon", {"first_receipt_p50_ms@100": 24.4, ...},
                 baseline={"udp_round_trip_ms": 0.11}, ratio={"...": 0.17})

and gets `bench/results/<name>-<UTC timestamp>.json`::

    {"name", "command", "commit", "date", "cores", "load_average",
     "figures", "baseline", "ratio", "source", "notes"}

- `figures`, `baseline`, `ratio`: flat dicts, name -> number (int/float), string or None.
  Put the unit in the name (`_ms`, `_us`, `_per_s`, `_mib_s`, `_s`, `_gb`); a figure
  measured at a parameter may say so after `@` (`p99_ms@100/s`). Keys keep their order.
- `command`: the command line (`sys.argv`, or `argv` when given), with the interpreter's
  path written as `python` and any absolute path inside the repository made relative, so
  no machine's paths end up in the committed file.
- `commit`: `git rev-parse HEAD` of the tree the script ran from, `+dirty` when tracked
  files differ from it (`git status --porcelain --untracked-files=no`); None outside git.
- `date`: UTC, ISO 8601 to the second. `cores`: `os.cpu_count()` and the cores this
  process may run on. `load_average`: the 1, 5 and 15 minute load averages when the
  result is written (the 5 and 15 minute figures cover most runs).
- `source`: "measured" for a run, or e.g. "converted from earlier prose" for figures
  typed in from older documentation (with the commit they were read from).

`RELAY_BENCH_RESULTS=DIR` writes elsewhere; `RELAY_BENCH_RESULTS=off` writes nothing.
Errors: ValueError for a name that is not `[a-z0-9_]+` or a value that is not a number,
string, bool or None (so a result always loads back the same). Writing never raises for
git being absent: commit is then None.
"""
from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RESULTS_DIR = REPO / "bench" / "results"
_NAME = re.compile(r"[a-z0-9_]+")


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True,
                             timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def current_commit() -> str | None:
    """`git rev-parse HEAD` of this tree, with `+dirty` when tracked files were changed."""
    head = _git("rev-parse", "HEAD")
    if not head:
        return None
    status = _git("status", "--porcelain", "--untracked-files=no")
    return head + ("+dirty" if status else "")


#: absolute paths that name one machine's layout (home and work directories): written as
#: `<path>/<last part>` in a result's command
_MACHINE_DIRS = tuple("/" + d + "/" for d in ("work", "root", "home", "Users"))


def _clean_path(word: str) -> str:
    try:
        p = Path(word)
        if not p.is_absolute():
            return word
        if p.resolve().is_relative_to(REPO):
            return str(p.resolve().relative_to(REPO)) or "."
    except (OSError, ValueError):
        return word
    return f"<path>/{p.name}" if word.startswith(_MACHINE_DIRS) else word


def clean_command(argv: list[str]) -> str:
    """The command line with the interpreter as `python`, repository paths relative and
    other home or work directories elided (`--flag=PATH` included)."""
    words = []
    for i, word in enumerate(argv):
        if i == 0 and word == sys.executable:
            word = "python"
        elif word.startswith("--") and "=" in word:
            flag, _, value = word.partition("=")
            word = f"{flag}={_clean_path(value)}"
        else:
            word = _clean_path(word)
        words.append(word)
    if words and words[0].endswith(".py") and words[0] != "python":
        words.insert(0, "python")
    return " ".join(words)


def _check(kind: str, d: dict | None) -> dict | None:
    if d is None:
        return None
    out = {}
    for k, v in d.items():
        if isinstance(v, float) and not math.isfinite(v):
            v = None
        if not (v is None or isinstance(v, (int, float, str, bool))):
            raise ValueError(f"{kind}[{k!r}] is {type(v).__name__}, not a number or string")
        out[str(k)] = round(v, 6) if isinstance(v, float) else v
    return out


def build_result(name: str, figures: dict, baseline: dict | None = None,
                 ratio: dict | None = None, argv: list[str] | None = None, *,
                 source: str = "measured", notes: str | None = None,
                 commit: str | None = None, date: str | None = None) -> dict:
    """The result as a dict (what `write_result` writes); see the module docstring."""
    if not _NAME.fullmatch(name):
        raise ValueError(f"benchmark name {name!r} is not [a-z0-9_]+")
    try:
        cores_usable = len(os.sched_getaffinity(0))
    except AttributeError:                                   # not on Linux
        cores_usable = os.cpu_count()
    try:
        load = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        load = None
    return {
        "name": name,
        "command": clean_command(list(sys.argv if argv is None else argv)),
        "commit": commit if commit is not None else current_commit(),
        "date": date or datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "cores": {"count": os.cpu_count(), "usable": cores_usable},
        "load_average": load,
        "figures": _check("figures", figures),
        "baseline": _check("baseline", baseline),
        "ratio": _check("ratio", ratio),
        "source": source,
        "notes": notes,
    }


def write_result(name: str, figures: dict, baseline: dict | None = None,
                 ratio: dict | None = None, argv: list[str] | None = None, **kw) -> Path | None:
    """Write one result file and return its path (None when RELAY_BENCH_RESULTS=off).
    Prints the path on stderr so the run's output says where its figures went."""
    where = os.environ.get("RELAY_BENCH_RESULTS", "")
    if where.lower() == "off":
        return None
    result = build_result(name, figures, baseline, ratio, argv, **kw)
    out_dir = Path(where) if where else RESULTS_DIR
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = result["date"].replace("-", "").replace(":", "")
    path = out_dir / f"{name}-{stamp}.json"
    n = 1
    while path.exists():                                     # two results in one second
        n += 1
        path = out_dir / f"{name}-{stamp}-{n}.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    try:
        shown = path.resolve().relative_to(REPO)
    except ValueError:
        shown = path
    print(f"result: {shown}", file=sys.stderr)
    return path
