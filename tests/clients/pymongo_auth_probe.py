"""Authenticates pymongo to a `reshard front` (SCRAM-SHA-256) and prints, as one JSON object,
what it was answered with a right password, a wrong one and none.

Usage: python pymongo_auth_probe.py GOOD_URI BAD_URI NONE_URI. tests/front_auth.rs runs it and
checks the answers.
"""

import json
import sys

from pymongo import MongoClient
from pymongo.errors import OperationFailure


def error(e):
    return {"code": e.code, "codeName": e.details.get("codeName"), "errmsg": e.details.get("errmsg")}


def main(good_uri, bad_uri, none_uri):
    out = {"client": "pymongo " + __import__("pymongo").version}

    good = MongoClient(good_uri, serverSelectionTimeoutMS=5000)
    status = good.admin.command("connectionStatus")
    out["good"] = {
        "ping": good.admin.command("ping")["ok"],
        "buildInfo": good.admin.command("buildInfo")["version"],
        "users": status["authInfo"]["authenticatedUsers"],
        "getCmdLineOpts": good.admin.command("getCmdLineOpts")["ok"],
    }
    good.close()

    bad = MongoClient(bad_uri, serverSelectionTimeoutMS=5000)
    try:
        bad.admin.command("ping")
        out["bad"] = None
    except OperationFailure as e:
        out["bad"] = error(e)
    bad.close()

    none = MongoClient(none_uri, serverSelectionTimeoutMS=5000)
    out["none"] = {
        "ping": none.admin.command("ping")["ok"],
        "buildInfo": none.admin.command("buildInfo")["version"],
    }
    try:
        none.admin.command("getCmdLineOpts")
        out["none"]["getCmdLineOpts"] = None
    except OperationFailure as e:
        out["none"]["getCmdLineOpts"] = error(e)
    none.close()
    print(json.dumps(out, default=str))


if __name__ == "__main__":
    main(*sys.argv[1:4])
