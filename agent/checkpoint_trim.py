"""Keep only the latest LangGraph checkpoint of a thread in checkpoints.db.

LangGraph's SqliteSaver keeps every step's checkpoint, for time travel that kernelscout does not offer: a
search resumes from its latest checkpoint (with that checkpoint's pending writes), and a chat goes on from its
latest state. Kept whole, the file grows by a checkpoint per graph step (9.8 MB for a 400-measurement search on a
recorded space; a chat's checkpoints each hold the whole conversation), and the saver's own `prune` is not
implemented for SQLite. The graphs here use plain channels (no DeltaChannel), so the latest checkpoint holds
the whole state on its own.
"""

from __future__ import annotations

import sqlite3


def keep_latest_checkpoint(conn: sqlite3.Connection, thread_id: str) -> int:
    """Delete the thread's earlier checkpoints and their writes, then compact the file when no other connection is
    using it. Returns how many checkpoints were deleted. Checkpoint ids are time-ordered (the saver reads the latest
    as the greatest), and only the root namespace's are kept; the graphs here have no subgraphs."""
    try:
        row = conn.execute("SELECT MAX(checkpoint_id) FROM checkpoints WHERE thread_id = ? AND checkpoint_ns = ''",
                           (thread_id,)).fetchone()
    except sqlite3.OperationalError:  # no checkpoint was ever written (the tables are made on first use)
        return 0
    if row is None or row[0] is None:
        return 0
    latest = row[0]
    with conn:
        deleted = conn.execute("DELETE FROM checkpoints WHERE thread_id = ? AND checkpoint_id < ?", (thread_id, latest)).rowcount
        conn.execute("DELETE FROM writes WHERE thread_id = ? AND checkpoint_id < ?", (thread_id, latest))
    if deleted:
        try:
            conn.execute("VACUUM")
        except sqlite3.OperationalError:  # another process has the file open in a transaction: compacted next time
            pass
    return deleted
