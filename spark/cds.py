"""A class-data-sharing archive (AppCDS) for the report's driver JVM.

A short report (the demo's logs) spends most of its JVM CPU loading, parsing and verifying
~24,000 classes from Spark's ~300 jars. A dynamic CDS archive (JDK 13+,
`-XX:ArchiveClassesAtExit` once, then `-XX:SharedArchiveFile`) holds them pre-parsed and
pre-verified: measured on the demo's logs, JVM CPU 28-33 s -> 19-23 s
(docs/report-performance.md).

    .venv/bin/python -m spark.cds [--force] [LOGS...]   # build it (scripts/setup.sh does this)
    .venv/bin/python -m spark.cds --path                 # print where it is (or would be)

The archive is built ONCE by an explicit step, never as a side effect of a report: a
report run over training logs (LOGS, default: 3,000 generated events, bench/gen_eventlog.py)
in a child process whose JVM writes the archive at exit; the child waits for its JVM to exit,
and the file is renamed into place only when complete (a truncated archive crashes the JVM
with SIGBUS, so a half-written one must never be at the final path). Readers only ever see
a complete file or none.

Where: RELAY_TRACE_CDS_DIR, else `<sys.prefix>/share/relay-suite` (the venv: it goes away
with the venv whose pyspark it was made for), file `spark-<key>.jsa` (~190 MB), the key a
hash of the java binary (path, size, mtime), the pyspark version and its jar names, so a
new JDK or Spark simply looks for another file. RELAY_TRACE_CDS=0 turns its use off. Used
only for short jobs (report.SHORT_JOB_JVM_OPTS), when the report starts the JVM itself; a
JVM that cannot use it (e.g. another class path) says so in one warning line and runs
without it.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _java() -> str | None:
    home = os.environ.get("JAVA_HOME")
    if home and Path(home, "bin", "java").exists():
        return str(Path(home, "bin", "java"))
    return shutil.which("java")


def archive_path() -> Path | None:
    """Where the archive for this JDK and this pyspark is (whether or not it exists); None
    without Java."""
    java = _java()
    if java is None:
        return None
    import pyspark
    real = os.path.realpath(java)
    st = os.stat(real)
    jars = Path(pyspark.__file__).parent / "jars"
    names = sorted(p.name for p in jars.glob("*.jar")) if jars.is_dir() else []
    key = hashlib.sha256("\n".join(
        [real, str(st.st_size), str(int(st.st_mtime)), pyspark.__version__, *names]).encode()
    ).hexdigest()[:16]
    base = os.environ.get("RELAY_TRACE_CDS_DIR") or os.path.join(sys.prefix, "share", "relay-suite")
    return Path(base) / f"spark-{key}.jsa"


def java_opts() -> str:
    """`-XX:SharedArchiveFile=...` when the archive exists and its use is not turned off,
    else ""."""
    if os.environ.get("RELAY_TRACE_CDS", "1") in ("0", "off", "false", "no"):
        return ""
    path = archive_path()
    if path is None or not path.is_file():
        return ""
    return f"-XX:SharedArchiveFile={path}"


def _train(inputs: list[str], out: str, archive: str) -> int:
    """In the child: one report with the short-job JVM options plus ArchiveClassesAtExit,
    then wait until the JVM has exited (it writes the archive on exit)."""
    from pyspark import SparkContext
    from spark import report
    os.environ["RELAY_TRACE_CDS"] = "0"   # never map an archive while dumping one
    os.environ["PYSPARK_SUBMIT_ARGS"] = (
        f'--driver-java-options "-Dlog4j2.configurationFile=file:{report.LOG4J2} '
        f'{report.SHORT_JOB_JVM_OPTS} -XX:ArchiveClassesAtExit={archive} -Xlog:cds=off '
        f'-Xlog:cds+dynamic=off" pyspark-shell')
    report.run(inputs, out)
    gw = SparkContext._gateway
    proc = getattr(gw, "proc", None) if gw is not None else None
    if proc is None:
        return 1
    proc.stdin.close()                     # PythonGatewayServer exits on EOF
    return proc.wait(timeout=600)


def build(inputs: list[str] | None = None, force: bool = False) -> Path | None:
    """Build the archive (see module doc); returns its path, None without Java. Existing
    archive kept unless force."""
    path = archive_path()
    if path is None:
        return None
    if path.is_file() and not force:
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="relay-cds-") as tmp:
        if not inputs:
            sys.path.insert(0, str(REPO / "bench"))
            from gen_eventlog import generate
            generate(Path(tmp, "logs"), 3000)
            inputs = sorted(str(p) for p in Path(tmp, "logs").glob("*.jsonl"))
        part = path.with_name(f".{path.name}.{os.getpid()}.part")
        t = time.time()
        rc = subprocess.run([sys.executable, "-m", "spark.cds", "--child", str(part),
                             str(Path(tmp, "out")), *inputs], cwd=str(REPO)).returncode
        if rc != 0 or not part.is_file() or part.stat().st_size == 0:
            part.unlink(missing_ok=True)
            raise RuntimeError(f"building the CDS archive failed (rc {rc})")
        os.replace(part, path)             # complete file, atomically
        print(f"spark.cds: {path} ({path.stat().st_size / 1e6:.0f} MB, {time.time() - t:.0f} s)")
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m spark.cds", description=__doc__.split("\n")[0])
    ap.add_argument("inputs", nargs="*", help="training logs (default: 3,000 generated events)")
    ap.add_argument("--force", action="store_true", help="rebuild even if it exists")
    ap.add_argument("--path", action="store_true", help="print the archive's path and exit")
    ap.add_argument("--child", nargs=2, metavar=("ARCHIVE", "OUT"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        return _train(args.inputs, args.child[1], args.child[0])
    if args.path:
        print(archive_path() or "no java")
        return 0
    return 0 if build(args.inputs or None, args.force) else 1


if __name__ == "__main__":
    sys.exit(main())
