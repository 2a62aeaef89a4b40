"""Run by TestPymongo (internal/e2e/devmongo_test.go) through mongobouncer.

Usage: python3 pymongo_smoke.py URI. Each result is printed as one
"key: JSON" line that the test compares with what it expects.
"""
import json
import sys

import pymongo
from pymongo import DeleteOne, InsertOne, UpdateOne
from pymongo.errors import BulkWriteError, OperationFailure


def dump(v):
    return json.dumps(v, separators=(",", ":"))


def main():
    client = pymongo.MongoClient(sys.argv[1], serverSelectionTimeoutMS=10000, connectTimeoutMS=5000,
                                 socketTimeoutMS=30000)
    try:
        coll = client.e2e_pymongo.items
        coll.drop()
        res = coll.insert_many([{"_id": i, "kind": "ab"[i % 2], "n": i} for i in range(20)])
        print("inserted: %s" % dump(len(res.inserted_ids)))

        # batch_size 3 makes pymongo fetch the rest with getMore.
        found = [d["_id"] for d in coll.find({"kind": "a"}).sort("_id", 1).batch_size(3)]
        print("find: %s" % dump(found))

        agg = list(coll.aggregate([
            {"$match": {"n": {"$lt": 10}}},
            {"$group": {"_id": "$kind", "total": {"$sum": "$n"}}},
            {"$sort": {"_id": 1}},
        ]))
        print("aggregate: %s" % dump(agg))

        with client.start_session() as s:
            r = coll.update_many({"kind": "b"}, {"$inc": {"n": 100}}, session=s)
            print("update: %s" % dump([r.matched_count, r.modified_count]))
            print("count: %s" % dump(coll.count_documents({"n": {"$gte": 100}}, session=s)))

        try:
            coll.bulk_write([InsertOne({"_id": 100}), InsertOne({"_id": 100}), InsertOne({"_id": 101}),
                             UpdateOne({"_id": 101}, {"$set": {"x": 1}}), DeleteOne({"_id": 0})],
                            ordered=False)
            print("bulk: no error")
        except BulkWriteError as e:
            d = e.details
            print("bulk: %s" % dump([d["nInserted"], d["nModified"], d["nRemoved"],
                                           [(w["index"], w["code"]) for w in d["writeErrors"]]]))

        print("ping: %s" % dump(client.admin.command("ping")["ok"]))
        try:
            client.e2e_pymongo.command("noSuchCommand")
            print("unknown command: no error")
        except OperationFailure as e:
            print("unknown command: %s" % dump(e.code))
    finally:
        client.close()


if __name__ == "__main__":
    main()
