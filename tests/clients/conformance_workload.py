"""The conformance workload, run by pymongo: prints, as one JSON object, what each step answered.

Usage: python conformance_workload.py URI DATABASE PREFIX BASE MODE

The collection is DATABASE.orders; the tenants are PREFIX-hot, PREFIX-a and PREFIX-b, and the
ids BASE+n (tests/front_conformance.rs seeds BASE+1..BASE+16 before the run). MODE is `front`
(also run the forms the front refuses, under "refused") or `direct`. The same steps are in
conformance_workload.mjs, conformance_mongosh.js and the Rust driver's run in
tests/front_conformance.rs; the test compares a client's output against the front with its
output against one plain server.
"""

import sys

from bson.json_util import CANONICAL_JSON_OPTIONS, dumps
from pymongo import MongoClient, ReturnDocument
from pymongo.errors import BulkWriteError, OperationFailure


def bulk_error(e):
    d = e.details
    return {
        "inserted": d.get("nInserted"),
        "errors": [[w["index"], w["code"]] for w in d.get("writeErrors", [])],
    }


def refused(f):
    try:
        f()
        return None
    except OperationFailure as e:
        return e.code


def main(uri, database, prefix, base, mode):
    base = int(base)
    hot, a, b = prefix + "-hot", prefix + "-a", prefix + "-b"
    client = MongoClient(uri, serverSelectionTimeoutMS=5000)
    orders = client[database]["orders"]
    out = []

    def step(name, value):
        out.append([name, value])

    def order(n, tenant, total, state):
        return {"_id": base + n, "customerId": tenant, "total": total, "state": state}

    # Inserts, ordered and unordered, each with a duplicate id in the middle (base+1 is a seeded
    # document, base+101 one this run inserted).
    try:
        orders.insert_many(
            [order(101, hot, 5, "ready"), order(102, hot, 15, "ready"), order(1, hot, 0, "x"),
             order(103, hot, 25, "ready")])
        step("insert ordered", "no error")
    except BulkWriteError as e:
        step("insert ordered", bulk_error(e))
    try:
        orders.insert_many(
            [order(104, hot, 35, "ready"), order(101, hot, 0, "x"), order(105, a, 45, "new")],
            ordered=False)
        step("insert unordered", "no error")
    except BulkWriteError as e:
        step("insert unordered", bulk_error(e))
    r = orders.insert_one(order(106, b, 55, "new"))
    step("insert one", r.inserted_id)

    # Updates: by id, many, upserts.
    def update(r):
        return [r.matched_count, r.modified_count, r.upserted_id]

    step("update by id", update(orders.update_one(
        {"customerId": hot, "_id": base + 2}, {"$set": {"total": 21}})))
    step("update by filter", update(orders.update_one(
        {"customerId": hot, "total": {"$gt": 60, "$lt": 75}}, {"$set": {"flag": True}})))
    step("update many", update(orders.update_many(
        {"customerId": hot, "total": {"$gte": 50}}, {"$inc": {"total": 1}})))
    step("update many none", update(orders.update_many(
        {"customerId": a, "state": "nothing"}, {"$set": {"x": 1}})))
    step("upsert new", update(orders.update_one(
        {"customerId": a, "_id": base + 200}, {"$set": {"total": 7, "state": "new"}},
        upsert=True)))
    step("upsert existing", update(orders.update_one(
        {"customerId": a, "_id": base + 200}, {"$inc": {"total": 1}}, upsert=True)))
    step("replace upsert", update(orders.replace_one(
        {"customerId": b, "_id": base + 201}, {"customerId": b, "total": 9, "state": "new"},
        upsert=True)))

    # findAndModify in its forms.
    step("findOneAndUpdate after", orders.find_one_and_update(
        {"customerId": hot, "state": "ready"}, {"$set": {"state": "taken"}},
        sort=[("_id", 1)], return_document=ReturnDocument.AFTER))
    step("findOneAndUpdate before", orders.find_one_and_update(
        {"customerId": hot, "state": "ready"}, {"$set": {"state": "taken"}},
        sort=[("total", -1)], return_document=ReturnDocument.BEFORE))
    step("findOneAndUpdate none", orders.find_one_and_update(
        {"customerId": hot, "state": "nothing"}, {"$set": {"state": "taken"}}))
    step("findOneAndUpdate upsert", orders.find_one_and_update(
        {"customerId": b, "_id": base + 202}, {"$set": {"total": 3}}, upsert=True,
        return_document=ReturnDocument.AFTER))
    step("findOneAndReplace", orders.find_one_and_replace(
        {"customerId": b, "_id": base + 15}, {"customerId": b, "total": 0, "state": "replaced"},
        return_document=ReturnDocument.AFTER))
    step("findOneAndReplace projection", orders.find_one_and_replace(
        {"customerId": a, "_id": base + 12}, {"customerId": a, "total": 1, "state": "replaced"},
        projection={"total": 1, "_id": 0}))
    step("findOneAndDelete", orders.find_one_and_delete({"customerId": a, "_id": base + 11}))
    step("findOneAndDelete sorted", orders.find_one_and_delete(
        {"customerId": hot, "state": "done"}, sort=[("total", 1)]))

    # Deletes.
    step("deleteOne", orders.delete_one({"customerId": hot, "_id": base + 3}).deleted_count)
    step("deleteOne none", orders.delete_one({"customerId": hot, "_id": base + 999}).deleted_count)
    step("deleteMany", orders.delete_many(
        {"customerId": hot, "state": "done", "total": {"$lt": 90}}).deleted_count)

    # Finds: filters, projections, sorts, skip and limit, small batches (getMore).
    step("find sorted", list(orders.find(
        {"customerId": hot, "total": {"$gt": 20}}, {"total": 1, "state": 1},
        sort=[("total", -1)], skip=1, limit=5, batch_size=2)))
    step("find $in", list(orders.find(
        {"customerId": hot, "state": {"$in": ["ready", "taken"]}},
        sort=[("_id", 1)], batch_size=2)))
    step("find tenants", list(orders.find(
        {"customerId": {"$in": [a, b]}}, {"_id": 0, "customerId": 1, "total": 1},
        sort=[("customerId", 1), ("total", -1)], batch_size=3)))
    step("find one", orders.find_one({"customerId": hot, "_id": base + 5}))
    step("find none", orders.find_one({"customerId": hot, "_id": base + 3}))
    step("find and", list(orders.find(
        {"$and": [{"customerId": hot}, {"total": {"$lte": 80}}], "state": {"$ne": "taken"}},
        sort=[("total", 1), ("_id", 1)], limit=3)))

    # Counts, distinct, an aggregation.
    step("count", orders.count_documents({"customerId": hot}))
    step("count filtered", orders.count_documents({"customerId": hot, "total": {"$lt": 50}}))
    step("count skip limit", orders.count_documents({"customerId": hot}, skip=2, limit=3))
    step("distinct", sorted(orders.distinct("state", {"customerId": hot}), key=str))
    step("distinct tenants", sorted(orders.distinct("customerId", {"customerId": {"$in": [a, b]}})))
    step("aggregate", list(orders.aggregate([
        {"$match": {"customerId": hot}},
        {"$group": {"_id": "$state", "n": {"$sum": 1}, "total": {"$sum": "$total"}}},
        {"$sort": {"_id": 1}},
    ])))
    step("aggregate batches", list(orders.aggregate([
        {"$match": {"customerId": {"$in": [hot, a]}}},
        {"$sort": {"_id": 1}},
        {"$project": {"total": 1}},
    ], batchSize=2)))

    # What is left, tenant by tenant.
    for tenant in (hot, a, b):
        step("final " + tenant[len(prefix):], list(orders.find({"customerId": tenant},
                                                               sort=[("_id", 1)])))

    result = {"client": "pymongo " + __import__("pymongo").version, "steps": out}
    if mode == "front":
        result["refused"] = {
            "no tenant": refused(lambda: list(orders.find({"total": 50}))),
            "lookup": refused(lambda: list(orders.aggregate([
                {"$match": {"customerId": hot}},
                {"$lookup": {"from": "x", "as": "y", "localField": "a", "foreignField": "b"}},
            ]))),
            "watch": refused(lambda: orders.watch().close()),
        }
    client.close()
    # Canonical extended JSON: an int32, an int64 and a double stay apart.
    print(dumps(result, json_options=CANONICAL_JSON_OPTIONS))


if __name__ == "__main__":
    main(*sys.argv[1:6])
