"""Typed daemon configuration: a TOML file, then environment variables, then CLI flags
(flags win), all declared once on an argparse parser so `--help` documents every option.

    parser = argparse.ArgumentParser(prog="rmb-relay", description=...)
    parser.add_argument("--domain", action="append", help=...)
    add_common_args(parser)
    args = load_args(parser, argv, env_prefix="RMB_RELAY_")

Precedence (lowest to highest): the parser's defaults < the `--config` TOML file (keys are
flag names without dashes, `-` or `_` both accepted, e.g. `ranker-period = 1800`) <
environment variables (env_prefix + dest upper-cased, e.g. RMB_RELAY_RANKER_PERIOD=1800;
repeatable/list options take a comma- or space-separated value) < command-line flags.

Errors: an unknown key in the file, or a value the option's type refuses, exits with
status 2 and a message naming the key (argparse's error path) — a daemon never starts on a
half-understood config.
"""
from __future__ import annotations

import argparse
import os
import shlex
import tomllib
from typing import Any, Sequence

LOG_LEVELS = ("debug", "info", "warning", "error")


def add_common_args(parser: argparse.ArgumentParser) -> None:
    """Adds --config, --log and --log-level (every daemon has them)."""
    g = parser.add_argument_group("common")
    g.add_argument("--config", metavar="FILE",
                   help="TOML file of option defaults (keys are flag names); env vars and flags override it")
    g.add_argument("--log", metavar="PATH", default="-",
                   help="where the JSON-lines event log goes: a file path (rotated by size) or '-' for stdout (default)")
    g.add_argument("--log-level", choices=LOG_LEVELS, default="info",
                   help="lowest event level written (default: info)")


def _actions(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {a.dest: a for a in parser._actions if a.dest not in ("help", argparse.SUPPRESS)}


def _convert(parser: argparse.ArgumentParser, action: argparse.Action, source: str, raw: Any) -> Any:
    """Converts a file/env value with the action's own type, nargs and choices."""
    many = action.nargs not in (None, "?", 0) or isinstance(action, argparse._AppendAction)
    if isinstance(action, argparse._ExtendAction):
        many = True
    if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
        if isinstance(raw, str):
            low = raw.strip().lower()
            if low not in ("1", "0", "true", "false", "yes", "no", "on", "off"):
                parser.error(f"{source}: expected a boolean, got {raw!r}")
            raw = low in ("1", "true", "yes", "on")
        if not isinstance(raw, bool):
            parser.error(f"{source}: expected a boolean, got {raw!r}")
        return raw
    if many:
        if isinstance(raw, str):
            raw = shlex.split(raw.replace(",", " "))
        elif not isinstance(raw, list):
            raw = [raw]
        values = [_one(parser, action, source, v) for v in raw]
        if (isinstance(action, argparse._AppendAction) and not isinstance(action, argparse._ExtendAction)
                and action.nargs not in (None, "?")):
            # append + nargs=N: a list of groups; accept one flat group from file/env
            return [values]
        return values
    return _one(parser, action, source, raw)


def _one(parser, action, source, raw):
    value = raw
    if action.type is not None and not (isinstance(raw, action.type) if isinstance(action.type, type) else False):
        try:
            value = action.type(raw if not isinstance(raw, (int, float, bool)) else str(raw)) \
                if action.type in (int, float) else action.type(raw)
        except (TypeError, ValueError, argparse.ArgumentTypeError) as exc:
            parser.error(f"{source}: {exc}")
    if action.choices is not None and value not in action.choices:
        parser.error(f"{source}: {value!r} is not one of {list(action.choices)}")
    return value


def load_args(parser: argparse.ArgumentParser, argv: Sequence[str] | None, env_prefix: str) -> argparse.Namespace:
    """Parses argv with file and env defaults applied first (see module docstring)."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--config")
    known, _ = pre.parse_known_args(argv)
    actions = _actions(parser)
    defaults: dict[str, Any] = {}
    if known.config:
        try:
            with open(known.config, "rb") as fh:
                table = tomllib.load(fh)
        except (OSError, tomllib.TOMLDecodeError) as exc:
            parser.error(f"--config {known.config}: {exc}")
        for key, raw in table.items():
            dest = key.replace("-", "_")
            if dest not in actions or dest == "config":
                parser.error(f"--config {known.config}: unknown option {key!r}")
            defaults[dest] = _convert(parser, actions[dest], f"{known.config}: {key}", raw)
    for dest, action in actions.items():
        name = env_prefix + dest.upper()
        if dest != "config" and name in os.environ:
            defaults[dest] = _convert(parser, action, f"${name}", os.environ[name])
    # Repeatable options (append/extend) would otherwise add the CLI values to the file's:
    # parse them with no default and fall back to the file/env value only when the
    # command line gave none, so flags replace rather than extend.
    lists = {d: v for d, v in defaults.items()
             if isinstance(actions[d], (argparse._AppendAction, argparse._ExtendAction))}
    parser.set_defaults(**{**defaults, **{d: None for d in lists}})
    args = parser.parse_args(argv)
    for dest, value in lists.items():
        if getattr(args, dest) is None:
            setattr(args, dest, value)
    return args
