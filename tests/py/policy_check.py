"""pymongo against staleguard (driven by tests/policy_pymongo.rs).

Usage: python policy_check.py MODE URI

Each mode asserts what a pymongo application sees and prints one line "OK MODE {...}"; any
failed expectation exits non-zero with the reason.
"""

import json
import sys
import time

from pymongo import MongoClient, ReadPreference
from pymongo.errors import NetworkTimeout, OperationFailure

TIMEOUTS = dict(serverSelectionTimeoutMS=5000, connectTimeoutMS=5000)


def fail(msg):
    print(f"FAIL {msg}", flush=True)
    sys.exit(1)


def expect(cond, msg):
    if not cond:
        fail(msg)


def fallback_retry(uri):
    """The proxy hides a StaleConfig from the application: the documents come back."""
    client = MongoClient(uri, **TIMEOUTS)
    coll = client.demo.get_collection("store_inventory", read_preference=ReadPreference.SECONDARY)
    docs = list(coll.find({}, max_time_ms=5000).sort("_id", 1))
    expect([d["_id"] for d in docs] == [0, 1, 2, 3, 4], f"documents: {docs}")
    expect(docs[0]["item"] == "item 0", f"first document: {docs[0]}")
    return {"docs": len(docs)}


def strict_fail_fast(uri):
    """Three upstream StaleConfig errors open the strict breaker; the fourth read fails fast."""
    client = MongoClient(uri, **TIMEOUTS)
    client.admin.command("ping")
    coll = client.pay.get_collection("accounts", read_preference=ReadPreference.SECONDARY)
    for i in range(3):
        try:
            coll.find_one({})
            fail(f"read {i} should fail with the upstream StaleConfig")
        except OperationFailure as e:
            expect(e.code == 13388, f"read {i}: code {e.code}")
            expect(not e.details["errmsg"].startswith("staleguard:"), "upstream error expected")
    started = time.monotonic()
    try:
        coll.find_one({})
        fail("the fourth read should fail fast")
    except OperationFailure as e:
        took = time.monotonic() - started
        errmsg = e.details.get("errmsg", "")
        expect(e.code == 13388, f"fail-fast code {e.code}")
        expect(e.details.get("codeName") == "StaleConfig", f"codeName {e.details}")
        expect(errmsg.startswith("staleguard:"), f"errmsg {errmsg!r}")
        expect("pay.accounts" in errmsg, f"errmsg names the namespace: {errmsg!r}")
        expect(not e.has_error_label("RetryableError"), "no retry label")
        expect(took < 0.05, f"fail fast took {took * 1000:.1f} ms")
    # The connection survived: the same client keeps working.
    client.admin.command("ping")
    return {"fail_fast_ms": round(took * 1000, 2), "errmsg": errmsg}


def socket_timeouts(uri):
    """socketTimeoutMS fires before the (delayed) reply, three times."""
    client = MongoClient(uri, socketTimeoutMS=150, retryReads=False, **TIMEOUTS)
    client.admin.command("ping")
    coll = client.demo.get_collection("store_inventory", read_preference=ReadPreference.SECONDARY)
    times = []
    for i in range(3):
        started = time.monotonic()
        try:
            coll.find_one({})
            fail(f"read {i} should time out")
        except NetworkTimeout:
            times.append(round((time.monotonic() - started) * 1000, 1))
    expect(all(t < 1000 for t in times), f"timeouts came late: {times}")
    return {"timeouts_ms": times}


def strict_bounded(uri):
    """Three StaleConfig errors open the strict breaker (on_open = "bound"): a read that
    still meets a stale secondary fails fast with staleguard's error; a read a healthy
    secondary answers is answered."""
    client = MongoClient(uri, **TIMEOUTS)
    coll = client.pay.get_collection("accounts", read_preference=ReadPreference.SECONDARY)
    for i in range(3):
        try:
            coll.find_one({"stale": True})
            fail(f"read {i} should fail with the upstream StaleConfig")
        except OperationFailure as e:
            expect(e.code == 13388, f"read {i}: code {e.code}")
    try:
        coll.find_one({"stale": True})
        fail("a read meeting a stale secondary should fail")
    except OperationFailure as e:
        errmsg = e.details.get("errmsg", "")
        expect(e.code == 13388, f"fail-fast code {e.code}")
        expect(errmsg.startswith("staleguard:"), f"errmsg {errmsg!r}")
        expect("open_time_limit" in errmsg, f"errmsg names the bound: {errmsg!r}")
        expect(not e.has_error_label("RetryableError"), "no retry label")
    doc = coll.find_one({})
    expect(doc is not None and doc["_id"] == 0, f"answered while open: {doc}")
    return {"answered_while_open": True}


def fallback_read(uri):
    client = MongoClient(uri, **TIMEOUTS)
    coll = client.demo.get_collection("store_inventory", read_preference=ReadPreference.SECONDARY)
    docs = list(coll.find({}))
    expect(len(docs) == 5, f"documents: {docs}")
    return {"docs": len(docs)}


MODES = {
    "fallback-retry": fallback_retry,
    "strict-fail-fast": strict_fail_fast,
    "socket-timeouts": socket_timeouts,
    "fallback-read": fallback_read,
    "strict-bounded": strict_bounded,
}


def main():
    if len(sys.argv) != 3 or sys.argv[1] not in MODES:
        sys.exit(f"usage: policy_check.py {{{'|'.join(MODES)}}} URI")
    mode, uri = sys.argv[1], sys.argv[2]
    result = MODES[mode](uri)
    print(f"OK {mode} {json.dumps(result)}", flush=True)


if __name__ == "__main__":
    main()
