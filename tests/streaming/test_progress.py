"""The ledger of history requests (PostgreSQL): when a request is answered, and how."""

from __future__ import annotations

import uuid

from proto import market_pb2
from streaming.progress import Progress


def test_a_request_with_every_page_in_is_complete_whatever_a_second_fetch_said(
    lakehouse,
) -> None:
    """Two ingestors took one request (a takeover): one fetched every page, the other hit a
    rate limit and wrote its error marker. The request is answered OK, before or after that
    marker, and a marker for a request short of pages still answers it with the error."""
    progress = Progress(lakehouse)
    for error_first in (False, True):
        rid = f"r-{uuid.uuid4().hex[:8]}"
        meta = market_pb2.HistoryRequestMetadata(request_id=rid, expected_pages=2)
        pages, limited = [(rid, 0, 500), (rid, 1, 20)], {rid: "rate limited"}
        if error_first:
            (first,) = progress.record_history([meta], [pages[0]], limited)
            assert first.error == "rate limited"
            (done,) = progress.record_history([], [pages[1]], {})
        else:
            progress.record_history([meta], [pages[0]], {})
            (done,) = progress.record_history([], [pages[1]], {})
            assert (done.error, done.rows) == (None, 520)
            (done,) = progress.record_history([meta], [], limited)
        assert (done.meta.request_id, done.error, done.rows) == (rid, None, 520)
