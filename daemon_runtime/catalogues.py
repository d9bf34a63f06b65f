"""Every protocol's event catalogue in one place, for the Spark schema and the docs.

    all_catalogues() -> [RMB_EVENTS, RELAY_EVENTS, REMP_EVENTS, MARLIN_EVENTS, DEMO_EVENTS]
    render_markdown() -> the text of docs/event-catalogue.md (a test keeps the file in sync:
                         regenerate with `python -m daemon_runtime.catalogues > docs/event-catalogue.md`)
"""
from __future__ import annotations

from daemon_runtime.eventlog import LINE_FIELDS, Catalogue, attr_types


def all_catalogues() -> list[Catalogue]:
    from marlin_cluster.events import MARLIN_EVENTS
    from remp_node.events import REMP_EVENTS
    from deploy.events import DEMO_EVENTS
    from rmb_peer.events import RMB_EVENTS
    from rmb_relay.events import RELAY_EVENTS
    return [RMB_EVENTS, RELAY_EVENTS, REMP_EVENTS, MARLIN_EVENTS, DEMO_EVENTS]


def render_markdown() -> str:
    cats = all_catalogues()
    out = ["# Event catalogue", "",
           "Generated from the catalogues in code (`python -m daemon_runtime.catalogues`); "
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
