"""The one place that knows how s3fs and botocore report failures, for the retry policy.

s3fs retries a few errors itself (botocore retries 5xx answers too), and then raises
what is left in forms :func:`nodes.storage.retry.is_transient` would not recognise:

- an S3 error answer becomes an ``OSError`` raised from botocore's ``ClientError``, whose
  ``response`` holds the HTTP status; a 503 ``SlowDown`` becomes ``OSError(EBUSY)``;
- network trouble is botocore's own exception classes (connection refused or closed, a
  body cut short), which are not ``OSError`` and come from neither aiohttp nor requests.

botocore is imported only when it is loaded already: an error can be one of its classes
only then, and s3fs is an optional extra.
"""

from __future__ import annotations

import sys


def http_status(error: BaseException) -> int | None:
    """The HTTP status of the S3 answer behind ``error`` (botocore's ``ClientError``, or an
    s3fs error raised from one), if any."""
    for candidate in (error, error.__cause__):
        response = getattr(candidate, "response", None)
        if isinstance(response, dict):
            status = (response.get("ResponseMetadata") or {}).get("HTTPStatusCode")
            if isinstance(status, int):
                return status
    return None


def is_network_error(error: BaseException) -> bool:
    """Whether ``error`` is one of botocore's network failures (which may clear up)."""
    if "botocore" not in sys.modules:
        return False
    from botocore import exceptions

    network = (exceptions.ConnectionError, exceptions.HTTPClientError)
    return isinstance(error, network + (exceptions.IncompleteReadError,))
