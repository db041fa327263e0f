"""One way to show a URL: without the password of its user-info or the credentials in its query.

URLs carry credentials in two places: the user-info of fsspec's HTTP basic auth
(``http://user:PASSWORD@host/...``) and the query of pre-signed URLs (S3's
``X-Amz-Signature``, GCS's ``X-Goog-Signature``, Azure's SAS ``sig``, tokens).
:func:`shown_url` is the form every repr, state, fingerprint, error and warning
uses: the password becomes ``***`` (the user name stays), and so does the value of
every query parameter that is a credential or changes when a URL is signed again
(:data:`CREDENTIAL_PARAMETERS`, and any name holding one of
:data:`CREDENTIAL_WORDS`). Other query parameters stay as they are: they choose the
data (``?version=2``), so a change of one is a change of the recipe.

Masking names rather than the whole query is what lets a checkpoint resume after a
password rotation or a re-signing (the shown URL is the same) while a changed
``version`` is still refused. :func:`remember` notes a URL's credentials
in this process; :func:`scrubbed` and :func:`scrub_error` take every noted one out of a
text or an error raised by a storage library (its message, notes and causes): the
Loader does so for every error it raises and a DataLoader worker for every error it
sends, and a skipped record's warning is scrubbed before it is written.

>>> shown_url("http://alice:pw@host/a.jsonl?X-Amz-Signature=abc&version=2")
'http://alice:***@host/a.jsonl?X-Amz-Signature=***&version=2'
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qsl, quote, unquote, urlsplit

MASK = "***"

#: Query parameters masked by name (compared case-insensitively): the signature and
#: credential of S3 (SigV4), GCS (V4) and Azure SAS URLs, the parameters that change
#: with every signing (dates, expiry), CloudFront's signed-URL fields, and common
#: token names.
CREDENTIAL_PARAMETERS = frozenset(
    name.lower()
    for name in (
        "X-Amz-Signature", "X-Amz-Credential", "X-Amz-Security-Token", "X-Amz-Date",
        "X-Amz-Expires", "X-Goog-Signature", "X-Goog-Credential", "X-Goog-Date",
        "X-Goog-Expires", "sig", "se", "st", "skoid", "sktid", "skt", "ske", "sks", "skv",
        "Signature", "Expires", "Key-Pair-Id", "Policy", "AWSAccessKeyId",
        "token", "access_token", "id_token", "api_key", "apikey", "key", "code",
    )
)  # fmt: skip

#: A query parameter whose name holds one of these words is masked too.
CREDENTIAL_WORDS = ("token", "secret", "signature", "password", "credential", "auth", "apikey")


def is_credential(name: str) -> bool:
    """Whether the query parameter ``name`` carries a credential (or changes on re-signing)."""
    lower = name.lower()
    return lower in CREDENTIAL_PARAMETERS or any(word in lower for word in CREDENTIAL_WORDS)


def _parts(url: str) -> tuple[str, str, str, list[tuple[str, str]]] | None:
    """(scheme://, user-info, the rest before the query, query pairs), or None for a URL
    that carries no credentials (a path, or a URL without user-info and query)."""
    if "://" not in url or ("@" not in url and "?" not in url):
        return None
    try:
        split = urlsplit(url)
    except ValueError:
        return None
    userinfo, _, hostport = split.netloc.rpartition("@")
    rest = hostport + split.path
    pairs = parse_qsl(split.query, keep_blank_values=True) if split.query else []
    return f"{split.scheme}://", userinfo, rest, pairs


def shown_url(url: str) -> str:
    """``url`` with its password and query credentials as ``***``; anything else unchanged.

    >>> shown_url("https://host/x.tar?se=2026-01-01&sp=r&sig=S1")
    'https://host/x.tar?se=***&sp=r&sig=***'
    >>> shown_url("/data/a.jsonl")
    '/data/a.jsonl'
    """
    parts = _parts(url)
    if parts is None:
        return url
    scheme, userinfo, rest, pairs = parts
    if ":" in userinfo:
        userinfo = userinfo.split(":", 1)[0] + ":" + MASK
    shown = scheme + (userinfo + "@" if userinfo else "") + rest
    if pairs:
        shown += "?" + "&".join(
            f"{_quoted(name)}={MASK if is_credential(name) else _quoted(value)}"
            for name, value in pairs
        )
    elif url.endswith("?"):
        shown += "?"
    return shown


def _quoted(text: str) -> str:
    return quote(text, safe="-_.~:/,")


def secrets_of(url: str) -> list[str]:
    """The credential strings of ``url`` (its password, the values of its credential
    parameters), raw and percent-decoded, longest first: what must appear nowhere."""
    parts = _parts(url)
    if parts is None:
        return []
    _, userinfo, _, pairs = parts
    found = []
    if ":" in userinfo:
        found.append(userinfo.split(":", 1)[1])
    found += [value for name, value in pairs if is_credential(name)]
    raw = [piece for value in found for piece in (value, quote(value, safe=""), unquote(value))]
    return sorted({piece for piece in raw if len(piece) >= 3}, key=len, reverse=True)


#: The credentials of every URL this process has seen (see :func:`remember`).
_KNOWN: set[str] = set()


def remember(url: str) -> None:
    """Note the credentials of ``url``, so that :func:`scrubbed` takes them out of any text.

    Called wherever a URL enters (a recipe's file list, a listing, a file opened), in each
    process: a DataLoader worker notes those of the files it opens.
    """
    secrets = secrets_of(url)
    if secrets:
        _KNOWN.update(secrets)
        _scrub_log_records()


def remember_secret(value: object) -> None:
    """Note a credential given outside a URL (a storage option's ``secret``, ``token``):
    :func:`scrubbed` takes it out of any text too. Short values (under 4 characters) and
    non-strings are not noted: masking them would blank out ordinary words."""
    if isinstance(value, str) and len(value) >= 4:
        _KNOWN.add(value)
        _scrub_log_records()


#: A storage option whose name holds one of these words is a credential.
SECRET_OPTION_WORDS = ("secret", "token", "password", "key", "credential", "auth")


def masked_options(options: dict[str, Any]) -> dict[str, Any]:
    """Storage options as ``repr`` and fingerprints show them: credentials as ``***``,
    nested ones included (s3fs takes ``client_kwargs={"aws_secret_access_key": ...}``);
    their values are noted (:func:`remember_secret`) and taken out of every error.

    >>> masked_options({"anon": False, "client_kwargs": {"aws_secret_access_key": "k3y!"}})
    {'anon': False, 'client_kwargs': {'aws_secret_access_key': '***'}}
    """
    masked: dict[str, Any] = {}
    for name, value in options.items():
        if any(word in str(name).lower() for word in SECRET_OPTION_WORDS):
            remember_secret(value)
            masked[name] = MASK
        else:
            masked[name] = masked_options(value) if isinstance(value, dict) else value
    return masked


def scrubbing(function: Callable[..., Any]) -> Callable[..., Any]:
    """``function``, with every error that leaves it scrubbed (:func:`scrub_error`): for
    the entry points that raise outside a Loader (``dp.write``, ``dp.read_manifest``)."""

    @functools.wraps(function)
    def scrubbed_call(*args: Any, **kwargs: Any) -> Any:
        try:
            return function(*args, **kwargs)
        except BaseException as error:
            scrub_error(error)
            raise

    return scrubbed_call


def scrubbed(text: str) -> str:
    """``text`` with every credential this process knows of as ``***``.

    >>> remember("http://bob:hunter2pw@host/a.jsonl")
    >>> scrubbed("cannot open http://bob:hunter2pw@host/a.jsonl")
    'cannot open http://bob:***@host/a.jsonl'
    """
    if not _KNOWN or not text:
        return text
    for secret in sorted(_KNOWN, key=len, reverse=True):
        if secret in text:
            text = text.replace(secret, MASK)
    return text


_log_records_scrubbed = False


def _scrub_log_records() -> None:
    """From the first credential on, every log record this process makes is scrubbed as it
    is made: the storage libraries log URLs at DEBUG (fsspec's "Fetch range for ..."), and
    a filter on one logger would miss its children and the handlers of the user's own."""
    global _log_records_scrubbed
    if _log_records_scrubbed:
        return
    _log_records_scrubbed = True
    make_record = logging.getLogRecordFactory()

    def scrubbed_record(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = make_record(*args, **kwargs)
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a record that cannot format stays as logging sees it
            return record
        clean = scrubbed(message)
        if clean != message:
            record.msg, record.args = clean, None
        return record

    logging.setLogRecordFactory(scrubbed_record)


class ScrubbedError(Exception):
    """What stands in a chain for an error whose text kept a credential after scrubbing
    (a message made from attributes, as aiohttp's are): its type and its scrubbed text."""


def scrub_error(error: BaseException) -> BaseException:
    """``error`` with every known credential taken out of its message, its notes and its
    chain (causes and contexts), in place; returns ``error``.

    A link of the chain whose text still shows a credential is replaced by a
    :class:`ScrubbedError` holding its type and its scrubbed text.
    """
    if not _KNOWN:
        return error
    seen: set[int] = set()
    link: BaseException | None = error
    while link is not None and id(link) not in seen:
        seen.add(id(link))
        _scrub_in_place(link)
        for attribute in ("__cause__", "__context__"):
            inner = getattr(link, attribute)
            if inner is None or id(inner) in seen:
                continue
            _scrub_in_place(inner)
            text = str(inner)
            if scrubbed(text) != text:
                stand_in = ScrubbedError(f"{type(inner).__name__}: {scrubbed(text)}")
                stand_in.__cause__ = inner.__cause__
                stand_in.__context__ = inner.__context__
                stand_in.__suppress_context__ = inner.__suppress_context__
                setattr(link, attribute, stand_in)
        link = link.__cause__ or link.__context__
    return error


def _scrub_in_place(error: BaseException) -> None:
    try:
        error.args = tuple(scrubbed(a) if isinstance(a, str) else a for a in error.args)
        for name in ("filename", "filename2", "strerror", "url", "msg"):
            value = getattr(error, name, None)
            if isinstance(value, str):
                setattr(error, name, scrubbed(value))
        notes = getattr(error, "__notes__", None)
        if isinstance(notes, list):
            notes[:] = [scrubbed(str(note)) for note in notes]
    except (AttributeError, TypeError):  # an error class with read-only attributes
        pass
