"""The project's files say nothing a reader of the repository cannot check: no path of the
machine some work was done on, no citation of an issue tracker the reader cannot see, no
narrative of work sessions. Sources are the seeds, the reference implementations and
DESIGN.md; why a figure or a rule changed belongs in the commit message.

What is refused, in every git-tracked text file (this file excepted: it holds the patterns):
- machine paths: a path under /work/, /root/, /home/<user>/, /Users/<user>/, and scratch
  files in /tmp that only one machine had (`/tmp/<...>.lock`, `/tmp/<...>.py`). Default
  scratch directories a tool creates (`--dir /tmp/relay-bench`) are allowed.
- issue-number citations: "issue" or "issues" followed by a number (with or without `#`,
  `-` or a line break between), "#<n> finding|item|build|must-show", "PR #<n>".
  Allowed: RFC and BIP numbers, and links to upstream projects' trackers as sources
  (`https://github.com/<owner>/<repo>/issues/<n>`), which anyone can open.
- work-session narrative: a session or round "of <date>", "before/after this round",
  "what changed this session", "this round's tree", "(branch `x` after <commit>)",
  "scratch worktree", "filed by a session", team labels such as "REMP-A's" and "engineer".
  The protocol's own rounds and sessions ("in this round it precommits nil", "the previous
  session's group") are allowed.
"""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SELF = Path(__file__).resolve().relative_to(REPO).as_posix()

_NOT_PATH = r"(?<![\w.~$-])"          # a path starts the word: not "example.com/work/x"
MACHINE_PATH = re.compile(
    _NOT_PATH + r"(?:/work/|/root/|/home/[a-z_][\w.-]*/|/Users/[A-Za-z][\w.-]*/"
    r"|/tmp/[\w./-]*\.(?:lock|py)\b)")
ISSUE = re.compile(
    r"\bissues?[ \t]*(?:\r?\n[ \t#*>/-]*)?[-_]?[ \t]*(?:no\.?[ \t]*)?#?\d+(?![\w/])"
    r"|(?<![\w&/#])#\d+'?s?[ \t]+(?:finding|item|build|must[- ]show)"
    r"|\b(?:PR|pull request)[ \t]*#\d+",
    re.IGNORECASE)
NARRATIVE = re.compile(
    r"\b(?:session|round)s?[ \t]+of[ \t]+20\d\d-\d\d-\d\d"
    r"|\b(?:before|after|during)[ \t]+this[ \t]+(?:round|session)\b"
    r"|\bwhat[ \t]+changed[ \t]+(?:this|that)[ \t]+(?:round|session)\b"
    r"|\bthis[ \t]+(?:round|session)'s[ \t]+(?:tree|trees|branch|code|changes?)\b"
    r"|\(branch[ \t]+`[\w-]+`[ \t]+after\b"
    r"|\bscratch[ \t]+(?:work)?tree\b"
    r"|\bfiled[ \t]+by[ \t]+a[ \t]+session\b"
    r"|\b(?:REMP|RMB|Marlin|Spark)-[A-D]\b"
    r"|\bengineers?\b",
    re.IGNORECASE)
CHECKS = (("machine path", MACHINE_PATH), ("issue citation", ISSUE), ("session narrative", NARRATIVE))
#: (file, matched text) pairs waiting for their file's owner to land a change that removes
#: them; each entry must still match (a stale entry fails), so the list only shrinks
PENDING: set[tuple[str, str]] = set()


def findings(text: str) -> list[tuple[int, str, str]]:
    """(line number, kind, matched text) for every refused passage of `text`."""
    out = []
    for kind, rx in CHECKS:
        for m in rx.finditer(text):
            out.append((text.count("\n", 0, m.start()) + 1, kind, m.group(0).replace("\n", " ")))
    return sorted(out)


def tracked_files() -> list[str]:
    try:
        out = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z"], capture_output=True,
                             timeout=60)
    except (OSError, subprocess.SubprocessError):
        out = None
    if out is None or out.returncode != 0:
        pytest.skip("not a git checkout: no tracked files to check")
    return [p for p in out.stdout.decode().split("\0") if p]


def test_tracked_files_cite_no_machine_issue_or_session():
    bad, pending_seen = [], set()
    for rel in tracked_files():
        if rel == SELF:
            continue
        path = REPO / rel
        try:
            data = path.read_bytes()
        except OSError:                                  # deleted in the work tree, not staged
            continue
        if b"\0" in data[:8192]:                         # binary
            continue
        text = data.decode("utf-8", errors="replace")
        for line, kind, hit in findings(text):
            if (rel, hit) in PENDING:
                pending_seen.add((rel, hit))
                continue
            bad.append(f"{rel}:{line}: {kind}: {hit!r}")
    assert not bad, (f"{len(bad)} passages cite a machine path, an issue number or a work "
                     "session (cite the seeds, the reference implementations or DESIGN.md; "
                     "put history in commit messages):\n" + "\n".join(bad[:80]))
    assert pending_seen == PENDING, f"fixed, drop from PENDING: {sorted(PENDING - pending_seen)}"


I = "issue"     # the examples are assembled so this file's own text stays clean


@pytest.mark.parametrize("text", [
    "flock " + "/work/bench.lock python bench/x.py",
    "PYSPARK_PYTHON=" + "/work/main/.venv/bin/python",
    "see " + "/home/alice/notes.txt", "cd " + "/root/src", "lock at " + "/tmp/bench.lock",
    "/tmp/" + "spk-cmp.py compares the tables",
    f"Source: {I} 8 item 3", f"({I} #11 finding 7)", f"the {I}-#8 aim", f"{I}s 8 and 9",
    f"(see {I}\n   #10 item 4)", "(#11 finding 4)", "#9 must-show 5", "fixed in PR #12",
    "Round of " + "2026-11-27, 14:26 UTC", "session of " + "2026-11-26 17:00",
    "what changed this " + "round:", "before this " + "round the bench", "this round" + "'s tree",
    "(branch `remp` " + "after b4083f9)", "main in a scratch " + "worktree", "REMP" + "-A's client",
    "The REMP owner " + "engineer",
])
def test_refused(text):
    assert findings(text), text


@pytest.mark.parametrize("text", [
    "ed25519 per RFC 8032 and BIP 39 mnemonics",
    "upstream: https://github.com/threefoldtech/rmb-rs/" + I + "s/123 (the reference's tracker)",
    "possible any more in this round (or at the deadline) it precommits nil",
    "members = current group + previous session's group",
    "--dir /tmp/relay-bench", "tempfile in /tmp/", "https://example.com/work/x",
    "an envelope with an issued token #3", "the tissue 4", "color: #1234ff;", "&#39;",
    "rmb_relay/daemon.py keeps state per session", "queue per work item",
])
def test_allowed(text):
    assert not findings(text), findings(text)


#: pages other parts of the tree are adding; links to them may come before the pages do
FORTHCOMING = {"docs/remp-fullnode.md", "docs/rmb-operations.md", "docs/marlin-operations.md",
               "docs/testnet.md", "docs/slo.md"}
_LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)\s]*)?\)")


def test_documentation_links_resolve():
    """Every relative link of README.md and docs/*.md names a file of the tree."""
    pages = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    broken = []
    for page in pages:
        for target in _LINK.findall(page.read_text()):
            if re.match(r"[a-z]+:", target):                  # http:, https:, mailto:
                continue
            path = (page.parent / target).resolve()
            rel = path.relative_to(REPO).as_posix() if path.is_relative_to(REPO) else str(path)
            if not path.exists() and rel not in FORTHCOMING:
                broken.append(f"{page.relative_to(REPO)} -> {target}")
    assert not broken, "broken links:\n" + "\n".join(broken)
