"""Screenshot of a trace report page (report.html) in headless Chromium, saved as a PNG.

    .venv/bin/python scripts/report_screenshot.py out/demo/<run>/report/report.html shot.png
        [--width 1400] [--height 4000] [--chromium PATH]

Chromium: Debian's `chromium` (apt-get install -y chromium) or `chromium-browser`, found on
PATH unless --chromium is given. Runs with a throwaway profile and no network services.
Exit 0 and prints the PNG path; exit 2 with one line when Chromium is missing or fails.
"""
from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path


def find_chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


def screenshot(html: Path, png: Path, width: int = 1400, height: int = 4000,
               chromium: str | None = None, timeout_s: float = 120.0) -> Path:
    """Render `html` to `png`. Raises FileNotFoundError (no Chromium / no page) or
    RuntimeError (Chromium failed or wrote no PNG)."""
    exe = chromium or find_chromium()
    if exe is None:
        raise FileNotFoundError("chromium not found on PATH (apt-get install -y chromium)")
    html = Path(html).resolve()
    if not html.is_file():
        raise FileNotFoundError(f"no page at {html}")
    png = Path(png).resolve()
    png.unlink(missing_ok=True)
    with tempfile.TemporaryDirectory(prefix="report-shot-") as profile:
        cmd = [exe, "--headless", "--no-sandbox", "--disable-gpu",
               "--disable-background-networking", "--disable-component-update",
               "--disable-sync", "--no-first-run", f"--user-data-dir={profile}",
               f"--screenshot={png}", f"--window-size={width},{height}",
               "--hide-scrollbars", html.as_uri()]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    if not png.is_file() or png.stat().st_size == 0:
        raise RuntimeError(f"chromium wrote no screenshot (exit {proc.returncode}): "
                           f"{proc.stderr.strip()[-500:]}")
    return png


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("html")
    ap.add_argument("png")
    ap.add_argument("--width", type=int, default=1400)
    ap.add_argument("--height", type=int, default=4000)
    ap.add_argument("--chromium", default=None)
    args = ap.parse_args(argv)
    try:
        print(screenshot(Path(args.html), Path(args.png), args.width, args.height, args.chromium))
    except (FileNotFoundError, RuntimeError, subprocess.TimeoutExpired) as e:
        print(f"report_screenshot: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
