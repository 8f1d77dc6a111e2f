"""A paced honest reader through pymongo, for the chaos-clients harness (tests/chaos/harness/py.rs).

Usage: python py_reader.py URI NS MODE TAGS_JSON MAX_TIME_MS EVERY_MS START_UNIX_MS STOP_UNIX_MS PREFIX

Reads `find_one({})` on NS (`db.coll`) with read preference MODE (and tag sets TAGS_JSON,
`[]` for none), `maxTimeMS` MAX_TIME_MS, one read every EVERY_MS from START_UNIX_MS until
STOP_UNIX_MS, each with `comment` PREFIX/<seq>. Prints one JSON object per read:
{"comment", "sent_unix_ms", "took_ms", "outcome"} with outcome "ok", "code N",
"staleguard N" (an error whose message starts with "staleguard:"), "network" or "gave up".
"""

import json
import sys
import time

from pymongo import MongoClient
from pymongo.errors import NetworkTimeout, OperationFailure, PyMongoError
from pymongo.read_preferences import Nearest, Secondary, SecondaryPreferred


def main():
    uri, ns, mode, tags, max_time, every, start, stop, prefix = sys.argv[1:10]
    tags = json.loads(tags) or None
    pref = {"secondary": Secondary, "secondaryPreferred": SecondaryPreferred, "nearest": Nearest}[mode]
    pref = pref(tag_sets=tags) if tags else pref()
    db, coll = ns.split(".", 1)
    client = MongoClient(uri, socketTimeoutMS=int(max_time) * 3 + 2000, serverSelectionTimeoutMS=5000)
    collection = client[db].get_collection(coll, read_preference=pref)
    every, start, stop = int(every) / 1000.0, int(start) / 1000.0, int(stop) / 1000.0
    nxt, seq = start, 0
    while nxt < stop:
        time.sleep(max(0.0, nxt - time.time()))
        nxt += every
        nxt = max(nxt, time.time())
        seq += 1
        comment = f"{prefix}/{seq}"
        sent = time.time()
        try:
            collection.find_one({}, max_time_ms=int(max_time), comment=comment)
            outcome = "ok"
        except OperationFailure as e:
            msg = (e.details or {}).get("errmsg", "")
            outcome = f"staleguard {e.code}" if msg.startswith("staleguard:") else f"code {e.code}"
        except NetworkTimeout:
            outcome = "gave up"
        except PyMongoError:
            outcome = "network"
        took = (time.time() - sent) * 1000.0
        line = {"comment": comment, "sent_unix_ms": sent * 1000.0, "took_ms": took, "outcome": outcome}
        print(json.dumps(line), flush=True)
    client.close()


if __name__ == "__main__":
    main()
