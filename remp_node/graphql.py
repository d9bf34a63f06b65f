"""GraphQL in the shape of ever-q-server's REMP API (strawberry-graphql, aiohttp view,
graphql-transport-ws and graphql-ws subscription protocols), mounted at /graphql.

Schema (ever-q-server `src/server/graphql/remp.ts`: type RempReceipt {kind, messageId,
timestamp, json}; the sdk's `postRequests(requests: [{id, body}])`):

    type Query { info: Info }                       # q-server has it; version only here
    type Mutation { postRequests(requests: [Request!]!, accessKey: String): [String!]! }
    input Request { id: String, body: String!, expireAt: Float }
    type Subscription { rempReceipts(messageId: String!): RempReceipt! }
    type RempReceipt { kind: RempReceiptKind!, messageId: String!, timestamp: Float!, json: String! }

`postRequests`: body = base64 BOC; returns the message ids (64 hex digits) in request order;
a refused message (undecodable, RejectedByFullnode) raises a GraphQL error naming the
request index and the reason (its status is still kept for GET /messages/{id}).
`rempReceipts(messageId)`: every status of the message so far, then new ones, ending after
the final status; a malformed id is refused with an error ("message id must be 64 hex
digits"). `kind` is an enum of the JSON kinds (seed: remp-protocol-b).
"""
from __future__ import annotations

import base64
import binascii
import enum
import json
from typing import AsyncGenerator, Optional

import strawberry
from aiohttp import web
from strawberry.aiohttp.views import GraphQLView
from strawberry.subscriptions import GRAPHQL_TRANSPORT_WS_PROTOCOL, GRAPHQL_WS_PROTOCOL

from .api import ApiError, parse_message_id

__all__ = ["build_schema", "add_graphql_route"]


@strawberry.enum
class RempReceiptKind(enum.Enum):
    SentToValidators = "SentToValidators"
    RejectedByFullnode = "RejectedByFullnode"
    PutIntoQueue = "PutIntoQueue"
    AcceptedByQueue = "AcceptedByQueue"
    RejectedByQueue = "RejectedByQueue"
    Duplicate = "Duplicate"
    IncludedIntoBlock = "IncludedIntoBlock"
    RejectedByCollator = "RejectedByCollator"
    IgnoredByCollator = "IgnoredByCollator"
    IncludedIntoAcceptedBlock = "IncludedIntoAcceptedBlock"
    RejectedByShardchain = "RejectedByShardchain"
    IgnoredByShardchain = "IgnoredByShardchain"
    Finalized = "Finalized"
    RejectedByMasterchain = "RejectedByMasterchain"
    IgnoredByMasterchain = "IgnoredByMasterchain"
    Timeout = "Timeout"
    Other = "Other"


@strawberry.type
class RempReceipt:
    kind: RempReceiptKind
    messageId: str
    timestamp: float
    json: str


@strawberry.input
class Request:
    body: str
    id: Optional[str] = None
    expireAt: Optional[float] = None


@strawberry.type
class Info:
    version: str


def _receipt(d: dict) -> RempReceipt:
    try:
        kind = RempReceiptKind(d.get("kind"))
    except ValueError:
        kind = RempReceiptKind.Other
    return RempReceipt(kind=kind, messageId=d["message_id"], timestamp=float(d["timestamp"]),
                       json=json.dumps(d, separators=(",", ":")))


def build_schema(daemon) -> strawberry.Schema:
    hub = daemon.hub

    @strawberry.type
    class Query:
        @strawberry.field
        def info(self) -> Info:
            return Info(version="relay-suite remp-node 0.1")

    @strawberry.type
    class Mutation:
        @strawberry.mutation
        def postRequests(self, requests: list[Request], accessKey: Optional[str] = None) -> list[str]:
            ids = []
            for i, r in enumerate(requests):
                try:
                    boc = base64.b64decode(r.body, validate=True)
                except (binascii.Error, ValueError):
                    hub.m_refused.labels("undecodable").inc()
                    raise ValueError(f"request {i}: body is not base64") from None
                status, doc = hub.submit(boc)
                if status >= 400:
                    raise ValueError(f"request {i}: {doc.get('kind', 'refused')}: "
                                     f"{doc.get('reason') or doc.get('error')}")
                ids.append(doc["message_id"])
            return ids

    @strawberry.type
    class Subscription:
        @strawberry.subscription
        async def rempReceipts(self, messageId: str) -> AsyncGenerator[RempReceipt, None]:
            try:
                mid = parse_message_id(messageId)
            except ApiError as exc:
                hub.m_refused.labels("bad_id").inc()
                raise ValueError(str(exc)) from None
            q = hub.subscribe(mid)
            try:
                while True:
                    kind, d = await q.get()
                    if kind == "final":
                        return
                    yield _receipt(d)
            finally:
                hub.unsubscribe(mid, q)

    return strawberry.Schema(query=Query, mutation=Mutation, subscription=Subscription)


def add_graphql_route(app: web.Application, daemon) -> None:
    view = GraphQLView(schema=build_schema(daemon), graphql_ide=None,
                       subscription_protocols=[GRAPHQL_TRANSPORT_WS_PROTOCOL, GRAPHQL_WS_PROTOCOL])
    app.router.add_route("*", "/graphql", view)
