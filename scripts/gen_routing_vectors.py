#!/usr/bin/env python3
"""Generate tests/vectors/routing.json: routing test vectors for reshard.

The vectors are computed here, independently of the Rust implementation, from
the rules in the project's design document ("Routing") and the reference `xxhash` package, so that
`tests/routing_vectors.rs` checks the Rust code against a second
implementation, and applications in other languages can check theirs.

Run it from the repository root:

    python3 -m venv /tmp/vecvenv
    /tmp/vecvenv/bin/pip install xxhash
    /tmp/vecvenv/bin/python scripts/gen_routing_vectors.py

The output is deterministic; re-running it must not change the file.
"""

import json
import struct
import uuid
from pathlib import Path

import xxhash

OUTPUT = Path(__file__).resolve().parent.parent / "tests" / "vectors" / "routing.json"


def h(data: bytes) -> int:
    """h(bytes) = xxHash64, seed 0."""
    return xxhash.xxh64_intdigest(data, seed=0)


def encode(key: dict) -> bytes:
    """The routing encoding of a key in its JSON form."""
    kind = key["type"]
    if kind == "string":
        return key["value"].encode("utf-8")
    if kind == "int":
        return struct.pack("<q", key["value"])
    if kind == "object_id":
        data = bytes.fromhex(key["value"])
        assert len(data) == 12
        return data
    if kind == "binary":
        return bytes.fromhex(key["value"])  # the subtype is not encoded
    raise ValueError(f"no encoding for {kind}")


def sub_bucket(id_key: dict, buckets: int) -> int:
    return 0 if buckets == 1 else h(encode(id_key)) % buckets


def vbucket(tenant: dict, sub: int, virtual_buckets: int) -> int:
    if sub == 0:
        return h(encode(tenant)) % virtual_buckets
    return h(encode(tenant) + b"\x00" + struct.pack("<I", sub)) % virtual_buckets


def string(value):
    return {"type": "string", "value": value}


def integer(value):
    return {"type": "int", "value": value}


def object_id(value):
    return {"type": "object_id", "value": value}


def binary(subtype, data: bytes):
    return {"type": "binary", "subtype": subtype, "value": data.hex()}


def uuid_key(text):
    return binary(4, uuid.UUID(text).bytes)


TENANTS = [
    string("cust-0001"),
    string("hot-customer"),
    string(""),
    string("Kunde-Müller"),
    string("顧客-東京"),
    string("клиент"),
    integer(0),
    integer(42),
    integer(-1),
    integer(-9223372036854775808),
    integer(9223372036854775807),
    object_id("650f1a2b3c4d5e6f708192a3"),
    uuid_key("123e4567-e89b-12d3-a456-426614174000"),
    binary(0, bytes([0x00, 0xFF, 0x10])),
]

IDS = [
    object_id("000000000000000000000000"),
    object_id("65a1b2c3d4e5f60718293a4b"),
    object_id("ffffffffffffffffffffffff"),
    integer(1),
    integer(123456789),
    integer(-42),
    integer(-9223372036854775808),
    integer(9223372036854775807),
    string("order-1"),
    string(""),
    string("заказ-7"),
    uuid_key("00000000-0000-0000-0000-000000000000"),
    uuid_key("f47ac10b-58cc-4372-a567-0e02b2c3d479"),
    binary(0, b""),
    binary(5, bytes(range(32))),
]

BUCKETS = [1, 2, 16, 64, 1000]
VIRTUAL_BUCKETS = [1024, 4096, 7]


def cases():
    out = []
    # Every tenant with every bucket count, cycling through ids and V, so each
    # key type meets each bucket count and each V.
    for t, tenant in enumerate(TENANTS):
        for b, buckets in enumerate(BUCKETS):
            id_key = IDS[(t * len(BUCKETS) + b) % len(IDS)]
            virtual_buckets = VIRTUAL_BUCKETS[(t + b) % len(VIRTUAL_BUCKETS)]
            out.append(case(tenant, id_key, virtual_buckets, buckets))
    # Every id once more under a hot tenant with 16 buckets and V = 1024.
    for id_key in IDS:
        out.append(case(string("hot-customer"), id_key, 1024, 16))
    return out


def case(tenant, id_key, virtual_buckets, buckets):
    sub = sub_bucket(id_key, buckets)
    return {
        "tenant": tenant,
        "id": id_key,
        "virtual_buckets": virtual_buckets,
        "buckets": buckets,
        "tenant_encoding": encode(tenant).hex(),
        "tenant_hash": str(h(encode(tenant))),
        "sub_bucket": sub,
        "vbucket": vbucket(tenant, sub, virtual_buckets),
    }


# BSON values (canonical extended JSON) and the key they read as, or the error.
BSON_CASES = [
    {"bson": {"$numberInt": "7"}, "key": integer(7)},
    {"bson": {"$numberLong": "7"}, "key": integer(7)},
    # A whole double is the integer MongoDB takes it for (7 and 7.0 are one _id there).
    {"bson": {"$numberDouble": "7.0"}, "key": integer(7)},
    {"bson": {"$numberDouble": "-0.0"}, "key": integer(0)},
    {"bson": "cust-1", "key": string("cust-1")},
    {"bson": {"$oid": "650f1a2b3c4d5e6f708192a3"}, "key": object_id("650f1a2b3c4d5e6f708192a3")},
    {
        "bson": {"$binary": {"base64": "Ej5FZ+ibEtOkVkJmFBdAAA==", "subType": "04"}},
        "key": uuid_key("123e4567-e89b-12d3-a456-426614174000"),
    },
]

ERROR_CASES = [
    {"bson": {"$numberDouble": "1.5"}, "error": "unsupported_key_type", "bson_type": "double"},
    {"bson": {"$numberDouble": "NaN"}, "error": "unsupported_key_type", "bson_type": "double"},
    {"bson": True, "error": "unsupported_key_type", "bson_type": "bool"},
    {"bson": None, "error": "unsupported_key_type", "bson_type": "null"},
    {"bson": {"$date": {"$numberLong": "0"}}, "error": "unsupported_key_type", "bson_type": "date"},
    {"bson": {"$numberDecimal": "1"}, "error": "unsupported_key_type", "bson_type": "decimal"},
    {"bson": {"a": {"$numberInt": "1"}}, "error": "unsupported_key_type", "bson_type": "object"},
    {"bson": [{"$numberInt": "1"}], "error": "unsupported_key_type", "bson_type": "array"},
]


def main():
    document = {
        "description": (
            "Routing test vectors for reshard. Given a tenant key value t, a document id, "
            "V = virtual_buckets and n = buckets (the tenant's bucket count), an implementation "
            "must compute tenant_hash = h(enc(t)), sub_bucket and vbucket exactly as listed. "
            "Keys are in reshard's JSON form: string and int carry their value, object_id and "
            "binary carry lowercase hex bytes. bson_cases give BSON values (canonical extended "
            "JSON) and the key they read as; error_cases give values that must be refused. "
            "Generated by scripts/gen_routing_vectors.py with the reference xxhash package."
        ),
        "rules": [
            "h(bytes) = xxHash64 with seed 0, as an unsigned 64-bit integer",
            "enc(string) = its UTF-8 bytes",
            "a double with a whole value in [-2^63, 2^63) reads as that int64 (MongoDB compares "
            "7 and 7.0 as equal); any other double is an error",
            "enc(int32 or int64) = the 8 bytes of the value as a signed 64-bit integer, little-endian",
            "enc(ObjectId) = its 12 bytes",
            "enc(binary of any subtype, UUID is subtype 4) = its raw bytes, subtype not included",
            "any other BSON type is an error",
            "sub_bucket = 0 if n = 1, else h(enc(id)) mod n",
            "vbucket = h(enc(t)) mod V if sub_bucket = 0, "
            "else h(enc(t) || 0x00 || u32le(sub_bucket)) mod V",
            "shard = the placement range [start, end) that contains vbucket",
        ],
        "cases": cases(),
        "bson_cases": BSON_CASES,
        "error_cases": ERROR_CASES,
    }
    OUTPUT.parent.mkdir(parents=True, exist_ok=True)
    OUTPUT.write_text(json.dumps(document, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {len(document['cases'])} cases to {OUTPUT}")


if __name__ == "__main__":
    main()
