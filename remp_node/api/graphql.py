"""GraphQL in the shape of ever-q-server's REMP API (strawberry-graphql, aiohttp view,
graphql-transport-ws and graphql-ws subscription protocols), mounted at /graphql.

Schema (ever-q-server `src/server/graphql/remp.ts`: type RempReceipt {kind, messageId,
timestamp, json}; the sdk's `postRequests(requests: [{id, body}])`):

    type Query { info: Info }                       # q-server has it; version only here
    type Mutation { postRequests(requests: [Request!]!, accessKey: String): [String!]! }
    input Request { id: String, body: String!, expireAt: Float }
    type Subscription { rempReceipts(messageId: String!): RempReceipt! }
    type RempReceipt { kind: RempReceiptKind!, messageId: String!, timestamp: Float!, json: String!,
                       final: Boolean!, outcome: String }

`postRequests`: body = base64 BOC; returns the message ids (64 hex digits) in request order;
a refused message raises a GraphQL error naming the request index and the reason (its status
is still kept for GET /messages/{id}; the requests after it are not taken), with
`extensions.code`: "BAD_REQUEST" (not base64, undecodable BOC), "REJECTED_BY_FULLNODE" (the
full node's checks), "MESSAGE_ALREADY_FINAL" (the full node holds the message as final: not
sent to the validators again; extensions also carry messageId, outcome, kind, reason,
retainedUntil; HTTP's 409), "BACKPRESSURE" (the full node is at its bound, HTTP's 503 with
Retry-After: extensions.retryAfter in seconds and reason "pending_full" | "client_rate";
not accepted, retry later), "STORE_UNAVAILABLE", and `requestIndex`.
`rempReceipts(messageId)`: every status of the message so far, then new ones; the status
that made the full node's final decision has `final: true` and `outcome` (a client may stop
there); the subscription completes once every expected validator sent its own final status
or `--subscription-grace` seconds after the decision (api.py, GET /messages/{id}/ws), so a
subscriber gets exactly the statuses GET /messages/{id} lists when it ends. A malformed id is refused
with an error ("message id must be 64 hex digits"). `kind` is an enum of the JSON kinds
(seed: remp-protocol-b). The schema adds `final` and `outcome` to ever-q-server's
RempReceipt; its four fields are unchanged.
"""
from __future__ import annotations

import base64
import binascii
import enum
import json
from typing import AsyncGenerator, Optional

import strawberry
from aiohttp import web
from graphql import GraphQLError
from strawberry.aiohttp.views import GraphQLView
from strawberry.subscriptions import GRAPHQL_TRANSPORT_WS_PROTOCOL, GRAPHQL_WS_PROTOCOL

from .server import ApiError, parse_message_id

__all__ = ["build_schema", "add_graphql_route"]

#: extensions.code of a refused postRequests request, by the HTTP status POST /messages gives
_CODES = {400: "BAD_REQUEST", 413: "BAD_REQUEST", 422: "REJECTED_BY_FULLNODE", 503: "STORE_UNAVAILABLE"}


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
    final: bool = strawberry.field(default=False, description=(
        "true on the one status that made the full node's final decision about the message "
        "(outcome is then set); statuses of other validators may follow"))
    outcome: Optional[str] = strawberry.field(default=None, description=(
        "on the deciding status: finalized | rejected | timeout"))


@strawberry.input
class Request:
    body: str
    id: Optional[str] = None
    expireAt: Optional[float] = None


@strawberry.type
class Info:
    version: str


def _receipt(d: dict, final: dict | None = None) -> RempReceipt:
    try:
        kind = RempReceiptKind(d.get("kind"))
    except ValueError:
        kind = RempReceiptKind.Other
    return RempReceipt(kind=kind, messageId=d["message_id"], timestamp=float(d["timestamp"]),
                       json=json.dumps(d, separators=(",", ":")), final=final is not None,
                       outcome=final["outcome"] if final is not None else None)


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
        def postRequests(self, info: strawberry.Info, requests: list[Request],
                         accessKey: Optional[str] = None) -> list[str]:
            ids = []
            for i, r in enumerate(requests):
                try:
                    boc = base64.b64decode(r.body, validate=True)
                except (binascii.Error, ValueError):
                    hub.m_refused.labels("undecodable").inc()
                    raise GraphQLError(f"request {i}: body is not base64",
                                       extensions={"code": "BAD_REQUEST", "requestIndex": i}) from None
                req = info.context.get("request") if isinstance(info.context, dict) else None
                status, doc = hub.submit(boc, getattr(req, "remote", "") or "")
                if status == 503 and "retry_after" in doc:
                    raise GraphQLError(f"request {i}: {doc['error']}", extensions={
                        "code": "BACKPRESSURE", "requestIndex": i, "reason": doc["reason"],
                        "retryAfter": doc["retry_after"], "messageId": doc["message_id"]})
                if status == 409:
                    o = doc["outcome"]
                    raise GraphQLError(f"request {i}: {doc['error']}", extensions={
                        "code": "MESSAGE_ALREADY_FINAL", "requestIndex": i, "messageId": doc["message_id"],
                        "outcome": o["outcome"], "kind": o["kind"], "reason": o["reason"],
                        "retainedUntil": doc["retained_until"]})
                if status >= 400:
                    raise GraphQLError(f"request {i}: {doc.get('kind', 'refused')}: "
                                       f"{doc.get('reason') or doc.get('error')}",
                                       extensions={"code": _CODES.get(status, "REFUSED"), "requestIndex": i,
                                                   **({"messageId": doc["message_id"]} if "message_id" in doc else {})})
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
                    if kind == "end":
                        return
                    if kind == "status":
                        # the decision is queued right after the status that made it
                        yield _receipt(d, q.next_is_final())
            finally:
                hub.unsubscribe(mid, q)

    return strawberry.Schema(query=Query, mutation=Mutation, subscription=Subscription)


def add_graphql_route(app: web.Application, daemon) -> None:
    view = GraphQLView(schema=build_schema(daemon), graphql_ide=None,
                       subscription_protocols=[GRAPHQL_TRANSPORT_WS_PROTOCOL, GRAPHQL_WS_PROTOCOL])
    app.router.add_route("*", "/graphql", view)
