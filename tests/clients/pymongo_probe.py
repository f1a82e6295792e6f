"""Connects pymongo to a `reshard front` and prints, as one JSON object, what it was answered.

Usage: python pymongo_probe.py URI. tests/front_wire.rs runs it and checks the answers.
"""

import json
import sys

from pymongo import MongoClient
from pymongo.errors import ConfigurationError, OperationFailure


def main(uri):
    client = MongoClient(uri, serverSelectionTimeoutMS=5000)
    out = {"client": "pymongo " + __import__("pymongo").version}
    out["ping"] = client.admin.command("ping")
    hello = client.admin.command("hello")
    hello.pop("localTime", None)
    out["hello"] = hello
    out["buildInfo"] = client.admin.command("buildInfo")["version"]
    try:
        client.admin.command("frobnicate")
        out["unknown"] = None
    except OperationFailure as e:
        out["unknown"] = {
            "code": e.code,
            "codeName": e.details.get("codeName"),
            "errmsg": e.details.get("errmsg"),
        }
    # The front advertises no sessions, so pymongo must refuse to use an explicit one (and
    # sends no lsid, nor retries writes, on its own).
    session = client.start_session()
    try:
        client.admin.command("ping", session=session)
        out["sessions"] = "supported"
    except ConfigurationError as e:
        out["sessions"] = "refused: " + str(e)
    finally:
        session.end_session()
    client.close()
    print(json.dumps(out, default=str))


if __name__ == "__main__":
    main(sys.argv[1])
