"""An order service that does not know reshard exists: Python and pymongo, nothing else.

The Python twin of ``examples/orders_front.rs``: it talks MongoDB to whatever ``--uri`` names
(a ``mongos``, a plain server, or ``reshard front``, which moves the collection under it while
it runs; the connection string is the only thing that differs). Worker threads run the same
workload as ``orders_front`` (Zipf-distributed customers with ``cust-hot`` taking
``--hot-share``, inserts, partial updates, replaces, deletes, re-creates, reads by
``{customerId, _id}`` and listings by customer, both compared with what the worker knows) and
write the same ledger of acknowledged writes (JSON lines, ``src/ledger.rs``), so
``orders_front --check`` and ``orders_app --check`` judge it too. ``--check`` reads every id
of the ledger through ``--uri`` and reports lost writes, resurrected deletes and wrong
contents. Both print a JSON summary and exit 1 on any anomaly (2 on an error).

    reshard front --listen 127.0.0.1:27018 --database shop &
    .venv/bin/python examples/orders_service.py --duration 30s --ledger /tmp/orders-py.jsonl
    .venv/bin/python examples/orders_service.py --check --ledger /tmp/orders-py.jsonl

pymongo comes with ``scripts/install-secantus.sh`` (into ``.venv``).
"""

import argparse
import bisect
import datetime
import json
import random
import re
import secrets
import signal
import sys
import threading
import time
import traceback

import pymongo
from pymongo.errors import PyMongoError


def duration(text):
    """`30s`, `10m`, `1h30m`, `500ms` in seconds."""
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}
    parts = re.findall(r"(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)", text)
    if not parts or re.sub(r"(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)|\s", "", text):
        raise argparse.ArgumentTypeError(f"not a duration: {text!r}")
    return sum(float(n) * units[u] for n, u in parts)


class Zipf:
    """Samples customer ranks 1..=n with probability proportional to 1/k^s."""

    def __init__(self, n, s):
        self.cumulative, total = [], 0.0
        for k in range(1, n + 1):
            total += 1.0 / k**s
            self.cumulative.append(total)

    def sample(self, rng):
        return bisect.bisect_left(self.cumulative, rng.random() * self.cumulative[-1]) + 1


def pick_tenant(rng, zipf, hot_share):
    if hot_share is not None and rng.random() < min(max(hot_share, 0.0), 1.0):
        rank = 1
    elif hot_share is not None and len(zipf.cumulative) > 1:
        rank = 1
        while rank == 1:
            rank = zipf.sample(rng)
    else:
        rank = zipf.sample(rng)
    return "cust-hot" if rank == 1 else f"cust-{rank:04}"


def app_fields(doc):
    """The fields the application controls, as the ledger records them (None: no document);
    as with the Rust driver's getters, a field of another type reads as "" or 0."""
    if doc is None:
        return None
    fields = {}
    for key, default in (("customerId", ""), ("qty", 0), ("status", ""), ("version", 0)):
        v = doc.get(key)
        ok = type(v) is type(default) and (type(v) is str or -(2**31) <= v < 2**31)
        fields[key] = v if ok else default
    return fields


def get(orders, tenant, oid):
    """One order, read by its customer and id."""
    return orders.find_one({"customerId": tenant, "_id": oid})


class Shared:
    def __init__(self, ledger):
        self.ledger, self.seq, self.lock = ledger, 0, threading.Lock()
        self.counts = {"ops": 0, "acknowledged_writes": 0, "reads": 0, "listings": 0,
                       "errors": 0, "read_anomalies": 0, "anomaly_examples": [],
                       "error_examples": []}

    def log(self, worker, op, tenant, oid, doc):
        with self.lock:  # seq is global and increasing, as the ledger's check needs
            entry = {"seq": self.seq, "worker": worker, "op": op, "tenant": tenant,
                     "id": oid, "doc": doc}
            self.seq += 1
            self.ledger.write(json.dumps(entry, separators=(",", ":")) + "\n")

    def count(self, key, example=None, examples=None):
        with self.lock:
            self.counts[key] += 1
            if example is not None and len(self.counts[examples]) < 20:
                self.counts[examples].append(example)

    def anomaly(self, what):
        self.count("read_anomalies", what, "anomaly_examples")


class Worker:
    def __init__(self, n, seed, prefix):
        self.n, self.prefix, self.next_id = n, prefix, 0
        self.rng = random.Random(seed ^ ((n * 0x9E3779B97F4A7C15) % 2**64))
        self.orders = {}  # id -> [customer, what it holds (None: deleted)]

    def pick(self, live):
        candidates = [i for i, (_, d) in self.orders.items() if (d is not None) == live]
        if not candidates:
            return None
        oid = self.rng.choice(candidates)
        return oid, *self.orders[oid]

    def resync(self, orders, shared, tenant, oid):
        """After a write whose effect is unknown: reads the order until a read succeeds, and
        records what it holds."""
        for _ in range(40):
            try:
                found = get(orders, tenant, oid)
            except PyMongoError:
                time.sleep(0.25)
                continue
            return self.wrote(shared, "resync", tenant, oid, found)
        # Unknown: forget the order rather than guess (the check reports a stale entry).
        self.orders.pop(oid, None)

    def step(self, orders, shared, zipf, hot, list_percent):
        list_percent = min(list_percent, 100)
        r = self.rng.randrange(100)
        roll = r * 95 // max(100 - list_percent, 1) if r < 100 - list_percent else 95
        shared.count("ops")
        touched = None  # the order a write touches, for a resync when its outcome is unknown
        try:
            if roll < 30:  # insert a new order
                tenant = pick_tenant(self.rng, zipf, hot)
                oid = f"{self.prefix}{self.n}-{self.next_id}"
                self.next_id += 1
                doc = {"_id": oid, "customerId": tenant, "qty": 1, "status": "new",
                       "version": 1, "createdAt": datetime.datetime.now(datetime.timezone.utc)}
                self.orders[oid] = [tenant, None]
                touched = (tenant, oid)
                orders.insert_one(doc)
                self.wrote(shared, "insert", tenant, oid, doc)
            elif roll < 80 and (picked := self.pick(live=roll < 75)):
                oid, tenant, doc = picked
                touched, key = (tenant, oid), {"customerId": tenant, "_id": oid}
                if roll < 55:  # partial update
                    r = orders.update_one(key, {"$inc": {"qty": 1, "version": 1},
                                                "$set": {"status": "paid"}})
                    new = {**doc, "qty": doc["qty"] + 1, "version": doc["version"] + 1,
                           "status": "paid"}
                    if r.matched_count == 1:
                        self.wrote(shared, "update", tenant, oid, new)
                    else:
                        shared.anomaly(f"update of live {oid} matched {r.matched_count}")
                elif roll < 65:  # replace the whole order
                    new = {"_id": oid, "customerId": tenant, "qty": 7, "status": "replaced",
                           "version": doc["version"] + 1}
                    r = orders.replace_one(key, new)
                    if r.matched_count == 1:
                        self.wrote(shared, "replace", tenant, oid, new)
                    else:
                        shared.anomaly(f"replace of live {oid} matched {r.matched_count}")
                elif roll < 75:  # delete
                    r = orders.delete_one(key)
                    if r.deleted_count != 1:
                        shared.anomaly(f"delete of live {oid} deleted {r.deleted_count}")
                    self.wrote(shared, "delete", tenant, oid, None)
                else:  # re-create a deleted order
                    new = {"_id": oid, "customerId": tenant, "qty": 3, "status": "recreated",
                           "version": 1}
                    orders.insert_one(new)
                    self.wrote(shared, "recreate", tenant, oid, new)
            elif 80 <= roll < 95 and (picked := self.pick(live=self.rng.random() < 0.8)):
                # Read one of my orders and compare with what I know.
                oid, tenant, known = picked
                found = get(orders, tenant, oid)
                shared.count("reads")
                if app_fields(known) != app_fields(found):
                    shared.anomaly(f"read {oid}: expected {app_fields(known)}, "
                                   f"got {app_fields(found)}")
            elif roll >= 95:  # list a customer's orders (in batches), compare mine of theirs
                tenant = pick_tenant(self.rng, zipf, hot)
                seen = {}
                for d in orders.find({"customerId": tenant}, batch_size=200):
                    oid = d.get("_id") if isinstance(d.get("_id"), str) else repr(d.get("_id"))
                    if oid in seen:
                        shared.anomaly(f"listing of {tenant} returned {oid} twice")
                    seen[oid] = app_fields(d)
                shared.count("listings")
                for oid, (t, doc) in self.orders.items():
                    if t == tenant and seen.get(oid) != app_fields(doc):
                        shared.anomaly(f"listing of {tenant}: {oid} expected "
                                       f"{app_fields(doc)}, got {seen.get(oid)}")
            if roll < 80:
                shared.count("acknowledged_writes")
        except PyMongoError as e:
            shared.count("errors", str(e), "error_examples")
            print(f"orders_service: operation failed: {e}", file=sys.stderr, flush=True)
            # Whether a failed write happened or not, a read says (a refusal did not; a
            # connection lost on the way may or may not have).
            if touched:
                self.resync(orders, shared, *touched)

    def wrote(self, shared, op, tenant, oid, doc):
        """An acknowledged write: into the ledger, and what this worker knows."""
        shared.log(self.n, op, tenant, oid, app_fields(doc))
        self.orders[oid] = [tenant, doc]


def check(orders, path):
    """Reads every id of the ledger and compares it with the id's last entry."""
    expected = {}  # id -> (customer, its last recorded document)
    with open(path) as f:
        entries = [json.loads(line) for line in f if line.strip()]
    for e in sorted(entries, key=lambda e: e["seq"]):
        expected[e["id"]] = (e["tenant"], e["doc"])
    report = {"checked": len(expected), "lost": [], "resurrected": [], "wrong": []}
    for oid, (tenant, want) in sorted(expected.items()):
        got = app_fields(get(orders, tenant, oid))
        if got is None and want is not None:
            report["lost"].append(oid)
        elif want is None and got is not None:
            report["resurrected"].append(oid)
        elif want != got:
            report["wrong"].append({"id": oid, "expected": want, "actual": got})
    anomalies = len(report["lost"]) + len(report["resurrected"]) + len(report["wrong"])
    print(json.dumps({"check": report, "anomalies": anomalies}, indent=2))
    return anomalies == 0


def run(args):
    client = pymongo.MongoClient(args.uri)
    orders = client[args.database][args.collection]
    if args.check:
        return check(orders, args.ledger)
    seed = args.seed if args.seed is not None else secrets.randbits(64)
    print(f"orders_service: seed {seed}", file=sys.stderr, flush=True)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    zipf = Zipf(max(args.tenants, 1), args.zipf)
    deadline = time.monotonic() + args.duration
    period = max(args.workers, 1) / max(args.rate, 1)

    crashed = threading.Event()

    def work(n):
        w, next_tick = Worker(n, seed, args.id_prefix), time.monotonic()
        try:
            while time.monotonic() < deadline and not stop.wait(next_tick - time.monotonic()):
                next_tick = max(next_tick, time.monotonic()) + period  # late ticks are delayed
                w.step(orders, shared, zipf, args.hot_share, args.list_percent)
        except Exception:  # a bug here, not an answer of the server: the run fails
            traceback.print_exc()
            crashed.set()

    with open(args.ledger, "w") as ledger:
        shared = Shared(ledger)
        threads = [threading.Thread(target=work, args=(n,)) for n in range(args.workers)]
        for t in threads:
            t.start()
        for t in threads:
            while t.is_alive():
                t.join(0.2)  # wakes up for the signal handlers
    print(json.dumps({"seed": seed, "workload": shared.counts}, indent=2))
    if crashed.is_set():
        raise RuntimeError("a worker failed (its traceback is above)")
    return shared.counts["read_anomalies"] == 0


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    arg = p.add_argument
    arg("--uri", default="mongodb://127.0.0.1:27018", help="the front, a mongos or a server")
    arg("--database", default="shop")
    arg("--collection", default="orders")
    arg("--duration", type=duration, default="30s", help="how long to run: 30s, 10m, ...")
    arg("--rate", type=int, default=200, help="operations per second across all workers")
    arg("--workers", type=int, default=4, help="threads")
    arg("--tenants", type=int, default=50, help="customers; the first is cust-hot")
    arg("--zipf", type=float, default=1.2, help="Zipf exponent of the customer distribution")
    arg("--hot-share", type=float, help="cust-hot's share of the orders (0..1)")
    arg("--list-percent", type=int, default=5, help="percent of ops that list a customer")
    arg("--ledger", required=True, help="the ledger of acknowledged writes")
    arg("--check", action="store_true", help="check the ledger through --uri instead of running")
    arg("--seed", type=int)
    arg("--id-prefix", default="p", help="prefix of this instance's ids: <prefix><worker>-<n>")
    try:
        sys.exit(0 if run(p.parse_args()) else 1)
    except (PyMongoError, OSError, ValueError, RuntimeError) as e:
        print(f"orders_service: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
