"""Durable state of the REMP daemons: SQLite (the standard library's sqlite3) in the data dir.

One file per daemon, ``<data-dir>/remp.sqlite3``, opened with ``journal_mode=WAL``.
Two durability levels (SQLite's ``synchronous``, per transaction):
- ``FULL`` (the WAL is fsynced when ``COMMIT`` returns): every transaction holding a
  validator journal entry (consensus signed heights, master commits, authored catchain
  sessions, collator rejections), so a validator that writes such a fact and then sends a
  datagram depending on it never sends first, even across a host crash (the journal's rule:
  "written with fsync before anything that depends on it is sent").
- ``NORMAL`` (the committed WAL frames are in the OS page cache when ``COMMIT`` returns;
  fsynced at the next checkpoint or FULL commit, in order): a validator transaction holding
  only receipt outbox changes and signed receipts (journal kinds "receipt", "receipts_gc"),
  and everything the full node stores. A SIGKILLed process
  loses none of it (the kernel has the pages); a host power loss may lose the last ones.
  Measured here: a FULL commit 4.7 ms, a NORMAL one 0.024 ms; with one commit per
  processed datagram batch, FULL everywhere blocked each daemon's event loop for most of
  its time at 10-20 messages/s (py-spy: ValidatorStore.write 33% of a validator's samples,
  the full node's status inserts 51%).

ValidatorStore keeps a validator's ValidatorJournal (validator.py, "restarts"): the commit
certificate of every accepted master block (from which the restarted core rebuilds its
chain view, shard and masterchain states, message cache statuses and session seeds), the
highest height it signed per consensus session, the catchain sessions it authored, and
every receipt it signed per (message, status) until the message's lifetime is over (a
restarted validator sends that receipt again instead of signing the status anew); and
its receipt outbox (delivery.ReceiptSender journal=True): every receipt for a full node
from its "add" record until its "done", so a SIGKILLed validator sends again, after its
restart, the statuses it had produced but no full node had acknowledged.

FullnodeStore keeps what users were told: every message submitted (id, BOC, time) and every
status (the seed's JSON, in arrival order) with the final outcome and when it became final
(``final_at``, Unix seconds), so ``GET /messages/{id}`` survives a restart, and so does the
full node's refusal to send a final message to the validators again (node.FullnodeDaemon,
``--final-retention``): a final message is kept until purge_final() removes it, retention
seconds after its final outcome.

Errors: StoreError (not a ValueError: a local failure, e.g. a corrupt or locked file).
"""
from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Iterable

from ..errors import RempLocalError
from ..core.delivery import OutboxChange
from ..core.validator import JournalEntry, ValidatorJournal

__all__ = ["StoreError", "ValidatorStore", "FullnodeStore", "DB_NAME"]

DB_NAME = "remp.sqlite3"
#: validator journal kinds written at the outbox's durability (NORMAL, module doc)
_NORMAL_KINDS = frozenset({"receipt", "receipts_gc"})


class StoreError(RempLocalError):
    """The store cannot be opened or written (local failure)."""


def _open(path: Path) -> sqlite3.Connection:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")
        return db
    except (sqlite3.Error, OSError) as exc:
        raise StoreError(f"{path}: {exc}") from None


def _run_epoch(db: sqlite3.Connection, path: Path, now_us: int) -> int:
    """The number naming this run of the daemon (its transport `epoch` and its receipt
    delivery `stream`): max(previous + 1, now_us), written (fsynced) before it is used, so
    it grows across restarts even when the clock was set back (peers refuse a lower epoch /
    stream as stale: transport.py "Restarts", delivery.py module doc). now_us: the current
    Unix time in microseconds. Raises StoreError."""
    try:
        db.execute("PRAGMA synchronous=FULL")
        db.execute("CREATE TABLE IF NOT EXISTS run_epoch (one INTEGER PRIMARY KEY CHECK (one = 1), "
                   "epoch INTEGER NOT NULL)")
        db.execute("BEGIN IMMEDIATE")
        row = db.execute("SELECT epoch FROM run_epoch WHERE one = 1").fetchone()
        epoch = max(int(row[0]) + 1, int(now_us)) if row else int(now_us)
        db.execute("INSERT INTO run_epoch VALUES (1, ?) ON CONFLICT(one) DO UPDATE SET epoch = excluded.epoch",
                   (epoch,))
        db.execute("COMMIT")
        return epoch
    except sqlite3.Error as exc:
        try:
            db.execute("ROLLBACK")
        except sqlite3.Error:
            pass
        raise StoreError(f"{path}: {exc}") from None


def _rolled_back(db: sqlite3.Connection, path, exc: sqlite3.Error) -> StoreError:
    """Roll back the open transaction of `db` (a failed rollback changes nothing: SQLite has
    already ended it) and return the StoreError naming the file and the cause."""
    try:
        db.execute("ROLLBACK")
    except sqlite3.Error:
        pass
    return StoreError(f"{path}: {exc}")


class ValidatorStore:
    """ValidatorStore(data_dir). load() -> ValidatorJournal; write(entries) commits them in
    one fsynced transaction (call before sending the datagrams they precede)."""

    def __init__(self, data_dir: str | Path):
        self.path = Path(data_dir) / DB_NAME
        self.db = _open(self.path)
        self.db.executescript("""
            CREATE TABLE IF NOT EXISTS master_commits (seqno INTEGER PRIMARY KEY, raw BLOB NOT NULL);
            CREATE TABLE IF NOT EXISTS signed_heights (session_id BLOB PRIMARY KEY, height INTEGER NOT NULL);
            CREATE TABLE IF NOT EXISTS authored (session_id BLOB PRIMARY KEY);
            CREATE TABLE IF NOT EXISTS rejected (id BLOB PRIMARY KEY, uid BLOB NOT NULL,
                                                 master_seqno INTEGER NOT NULL);
            CREATE TABLE IF NOT EXISTS outbox (n INTEGER PRIMARY KEY AUTOINCREMENT, dst BLOB NOT NULL,
                                               digest BLOB NOT NULL, receipt BLOB NOT NULL,
                                               session INTEGER NOT NULL, UNIQUE (dst, digest));
            CREATE TABLE IF NOT EXISTS signed_receipts (id BLOB NOT NULL, status BLOB NOT NULL,
                                                        master_seqno INTEGER NOT NULL, receipt BLOB NOT NULL,
                                                        PRIMARY KEY (id, status));
            CREATE INDEX IF NOT EXISTS signed_receipts_seqno ON signed_receipts (master_seqno);
        """)
        self.writes = 0
        self._full = True       # synchronous of the connection (module doc: FULL / NORMAL)

    def load(self) -> ValidatorJournal:
        j = ValidatorJournal()
        for seqno, raw in self.db.execute("SELECT seqno, raw FROM master_commits"):
            j.master_commits[int(seqno)] = bytes(raw)
        for sid, h in self.db.execute("SELECT session_id, height FROM signed_heights"):
            j.signed_heights[bytes(sid)] = int(h)
        for (sid,) in self.db.execute("SELECT session_id FROM authored"):
            j.authored.add(bytes(sid))
        for mid, uid, seqno in self.db.execute("SELECT id, uid, master_seqno FROM rejected"):
            j.rejected[bytes(mid)] = (bytes(uid), int(seqno))
        for mid, status, seqno, raw in self.db.execute("SELECT id, status, master_seqno, receipt FROM signed_receipts"):
            j.receipts[(bytes(mid), bytes(status))] = (int(seqno), bytes(raw))
        return j

    def run_epoch(self, now_us: int) -> int:
        """This run's transport epoch / delivery stream: max(previous + 1, now_us), fsynced."""
        return _run_epoch(self.db, self.path, now_us)

    def outbox(self) -> list[tuple[bytes, bytes, int]]:
        """The receipt outbox (delivery.ReceiptSender journal=True): (full node key id,
        receipt bytes, session) still without "done", in the order they were added; what
        ReceiptSender.restore(entries, now) takes after a restart."""
        return [(bytes(d), bytes(r), int(s)) for d, r, s in
                self.db.execute("SELECT dst, receipt, session FROM outbox ORDER BY n")]

    def write(self, entries: Iterable[JournalEntry | OutboxChange]) -> int:
        """Commit entries (one transaction, fsynced; call before sending the datagrams they
        precede). JournalEntry: the validator journal; OutboxChange (delivery.py): "add"
        inserts the receipt keyed by (dst, digest) in order, "done" deletes it. Only outbox
        changes and signed receipts: NORMAL, not fsynced (module doc). Returns how many were
        written."""
        entries = list(entries)
        if not entries:
            return 0
        full = any(not isinstance(e, OutboxChange) and e.kind not in _NORMAL_KINDS for e in entries)
        try:
            if full != self._full:
                self.db.execute(f"PRAGMA synchronous={'FULL' if full else 'NORMAL'}")
                self._full = full
            self.db.execute("BEGIN")
            # consecutive outbox changes of one kind go in one executemany (an execute per
            # receipt "add" and "done" was most of the store's CPU); order is kept
            run_kind, run = None, []
            for e in entries:
                if isinstance(e, OutboxChange) or e.kind == "receipt":
                    if e.kind != run_kind:
                        self._outbox_run(run_kind, run)
                        run_kind, run = e.kind, []
                    if e.kind == "receipt":
                        run.append((e.key[0], e.key[1], int(e.value[0]), e.value[1]))
                    else:
                        run.append((e.dst, e.digest, e.receipt, int(e.session)) if e.kind == "add"
                                   else (e.dst, e.digest))
                    continue
                if run:
                    self._outbox_run(run_kind, run)
                    run_kind, run = None, []
                if e.kind == "master_commit":
                    self.db.execute("INSERT OR IGNORE INTO master_commits VALUES (?, ?)", (int(e.key), e.value))
                elif e.kind == "signed_height":
                    self.db.execute("INSERT INTO signed_heights VALUES (?, ?) ON CONFLICT(session_id) DO UPDATE "
                                    "SET height = max(height, excluded.height)", (e.key, int(e.value)))
                elif e.kind == "authored":
                    self.db.execute("INSERT OR IGNORE INTO authored VALUES (?)", (e.key,))
                elif e.kind == "rejected":
                    self.db.execute("INSERT OR IGNORE INTO rejected VALUES (?, ?, ?)",
                                    (e.key, e.value[0], int(e.value[1])))
                elif e.kind == "rejected_gc":
                    self.db.execute("DELETE FROM rejected WHERE master_seqno <= ?", (int(e.key),))
                elif e.kind == "receipts_gc":
                    self.db.execute("DELETE FROM signed_receipts WHERE master_seqno <= ?", (int(e.key),))
            self._outbox_run(run_kind, run)
            self.db.execute("COMMIT")
        except sqlite3.Error as exc:
            raise _rolled_back(self.db, self.path, exc) from None
        self.writes += 1
        return len(entries)

    def _outbox_run(self, kind: str | None, rows: list[tuple]) -> None:
        if not rows:
            return
        if kind == "add":
            self.db.executemany("INSERT OR IGNORE INTO outbox (dst, digest, receipt, session) VALUES (?, ?, ?, ?)", rows)
        elif kind == "receipt":
            self.db.executemany("INSERT OR IGNORE INTO signed_receipts VALUES (?, ?, ?, ?)", rows)
        else:
            self.db.executemany("DELETE FROM outbox WHERE dst = ? AND digest = ?", rows)

    def close(self) -> None:
        self.db.close()


class FullnodeStore:
    """FullnodeStore(data_dir): messages and their statuses as users saw them."""

    def __init__(self, data_dir: str | Path):
        self.path = Path(data_dir) / DB_NAME
        self.db = _open(self.path)
        self.db.executescript("""
            CREATE TABLE IF NOT EXISTS messages (id BLOB PRIMARY KEY, boc BLOB NOT NULL, submitted REAL NOT NULL,
                                                 outcome TEXT, kind TEXT, reason TEXT);
            CREATE TABLE IF NOT EXISTS statuses (n INTEGER PRIMARY KEY AUTOINCREMENT, id BLOB NOT NULL,
                                                 json TEXT NOT NULL);
            CREATE INDEX IF NOT EXISTS statuses_id ON statuses (id, n);
        """)
        cols = {row[1] for row in self.db.execute("PRAGMA table_info(messages)")}
        if "final_at" not in cols:      # a store written before final_at existed
            self.db.execute("ALTER TABLE messages ADD COLUMN final_at REAL")
        # SIGKILL-safe without an fsync per commit (module doc)
        self.db.execute("PRAGMA synchronous=NORMAL")
        self._rows: list[tuple[bytes, str]] = []
        self._outcomes: list[tuple[str, str, str, bytes]] = []

    def run_epoch(self, now_us: int) -> int:
        """This run's transport epoch: max(previous + 1, now_us), fsynced."""
        epoch = _run_epoch(self.db, self.path, now_us)
        self.db.execute("PRAGMA synchronous=NORMAL")
        return epoch

    def add_message(self, mid: bytes, boc: bytes, submitted: float) -> None:
        """Committed at once (the API answers 202 after it: resubmitted after a crash).
        Raises StoreError when SQLite refuses the write (disk full, read-only file, I/O)."""
        try:
            self.db.execute("INSERT OR IGNORE INTO messages (id, boc, submitted) VALUES (?, ?, ?)",
                            (mid, boc, submitted))
        except sqlite3.Error as exc:
            raise StoreError(f"{self.path}: {exc}") from None

    def add_statuses(self, rows: list[tuple[bytes, str]]) -> None:
        """Queue statuses (message id, the seed's status object as JSON text: the daemon
        encodes each once, for this store and the Redis stream) for the next commit()."""
        self._rows.extend(rows)

    def set_outcome(self, mid: bytes, outcome: str, kind: str, reason: str, final_at: float | None = None) -> None:
        """Queue a final outcome for the next commit(). final_at: Unix seconds it became
        final, the clock of purge_final's retention (None: the submit time stands for it)."""
        self._outcomes.append((outcome, kind, reason, final_at, mid))

    def commit(self) -> int:
        """Write the queued statuses and outcomes in ONE transaction (the daemon calls it at
        the end of every step, before the step's datagrams, e.g. the receipt acks, leave;
        reads and close() call it first). It was a transaction per status batch, per POST
        and per final outcome. Returns how many rows were written."""
        rows, outcomes = self._rows, self._outcomes
        if not rows and not outcomes:
            return 0
        try:
            self.db.execute("BEGIN")
            if rows:
                self.db.executemany("INSERT INTO statuses (id, json) VALUES (?, ?)", rows)
            if outcomes:
                self.db.executemany("UPDATE messages SET outcome = ?, kind = ?, reason = ?, final_at = ? "
                                    "WHERE id = ?", outcomes)
            self.db.execute("COMMIT")
        except sqlite3.Error as exc:      # kept for the next commit (the step sent nothing)
            raise _rolled_back(self.db, self.path, exc) from None
        self._rows, self._outcomes = [], []
        return len(rows) + len(outcomes)

    def message(self, mid: bytes) -> dict | None:
        self.commit()
        row = self.db.execute("SELECT submitted, outcome, kind, reason FROM messages WHERE id = ?",
                              (mid,)).fetchone()
        if row is None:
            return None
        return {"submitted": row[0], "outcome": row[1], "kind": row[2], "reason": row[3]}

    def known(self, mid: bytes) -> dict | None:
        """What the store holds about `mid` as committed (no commit first: a caller on the
        submit path checks the daemon's in-memory outcomes of this step before):
        {"submitted", "outcome" (None while in flight), "kind", "reason", "final_at"} or
        None. Raises StoreError."""
        try:
            row = self.db.execute("SELECT submitted, outcome, kind, reason, final_at FROM messages WHERE id = ?",
                                  (mid,)).fetchone()
        except sqlite3.Error as exc:
            raise StoreError(f"{self.path}: {exc}") from None
        if row is None:
            return None
        return {"submitted": row[0], "outcome": row[1], "kind": row[2], "reason": row[3] or "",
                "final_at": row[4] if row[4] is not None else row[0]}

    def purge_final(self, before: float, limit: int = 5000) -> list[bytes]:
        """Delete at most `limit` messages whose final outcome is older than `before` (Unix
        seconds; final_at, or the submit time for rows without one) with their statuses, in
        one transaction. Returns their ids. Raises StoreError."""
        self.commit()
        try:
            ids = [bytes(i) for (i,) in self.db.execute(
                "SELECT id FROM messages WHERE outcome IS NOT NULL AND COALESCE(final_at, submitted) < ? LIMIT ?",
                (before, limit))]
            if not ids:
                return []
            self.db.execute("BEGIN")
            self.db.executemany("DELETE FROM statuses WHERE id = ?", [(i,) for i in ids])
            self.db.executemany("DELETE FROM messages WHERE id = ?", [(i,) for i in ids])
            self.db.execute("COMMIT")
        except sqlite3.Error as exc:
            raise _rolled_back(self.db, self.path, exc) from None
        return ids

    def statuses(self, mid: bytes) -> list[dict]:
        self.commit()
        return [json.loads(t) for (t,) in self.db.execute("SELECT json FROM statuses WHERE id = ? ORDER BY n", (mid,))]

    def pending(self) -> list[tuple[bytes, bytes]]:
        """(id, boc) of messages without a final outcome (resubmitted after a restart)."""
        self.commit()
        return [(bytes(i), bytes(b)) for i, b in
                self.db.execute("SELECT id, boc FROM messages WHERE outcome IS NULL ORDER BY submitted")]

    def close(self) -> None:
        self.commit()
        self.db.close()
