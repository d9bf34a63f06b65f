"""spark/cds.py: which class-data-sharing archive a short report's JVM maps, and when none."""
from __future__ import annotations

import pytest

from spark import cds


@pytest.fixture
def cds_dir(tmp_path, monkeypatch):
    if cds.archive_path() is None:
        pytest.skip("no java")
    monkeypatch.setenv("RELAY_TRACE_CDS_DIR", str(tmp_path))
    monkeypatch.delenv("RELAY_TRACE_CDS", raising=False)
    return tmp_path


def test_no_archive_no_option(cds_dir):
    path = cds.archive_path()
    assert path.parent == cds_dir and path.name.startswith("spark-") and path.suffix == ".jsa"
    assert cds.java_opts() == ""


def test_a_complete_archive_is_mapped_unless_turned_off(cds_dir, monkeypatch):
    path = cds.archive_path()
    path.write_bytes(b"x")          # only existence is checked here; the JVM validates it
    assert cds.java_opts() == f"-XX:SharedArchiveFile={path}"
    monkeypatch.setenv("RELAY_TRACE_CDS", "0")
    assert cds.java_opts() == ""


def test_a_partial_build_is_never_at_the_final_path(cds_dir):
    # the builder writes `.<name>.<pid>.part` and renames it when the JVM has exited
    path = cds.archive_path()
    path.with_name(f".{path.name}.123.part").write_bytes(b"half")
    assert cds.java_opts() == ""


def test_the_short_job_options_carry_the_archive(cds_dir):
    from spark import report
    assert report._short_job_opts() == report.SHORT_JOB_JVM_OPTS
    cds.archive_path().write_bytes(b"x")
    assert report._short_job_opts().endswith(f"-XX:SharedArchiveFile={cds.archive_path()}")
