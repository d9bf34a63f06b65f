"""Prometheus for the local cluster: relay-suite-demo starts Debian's `prometheus` binary
when it is installed (--no-prometheus skips it), points it at the nodes the launcher starts
and evaluates the rules generated from spark/sla.toml (deploy/prometheus/, docs/slo.md).

    prom = await start_local_prometheus(workdir, daemons)   # None when not installed
    ... start the daemons ...
    await prom.wait_scraping()   # every daemon scraped before traffic starts
    ... run ...
    await prom.stop()      # before the daemons stop: records what fired, then SIGTERM

What it does, all under <workdir>/prometheus/:
- prometheus.yml: deploy/prometheus/prometheus.yml with 1 s scrape and evaluation intervals
  (a demo lasts a minute), the committed rule file and file_sd over targets/*.json;
- targets/launcher.json (file-based service discovery): one target per daemon that is
  running or died unplanned, `job` = the daemon's service name from its READY line,
  `node` = its name in the launcher; rewritten (atomically, only when it changed) every
  0.5 s, so restarted daemons (new ports) are followed and a daemon stopped ON PURPOSE (a
  planned fault) leaves the targets instead of raising an alert, while one that died
  outside the plan stays a target that is down;
- the server binds 127.0.0.1 port 0; its address is read from the process's listening
  socket (psutil) and written to url.txt;
- alerts.json at stop: every alert that fired during the run (ALERTS{alertstate="firing"}
  over the whole run), each objective's SLI error ratio over the last 5 m
  (slo:sli_error:ratio_rate5m, as text: "NaN" when no event was counted) and the targets'
  last health. When a daemon died outside the plan,
  stop() first waits (at most DOWN_WAIT s) for the daemon-down alert to fire.

Errors: start_local_prometheus raises nothing when the binary is missing (returns None and
says so); a server that does not come up within `timeout` s raises LaunchError with the tail
of its log (<workdir>/prometheus/prometheus.log).
"""
from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import time
from pathlib import Path
from typing import Callable

import aiohttp
import psutil
import yaml

from daemon_runtime.daemons import Daemon, LaunchError

PROM_DIR = Path(__file__).with_name("prometheus")
RULES = PROM_DIR / "relay-suite.rules.yml"
#: seconds stop() waits for the daemon-down alert of a daemon that died outside the plan
#: (the alert's `for` is 15 s, scrapes and evaluations every second)
DOWN_WAIT = 40.0


def prometheus_binary() -> str | None:
    """Path of the `prometheus` server binary (Debian package `prometheus`), or None."""
    return shutil.which("prometheus")


def local_config(root: Path, interval: str = "1s") -> dict:
    """deploy/prometheus/prometheus.yml for a run under `root`: `interval` scrapes and rule
    evaluations, the committed rules by absolute path, file_sd over root/targets/*.json."""
    cfg = yaml.safe_load((PROM_DIR / "prometheus.yml").read_text())
    cfg["global"].update(scrape_interval=interval, evaluation_interval=interval, scrape_timeout=interval)
    cfg["rule_files"] = [str(RULES)]
    for job in cfg["scrape_configs"]:
        for sd in job.get("file_sd_configs", []):
            sd["files"] = [str(root / "targets" / "*.json")]
            sd["refresh_interval"] = "5s"
    return cfg


def targets_for(daemons: list[Daemon], host: str = "127.0.0.1") -> list[dict]:
    """file_sd target groups: one per daemon that is alive or died unplanned and has
    announced a status port; sorted by node name (stable file contents)."""
    groups = []
    for d in sorted(daemons, key=lambda d: d.name):
        if not (d.alive() or d.died()):
            continue
        port = d.info.get("status_port") or d.info.get("port")
        service = d.info.get("service")
        if not port or not service:
            continue
        groups.append({"targets": [f"{host}:{port}"], "labels": {"job": str(service), "node": d.name}})
    return groups


class LocalPrometheus:
    """One prometheus server process for a run (see the module doc)."""

    def __init__(self, binary: str, root: Path, daemons: Callable[[], list[Daemon]]):
        self.binary = binary
        self.root = root
        self.daemons = daemons
        self.proc: asyncio.subprocess.Process | None = None
        self.url: str | None = None
        self.started = time.time()
        self._written = ""
        self._task: asyncio.Task | None = None

    async def start(self, timeout: float = 30.0) -> str:
        """Write the config, start the server, wait until it is ready. Returns its URL."""
        (self.root / "targets").mkdir(parents=True, exist_ok=True)
        (self.root / "data").mkdir(exist_ok=True)
        self.write_targets()
        conf = self.root / "prometheus.yml"
        conf.write_text(yaml.safe_dump(local_config(self.root), sort_keys=False))
        log = open(self.root / "prometheus.log", "ab")
        try:
            self.proc = await asyncio.create_subprocess_exec(
                self.binary, f"--config.file={conf}", f"--storage.tsdb.path={self.root / 'data'}",
                "--web.listen-address=127.0.0.1:0", "--storage.tsdb.retention.time=1d",
                stdout=log, stderr=log, start_new_session=True)
        finally:
            log.close()
        self.started = time.time()
        deadline = time.monotonic() + timeout
        async with aiohttp.ClientSession() as http:
            while True:
                if self.proc.returncode is not None:
                    raise LaunchError(f"prometheus exited with code {self.proc.returncode}; "
                                      f"see {self.root / 'prometheus.log'}:\n{self._log_tail()}")
                port = self._listening_port()
                if port:
                    url = f"http://127.0.0.1:{port}"
                    try:
                        async with http.get(url + "/-/ready", timeout=aiohttp.ClientTimeout(total=2)) as r:
                            if r.status == 200:
                                self.url = url
                                break
                    except (aiohttp.ClientError, asyncio.TimeoutError):
                        pass
                if time.monotonic() > deadline:
                    await self._terminate()
                    raise LaunchError(f"prometheus not ready within {timeout:.0f} s; see "
                                      f"{self.root / 'prometheus.log'}:\n{self._log_tail()}")
                await asyncio.sleep(0.2)
        (self.root / "url.txt").write_text(self.url + "\n")
        self._task = asyncio.ensure_future(self._follow())
        return self.url

    def _listening_port(self) -> int | None:
        try:
            for c in psutil.Process(self.proc.pid).net_connections(kind="tcp"):
                if c.status == psutil.CONN_LISTEN and c.laddr:
                    return c.laddr.port
        except (psutil.Error, OSError):
            return None
        return None

    def _log_tail(self, lines: int = 12) -> str:
        try:
            text = (self.root / "prometheus.log").read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join("    " + x for x in text[-lines:])

    def write_targets(self) -> bool:
        """Rewrite targets/launcher.json when the daemons' targets changed (atomic rename).
        Returns True when it wrote."""
        text = json.dumps(targets_for(self.daemons()), indent=1)
        if text == self._written:
            return False
        path = self.root / "targets" / "launcher.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(text)
        os.replace(tmp, path)
        self._written = text
        return True

    async def _follow(self) -> None:
        while True:
            try:
                self.write_targets()
            except Exception as exc:  # keep following; a daemon list mid-change is retried
                print(f"prometheus: targets not written: {exc}", flush=True)
            await asyncio.sleep(0.5)

    async def wait_scraping(self, timeout: float = 30.0) -> bool:
        """Wait until every daemon in the targets file is an active target that has been
        scraped at least twice (Prometheus hands file_sd changes to its scrapers every 5 s,
        and rate() needs two samples: traffic sent before that would not be counted).
        Returns False (and says so) after `timeout` s."""
        self.write_targets()
        want = {g["labels"]["node"] for g in json.loads(self._written or "[]")}
        deadline = time.monotonic() + timeout
        seen: dict[str, int] = {}
        async with aiohttp.ClientSession() as http:
            while time.monotonic() < deadline:
                try:
                    res = await self.query(http, 'count_over_time(up{node!=""}[1m])')
                    seen = {r["metric"]["node"]: int(float(r["value"][1])) for r in res}
                except (aiohttp.ClientError, asyncio.TimeoutError, RuntimeError):
                    pass
                if all(seen.get(n, 0) >= 2 for n in want):
                    return True
                await asyncio.sleep(0.5)
        print(f"prometheus: not every target scraped after {timeout:.0f} s: "
              f"{sorted(n for n in want if seen.get(n, 0) < 2)}", flush=True)
        return False

    async def query(self, http: aiohttp.ClientSession, promql: str) -> list[dict]:
        """Instant query over the HTTP API; returns `data.result` (vector samples)."""
        async with http.get(self.url + "/api/v1/query", params={"query": promql},
                            timeout=aiohttp.ClientTimeout(total=5)) as r:
            body = await r.json()
        if body.get("status") != "success":
            raise RuntimeError(f"prometheus query {promql!r}: {body.get('error')}")
        return body["data"]["result"]

    async def fired(self, http: aiohttp.ClientSession) -> list[dict]:
        """Labels of every alert that was firing at some evaluation since start()."""
        span = max(2, int(time.time() - self.started) + 2)
        res = await self.query(http, f'max_over_time(ALERTS{{alertstate="firing"}}[{span}s])')
        return sorted((r["metric"] for r in res), key=lambda m: json.dumps(m, sort_keys=True))

    async def stop(self) -> dict:
        """Record alerts.json (waiting for the daemon-down alert when a daemon died outside
        the plan), then stop the server. Returns what alerts.json holds."""
        if self._task is not None:
            self._task.cancel()
            self._task = None
        out: dict = {"url": self.url, "fired": [], "sli_error_5m": {}, "targets": []}
        if self.url and self.proc and self.proc.returncode is None:
            try:
                self.write_targets()
                dead = sorted(d.name for d in self.daemons() if d.died())
                await asyncio.sleep(2.5)    # two more scrapes and evaluations: the run's last events
                async with aiohttp.ClientSession() as http:
                    if dead:
                        print(f"prometheus: {', '.join(dead)} died outside the plan; waiting up to "
                              f"{DOWN_WAIT:.0f} s for its alert", flush=True)
                        end = time.monotonic() + DOWN_WAIT
                        while time.monotonic() < end:
                            got = await self.query(http, 'ALERTS{alertname="RelaySuiteDaemonDown",'
                                                         'alertstate="firing"}')
                            if {m["metric"].get("node") for m in got} >= set(dead):
                                break
                            await asyncio.sleep(1.0)
                    out["fired"] = await self.fired(http)
                    out["sli_error_5m"] = {
                        r["metric"].get("slo"): r["value"][1]
                        for r in await self.query(http, "slo:sli_error:ratio_rate5m")}
                    async with http.get(self.url + "/api/v1/targets",
                                        timeout=aiohttp.ClientTimeout(total=5)) as r:
                        active = (await r.json())["data"]["activeTargets"]
                    out["targets"] = [{"node": t["labels"].get("node"), "job": t["labels"].get("job"),
                                       "health": t["health"]} for t in active]
            except (aiohttp.ClientError, asyncio.TimeoutError, RuntimeError, KeyError) as exc:
                out["error"] = f"{type(exc).__name__}: {exc}"
        await self._terminate()
        (self.root / "alerts.json").write_text(json.dumps(out, indent=1, sort_keys=True))
        names = sorted({f"{m.get('alertname')}{'(' + m['node'] + ')' if m.get('node') else ''}"
                        for m in out["fired"]})
        print(f"prometheus: alerts fired during the run: {', '.join(names) or 'none'} "
              f"({self.root / 'alerts.json'})", flush=True)
        return out

    async def _terminate(self, grace: float = 10.0) -> None:
        proc = self.proc
        if proc is None or proc.returncode is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), grace)
        except asyncio.TimeoutError:
            proc.kill()
            await proc.wait()


async def start_local_prometheus(workdir: Path, daemons: Callable[[], list[Daemon]]) -> LocalPrometheus | None:
    """Start Prometheus for a run (see the module doc); None, with a note, when the
    `prometheus` binary is not installed."""
    binary = prometheus_binary()
    if binary is None:
        print("prometheus: not installed (Debian: apt-get install prometheus); running without it", flush=True)
        return None
    prom = LocalPrometheus(binary, Path(workdir) / "prometheus", daemons)
    url = await prom.start()
    print(f"prometheus: {url} (targets: {prom.root / 'targets'}; rules: {RULES.name})", flush=True)
    return prom
