"""The one list of every event catalogue, for the Spark read schema (spark/schema.py) and
the generated docs (docs/event-catalogue.md).

Each protocol package declares its own catalogue next to the code that emits it (DESIGN.md
section 6: rmb_peer/events.py, rmb_relay/events.py, remp_node/events.py,
marlin_cluster/events.py; the launcher's plan events in deploy/events.py); this module, in
the top layer, lists them, so daemon_runtime (below every protocol) never imports one.

    CATALOGUES = (RMB_EVENTS, RELAY_EVENTS, REMP_EVENTS, MARLIN_EVENTS, DEMO_EVENTS)
    all_catalogues() -> list(CATALOGUES)
    render_markdown() -> the text of docs/event-catalogue.md (a test keeps the file in sync:
                         regenerate with `python -m deploy.catalogues > docs/event-catalogue.md`)
"""
from __future__ import annotations

from daemon_runtime.eventlog import LINE_FIELDS, Catalogue, attr_types
from deploy.events import DEMO_EVENTS
from marlin_cluster.events import MARLIN_EVENTS
from remp_node.events import REMP_EVENTS
from rmb_peer.events import RMB_EVENTS
from rmb_relay.events import RELAY_EVENTS

#: every catalogue, in the order of docs/event-catalogue.md
CATALOGUES: tuple[Catalogue, ...] = (RMB_EVENTS, RELAY_EVENTS, REMP_EVENTS, MARLIN_EVENTS, DEMO_EVENTS)


def all_catalogues() -> list[Catalogue]:
    """Every catalogue (a new list: callers may extend it)."""
    return list(CATALOGUES)


def render_markdown() -> str:
    cats = all_catalogues()
    out = ["# Event catalogue", "",
           "Generated from the catalogues in code (`python -m deploy.catalogues`); "
           "the schema of each line is in [event-log.md](event-log.md).", "",
           "Line fields: " + ", ".join(f"`{k}` ({t})" for k, t in LINE_FIELDS) + ".", ""]
    for cat in cats:
        out += [f"## {cat.protocol}", "", "| event | when | attrs |", "|---|---|---|"]
        for spec in cat:
            attrs = ", ".join(f"`{k}`: {t}" for k, t in spec.attrs.items()) or "-"
            out.append(f"| `{spec.name}` | {spec.doc} | {attrs} |")
        out.append("")
    out += ["## Attribute types (one type per name across all protocols)", "",
            "| attr | type |", "|---|---|"]
    out += [f"| `{k}` | {t} |" for k, t in sorted(attr_types(cats).items())]
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    print(render_markdown(), end="")
