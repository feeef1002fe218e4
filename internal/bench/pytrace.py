"""The trace function in Python, for `brisk replay --python`: the built-in
trace function's protocol (requested_cpu / requested_memory headers, or a
{"ms": N, "mb": M} body; a reply with ExecutionTime in microseconds) as a
function deployed from source with the http contract. Its imports are
those of a typical web function (~100 ms on a 2-core machine): what a
fresh sandbox pays at every cold start and a template once."""

import json, decimal, asyncio, email.mime.multipart, xml.etree.ElementTree, http.server  # noqa: F401
import math
import os
import time

FUNCTION = os.environ.get("BRISK_FUNCTION", "")
PAGE = 4096


def handle(event, context):
    ms = mb = 0.0
    try:
        ms = float(event.headers.get("requested_cpu", ""))
        mb = float(event.headers.get("requested_memory", ""))
    except ValueError:
        if event.body:
            req = json.loads(event.body)
            ms, mb = float(req.get("ms") or 0), float(req.get("mb") or 0)
    start = time.monotonic()
    mem = bytearray(int(mb * (1 << 20)))
    for i in range(0, len(mem), PAGE):
        mem[i] = 1
    x = 2.0
    end = start + ms / 1000.0
    while time.monotonic() < end:
        for j in range(200):
            x = math.sqrt(x + j)
    us = int((time.monotonic() - start) * 1e6)
    sandbox = os.environ.get("BRISK_SANDBOX_ID", "")
    return {"statusCode": 200, "headers": {"Content-Type": "application/json"},
            "body": json.dumps({"Status": "OK", "Function": FUNCTION, "MachineName": sandbox, "ExecutionTime": us,
                                "sandbox": sandbox, "exec_us": us, "requested_ms": ms, "mb": mb})}
