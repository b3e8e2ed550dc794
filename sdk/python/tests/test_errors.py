"""The error classes: one per sentinel of the Go client, chosen by the
answer's code and reason, never by its status number."""

from __future__ import annotations

import unittest

from taskledger import errors
from taskledger.types import BatchItem, Task


class ErrorsTest(unittest.TestCase):
    def test_classes_by_code_and_reason(self) -> None:
        cases = [
            (400, "invalid_argument", "", errors.InvalidArgument),
            (401, "unauthenticated", "", errors.Unauthenticated),
            (403, "forbidden", "", errors.Forbidden),
            (403, "forbidden", "operator_only", errors.OperatorOnly),
            (404, "not_found", "", errors.NotFound),
            (408, "request_timeout", "", errors.RequestTimeout),
            (409, "conflict", "terminal", errors.Terminal),
            (409, "conflict", "token_mismatch", errors.TokenMismatch),
            (409, "conflict", "not_claimable", errors.NotClaimable),
            (409, "conflict", "parent_terminal", errors.ParentTerminal),
            (409, "conflict", "ancestor_terminal", errors.AncestorTerminal),
            (409, "conflict", "request_id_conflict", errors.RequestIDConflict),
            (409, "conflict", "lineage_limit", errors.LineageLimit),
            (409, "conflict", "stale_revision", errors.StaleRevision),
            (409, "conflict", "not_terminal", errors.NotTerminal),
            (409, "conflict", "a_new_reason", errors.Conflict),
            (413, "payload_too_large", "", errors.PayloadTooLarge),
            (429, "admission_rejected", "", errors.AdmissionRejected),
            (429, "too_many_requests", "too_many_polls", errors.TooManyPolls),
            (431, "header_too_large", "", errors.HeaderTooLarge),
            (500, "internal", "", errors.Internal),
            (500, "corrupt_event", "", errors.CorruptEvent),
            (503, "unavailable", "", errors.Unavailable),
            (418, "a_new_code", "", errors.TaskledgerError),
            (404, "unavailable", "", errors.Unavailable),  # the code decides, not the status
        ]
        for status, code, reason, cls in cases:
            with self.subTest(code=code, reason=reason):
                e = errors.error_for(status, code, reason, "said the server")
                self.assertIs(type(e), cls)
                self.assertIsInstance(e, errors.TaskledgerError)
                self.assertEqual((e.status, e.code, e.reason, e.message), (status, code, reason, "said the server"))
        self.assertTrue(issubclass(errors.StaleRevision, errors.Conflict))
        self.assertEqual(str(errors.error_for(409, "conflict", "terminal", "task is done")), "conflict (terminal): task is done")

    def test_batch_item_error(self) -> None:
        ok = BatchItem.from_json({"status": 201, "task": {"id": "t1"}})
        self.assertIsNone(ok.err())
        refused = BatchItem.from_json({"status": 429, "error": "admission_rejected", "message": "quota",
                                       "task": {"id": "t2", "status": "canceled"}})
        e = refused.err()
        assert isinstance(e, errors.AdmissionRejected)
        self.assertEqual((e.status, e.task), (429, Task(id="t2", status="canceled")))


if __name__ == "__main__":
    unittest.main()
