"""pymongo against staleguard in front of the simulated cluster (driven by tests/policy_sim.rs).

Usage: python policy_sim_check.py MODE GUARDED_URI DIRECT_URI

The Rust test has stalled shard A's primary and restarted secondary a1 before running a mode.
Reads are pinned with pymongo's own tag sets: a1 on shard A, b1 on shard B. Each mode asserts
what a pymongo application sees and prints one line "OK MODE {...}"; any failed expectation
exits non-zero with the reason.
"""

import json
import sys
import time

from pymongo import MongoClient
from pymongo.errors import OperationFailure
from pymongo.read_preferences import Secondary

TIMEOUTS = dict(serverSelectionTimeoutMS=5000, connectTimeoutMS=5000)
ON_A1 = Secondary(tag_sets=[{"node": "a1"}, {"node": "b1"}])
# A read refused by shard A waits for two refresh timeouts of 300 ms (mongos's attempts).
REFUSAL = 0.55
# Must match FAIL_FAST_READS in tests/policy_sim.rs.
FAIL_FAST_READS = 3


def fail(msg):
    print(f"FAIL {msg}", flush=True)
    sys.exit(1)


def expect(cond, msg):
    if not cond:
        fail(msg)


def timed(fn):
    started = time.monotonic()
    try:
        return fn(), None, time.monotonic() - started
    except OperationFailure as e:
        return None, e, time.monotonic() - started


def fallback(guarded, direct):
    """Straight to mongos the pinned read is refused; through staleguard it answers: the first
    three through the `available` resend (after the refusal), the fourth rewritten at once."""
    coll = MongoClient(direct, **TIMEOUTS).demo.get_collection("store_inventory", read_preference=ON_A1)
    _, err, took = timed(lambda: list(coll.find({}, batch_size=5000)))
    expect(err is not None, "the direct read should be refused")
    expect(err.code == 13388, f"direct read: {err.code} {err}")
    expect(took >= REFUSAL, f"direct refusal after {took:.3f} s")

    client = MongoClient(guarded, **TIMEOUTS)
    client.admin.command("ping")
    coll = client.demo.get_collection("store_inventory", read_preference=ON_A1)
    times = []
    for i in range(4):
        docs, err, took = timed(lambda: list(coll.find({}, batch_size=5000)))
        expect(err is None, f"read {i} should be answered: {err}")
        expect(len(docs) == 2000, f"read {i}: {len(docs)} documents")
        times.append(round(took * 1000, 1))
    expect(all(t >= REFUSAL * 1000 for t in times[:3]), f"the first reads met the refusal: {times}")
    expect(times[3] < REFUSAL * 1000, f"the rewritten read met no refusal: {times}")
    return {"read_ms": times}


def strict(guarded, direct):
    """Three refusals reach the application as mongos sent them; the next reads fail fast."""
    client = MongoClient(guarded, **TIMEOUTS)
    client.admin.command("ping")
    coll = client.pay.get_collection("transactions", read_preference=ON_A1)
    for i in range(3):
        _, err, took = timed(lambda: coll.find_one({}))
        expect(err is not None, f"read {i} should be refused")
        expect(err.code == 13388, f"read {i}: code {err.code}")
        errmsg = err.details.get("errmsg", "")
        expect(not errmsg.startswith("staleguard:"), f"read {i}: mongos's error expected: {errmsg!r}")
        expect(took >= REFUSAL, f"read {i} refused after {took:.3f} s")
    times = []
    for i in range(FAIL_FAST_READS):
        _, err, took = timed(lambda: coll.find_one({}))
        expect(err is not None, f"fail-fast read {i} should fail")
        errmsg = err.details.get("errmsg", "")
        expect(err.code == 13388, f"fail-fast code {err.code}")
        expect(errmsg.startswith("staleguard:"), f"errmsg {errmsg!r}")
        expect("pay.transactions" in errmsg, f"errmsg names the namespace: {errmsg!r}")
        expect(not err.has_error_label("RetryableError"), "no retry label")
        times.append(took)
    # The fastest within 50 ms (one slower reply on a loaded machine is scheduling); every
    # one long before the sim could have refused it.
    expect(min(times) < 0.05, f"fail fast took {[round(t * 1000, 1) for t in times]} ms")
    expect(max(times) < 0.25, f"fail fast took {[round(t * 1000, 1) for t in times]} ms")
    client.admin.command("ping")
    return {"fail_fast_ms": [round(t * 1000, 2) for t in times], "errmsg": errmsg}


def budget(guarded, direct):
    """The time-limit path (the sim's refresh waits 30 s, longer than the read's maxTimeMS):
    straight to mongos the read fails when its 2 s are spent; through staleguard the very
    first read answers, well inside its own 2 s (its first attempt gets 500 ms, the
    `available` resend the rest)."""
    coll = MongoClient(direct, **TIMEOUTS).demo.get_collection("store_inventory", read_preference=ON_A1)
    _, err, direct_took = timed(lambda: list(coll.find({}, batch_size=5000, max_time_ms=2000)))
    expect(err is not None and err.code == 50, f"direct read: {err}")
    expect(direct_took >= 1.9, f"direct time limit after {direct_took:.3f} s")
    client = MongoClient(guarded, **TIMEOUTS)
    client.admin.command("ping")
    coll = client.demo.get_collection("store_inventory", read_preference=ON_A1)
    docs, err, took = timed(lambda: list(coll.find({}, batch_size=5000, max_time_ms=2000)))
    expect(err is None, f"the first read through staleguard should be answered: {err}")
    expect(len(docs) == 2000, f"{len(docs)} documents")
    expect(0.45 <= took < 1.5, f"answered after {took:.3f} s (first attempt 0.5 s, limit 2 s)")
    return {"direct_s": round(direct_took, 3), "answered_s": round(took, 3)}


MODES = {"fallback": fallback, "strict": strict, "budget": budget}


def main():
    if len(sys.argv) != 4 or sys.argv[1] not in MODES:
        sys.exit(f"usage: policy_sim_check.py {{{'|'.join(MODES)}}} GUARDED_URI DIRECT_URI")
    mode, guarded, direct = sys.argv[1:]
    result = MODES[mode](guarded, direct)
    print(f"OK {mode} {json.dumps(result)}", flush=True)


if __name__ == "__main__":
    main()
