"""Decoding the local cluster's own compact JSON faster, with json's result every time.

The embedded API server stores and streams compact JSON (``store.dumps``), which the runtime's
watches and the server's own patches decode again: a pod's 4 kB each time, thousands of times
while a gang starts. orjson decodes it in about half json's time, but reads an integer past 64
bits as a float and refuses what json accepts (NaN, Infinity, lone surrogates). :func:`loads`
keeps orjson's result only when orjson writes it back as the very bytes it read: no changed
value, float written otherwise, or duplicated key can do that, and where they agree the two
decoders give equal values. Anything else (and text that is not compact, such as a client's
request body: do not use it there) is decoded by json.
"""

from __future__ import annotations

import json
from typing import Any

_ORJSON: Any
try:
    import orjson as _ORJSON
except ImportError:  # a development install without the operator's dependencies: json alone
    _ORJSON = None


def loads(data: bytes) -> Any:
    """``json.loads(data)``, by orjson where it reads ``data`` exactly."""
    if _ORJSON is not None:
        try:
            value = _ORJSON.loads(data)
        except ValueError:  # orjson.JSONDecodeError
            pass
        else:
            try:
                if _ORJSON.dumps(value) == data:
                    return value
            except TypeError:  # orjson.JSONEncodeError
                pass
    return json.loads(data)
