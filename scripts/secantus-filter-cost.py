#!/usr/bin/env python3
"""What a conditional update by _id costs on the local stand-in, by filter shape.

Starts a fresh secantusd-py on a free port, fills one collection with N documents shaped like
the campaign's orders, and times update_one by three filters:
  {_id}                         the plain point update
  {_id, customerId}             a conjunction of equalities
  {_id, $or: [...]}             the shape of a mirror's and the copy back's conditional write

Real MongoDB serves all three from the _id index. The figures say whether the stand-in does;
see BENCHMARKS.md, "The stand-in's cost of a conditional write".

Usage: .venv/bin/python scripts/secantus-filter-cost.py [N ...]   (default 1000 5000 20000)
"""
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pymongo import MongoClient

UPDATES = 200


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_binary():
    local = Path(__file__).resolve().parent.parent / ".venv" / "bin" / "secantusd-py"
    return str(local) if local.exists() else shutil.which("secantusd-py")


def start():
    port = free_port()
    proc = subprocess.Popen([server_binary(), "--host", "127.0.0.1", "--port", str(port),
                             "--storage-path", ":memory:"],
                            cwd=tempfile.mkdtemp(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    client = MongoClient(f"mongodb://127.0.0.1:{port}/?directConnection=true",
                         serverSelectionTimeoutMS=20000)
    client.admin.command("ping")
    return proc, client


def per_update_ms(coll, n, shape):
    ids = [(i * 7919) % n for i in range(UPDATES)]
    start_at = time.perf_counter()
    for i in ids:
        if shape == "_id":
            flt = {"_id": i}
        elif shape == "_id+customerId":
            flt = {"_id": i, "customerId": f"c{i % 50}"}
        else:
            # envelope::mirror's filter: not this migration's image, or an older revision.
            flt = {"_id": i, "$or": [{"_reshard.mig": {"$ne": 2}},
                                     {"_reshard.rev": {"$lt": 10**9}}]}
        result = coll.update_one(flt, {"$inc": {"n": 1}})
        assert result.matched_count == 1, (shape, i)
    return (time.perf_counter() - start_at) * 1000 / UPDATES


def main():
    sizes = [int(a) for a in sys.argv[1:]] or [1000, 5000, 20000]
    print(f"{'docs':>7} {'{_id}':>10} {'{_id,customerId}':>18} {'{_id,$or}':>12}   ms per update_one")
    for n in sizes:
        proc, client = start()
        try:
            coll = client.probe.orders
            coll.insert_many([{"_id": i, "customerId": f"c{i % 50}", "n": 0,
                               "_reshard": {"mig": 1, "rev": 1}} for i in range(n)])
            row = [per_update_ms(coll, n, s) for s in ("_id", "_id+customerId", "_id+$or")]
            print(f"{n:>7} {row[0]:>10.2f} {row[1]:>18.2f} {row[2]:>12.2f}")
        finally:
            client.close()
            proc.terminate()
            proc.wait()


if __name__ == "__main__":
    main()
