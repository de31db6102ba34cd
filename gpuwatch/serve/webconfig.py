"""TLS and basic auth on the main listener, from a Prometheus exporter-toolkit web-config file
(`--web-config FILE`, or `web_config:` in the config), so one file serves node_exporter,
dcgm-exporter and gpuwatch alike:

    tls_server_config: {cert_file: server.crt, key_file: server.key}
    basic_auth_users: {prometheus: $2y$10$...}      # bcrypt hashes (htpasswd -nBC 10 "")

Relative paths are relative to the file. What Python's ssl module cannot do is refused by name
rather than ignored: client certificates that are requested but not verified, and curve
preferences."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import logging
import ssl
import time
from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from gpuwatch.text.yamlfile import Checker, PathKey, YamlDoc, boolean, load, one_of
from gpuwatch.web.app import Handler
from gpuwatch.web.message import Answer, Request, Response

log = logging.getLogger(__name__)

TLS_VERSIONS = {
    "TLS10": ssl.TLSVersion.TLSv1,
    "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}
# Go's names for the TLS 1.2 suites it offers, as OpenSSL names them (TLS 1.3's are fixed).
CIPHER_SUITES = {
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256": "ECDHE-ECDSA-AES128-GCM-SHA256",
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256": "ECDHE-RSA-AES128-GCM-SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384": "ECDHE-ECDSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384": "ECDHE-RSA-AES256-GCM-SHA384",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-ECDSA-CHACHA20-POLY1305",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-RSA-CHACHA20-POLY1305",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA256": "ECDHE-ECDSA-AES128-SHA256",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA256": "ECDHE-RSA-AES128-SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA": "ECDHE-ECDSA-AES128-SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA": "ECDHE-RSA-AES128-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA": "ECDHE-ECDSA-AES256-SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA": "ECDHE-RSA-AES256-SHA",
    "TLS_RSA_WITH_AES_128_GCM_SHA256": "AES128-GCM-SHA256",
    "TLS_RSA_WITH_AES_256_GCM_SHA384": "AES256-GCM-SHA384",
    "TLS_RSA_WITH_AES_128_CBC_SHA256": "AES128-SHA256",
    "TLS_RSA_WITH_AES_128_CBC_SHA": "AES128-SHA",
    "TLS_RSA_WITH_AES_256_CBC_SHA": "AES256-SHA",
}
CLIENT_AUTH = {
    "NoClientCert": ssl.CERT_NONE,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}
UNVERIFIED_CLIENT_AUTH = ("RequestClientCert", "RequireAnyClientCert")
HEADERS = (
    "Strict-Transport-Security",
    "X-Content-Type-Options",
    "X-Frame-Options",
    "X-XSS-Protection",
    "Content-Security-Policy",
)
BCRYPT_PREFIXES = ("$2a$", "$2b$", "$2y$")
# Checked when the user is unknown, so that answering takes as long as for a known one.
_DUMMY_HASH = b"$2b$10$kTDuPZYt8Nrw6M5hDLgvTOsHpVMQOADnkrRtNQ4pSjYx30yCAJcFG"
AUTH_CACHE_SIZE = 256  # bcrypt takes ~60 ms a check; a scraper sends the same pair each time
BCRYPT_MAX_BYTES = 72  # bcrypt reads no further; longer is refused, as Go's bcrypt does
# bcrypt runs on its own threads, so a flood of wrong passwords waits for them and never for
# the pool that evaluates rules; past AUTH_QUEUE_LIMIT checks waiting, one more is answered 429
# at once. A client with AUTH_FAILURES_LIMIT failures in AUTH_FAILURES_WINDOW_S is answered
# 429 without a check until the window has passed: a flood costs the flooder.
AUTH_THREADS = 2
AUTH_QUEUE_LIMIT = 64
AUTH_FAILURES_LIMIT = 10
AUTH_FAILURES_WINDOW_S = 10.0
PUSH_PATH = "/api/v1/push"  # guarded by its own bearer token (push.token) instead


@dataclass(frozen=True)
class WebConfig:
    file: str
    tls: ssl.SSLContext | None = None
    users: Mapping[str, bytes] = field(default_factory=dict)  # user -> bcrypt hash
    headers: Mapping[str, str] = field(default_factory=dict)
    allowed_sans: tuple[str, ...] = ()
    certificate: tuple[Path, Path] | None = None  # (cert_file, key_file), to rotate on reload


def load_web_config(path: str | Path) -> WebConfig:
    """Raises FileError naming the file, line and field of every mistake."""
    doc = load(path)
    r = Checker(doc)
    top = r.section(doc.data, (), ("tls_server_config", "http_server_config", "basic_auth_users"))
    base = Path(doc.file).parent
    tls, sans, certificate = _tls(r, doc, top.get("tls_server_config"), base)
    http = r.section(top.get("http_server_config"), ("http_server_config",), ("http2", "headers"))
    if r.value(http, ("http_server_config",), "http2", boolean, False):
        log.info("%s: http2 is on; gpuwatch serves HTTP/1.1, which every scraper speaks", path)
    headers_at: PathKey = ("http_server_config", "headers")
    headers = r.section(http.get("headers"), headers_at, HEADERS)
    users_at: PathKey = ("basic_auth_users",)
    users: dict[str, bytes] = {}
    raw_users = top.get("basic_auth_users") or {}
    if not isinstance(raw_users, dict):
        r.problems.append(doc.problem(users_at, "basic_auth_users must be a mapping"))
        raw_users = {}
    for user, hashed in raw_users.items():
        if not isinstance(hashed, str) or not hashed.startswith(BCRYPT_PREFIXES):
            r.problems.append(
                doc.problem(
                    (*users_at, str(user)),
                    "must be a bcrypt hash ($2y$...), e.g. from `htpasswd -nBC 10 USER`",
                )
            )
            continue
        users[str(user)] = hashed.encode()
    r.check()
    return WebConfig(
        doc.file, tls, users, {str(k): str(v) for k, v in headers.items()}, sans, certificate
    )


def _tls(
    r: Checker, doc: YamlDoc, data: Any, base: Path
) -> tuple[ssl.SSLContext | None, tuple[str, ...], tuple[Path, Path] | None]:
    at: PathKey = ("tls_server_config",)
    known = (
        "cert_file", "key_file", "client_auth_type", "client_ca_file", "min_version",
        "max_version", "cipher_suites", "prefer_server_cipher_suites", "client_allowed_sans",
        "curve_preferences", "cert", "key",
    )  # fmt: skip
    tls = r.section(data, at, known)
    if not tls:
        return None, (), None
    for inline in ("cert", "key"):
        if inline in tls:
            r.problems.append(
                doc.problem((*at, inline), f"use {inline}_file: a path to a PEM file")
            )
    if "curve_preferences" in tls:
        r.problems.append(
            doc.problem(
                (*at, "curve_preferences"),
                "not supported (Python's ssl cannot order curves); leave it out",
            )
        )
    cert, key = tls.get("cert_file"), tls.get("key_file")
    if not isinstance(cert, str) or not isinstance(key, str):
        r.problems.append(doc.problem(at, "needs both cert_file and key_file"))
        return None, (), None
    certificate = (base / cert, base / key)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(*certificate)
    except (OSError, ssl.SSLError) as exc:
        r.problems.append(doc.problem((*at, "cert_file"), f"cannot load {cert} and {key}: {exc}"))
        return None, (), None
    auth = r.value(tls, at, "client_auth_type", str, "NoClientCert")
    if auth in UNVERIFIED_CLIENT_AUTH:
        r.problems.append(
            doc.problem(
                (*at, "client_auth_type"),
                f"{auth} is not supported: gpuwatch only takes client certificates it verifies; "
                "use VerifyClientCertIfGiven or RequireAndVerifyClientCert with client_ca_file",
            )
        )
    elif auth not in CLIENT_AUTH:
        r.problems.append(
            doc.problem((*at, "client_auth_type"), f"expected one of: {', '.join(CLIENT_AUTH)}")
        )
    else:
        context.verify_mode = CLIENT_AUTH[auth]
        ca = tls.get("client_ca_file")
        if auth != "NoClientCert" and not isinstance(ca, str):
            where = (*at, "client_auth_type")
            r.problems.append(doc.problem(where, f"{auth} needs client_ca_file"))
        elif isinstance(ca, str):
            try:
                context.load_verify_locations(base / ca)
            except (OSError, ssl.SSLError) as exc:
                r.problems.append(doc.problem((*at, "client_ca_file"), f"cannot load: {exc}"))
    version = one_of(tuple(TLS_VERSIONS))
    context.minimum_version = TLS_VERSIONS[r.value(tls, at, "min_version", version, "TLS12")]
    highest = r.value(tls, at, "max_version", version, "TLS13")
    context.maximum_version = TLS_VERSIONS[highest]
    suites = r.value(tls, at, "cipher_suites", _cipher_suites, "")
    if suites:
        context.set_ciphers(suites)
    if r.value(tls, at, "prefer_server_cipher_suites", boolean, True):
        context.options |= ssl.OP_CIPHER_SERVER_PREFERENCE
    sans: tuple[str, ...] = r.value(tls, at, "client_allowed_sans", _strings, ())
    return context, sans, certificate


def _cipher_suites(value: Any) -> str:
    names = _strings(value)
    unknown = [n for n in names if n not in CIPHER_SUITES]
    if unknown:
        raise ValueError(f"unknown cipher suites {unknown}; known: {', '.join(CIPHER_SUITES)}")
    return ":".join(CIPHER_SUITES[n] for n in names)


def _strings(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError("expected a list of strings")
    return tuple(value)


class WebGuard:
    """The listener's basic auth, response headers and client SAN check, as middleware.
    Holds the current WebConfig, so a reload changes users and headers for the next request."""

    def __init__(self, config: WebConfig, now: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self._now = now
        # Pairs checked, passed and refused apart: refused guesses, however many, never push
        # a scraper's pair out. Each is kept in order of last use, the oldest dropped.
        self._verdicts: dict[bool, OrderedDict[tuple[str, bytes], None]] = {
            True: OrderedDict(),
            False: OrderedDict(),
        }
        self._checkers = ThreadPoolExecutor(AUTH_THREADS, thread_name_prefix="bcrypt")
        self._checking: Counter[str] = Counter()  # by client: checks running or waiting
        self._failures: OrderedDict[str, deque[float]] = OrderedDict()  # by client address

    def close(self) -> None:
        self._checkers.shutdown(wait=False, cancel_futures=True)

    def reload(self, config: WebConfig) -> None:
        """Users, headers and allowed SANs as `config` has them, and its certificate files
        read again into the listener's TLS context (rotation); other TLS settings stay as
        they were until a restart."""
        running = self.config.tls
        if running is not None and config.certificate is not None:
            running.load_cert_chain(*config.certificate)
        self.config = replace(config, tls=running)
        for cache in self._verdicts.values():
            cache.clear()

    async def middleware(self, request: Request, handler: Handler) -> Answer:
        config = self.config
        if config.allowed_sans and not _san_allowed(request, config.allowed_sans):
            return Response(status=403, text="client certificate not allowed\n")
        if config.users and request.path != PUSH_PATH:
            verdict = await self._authorized(request)
            if verdict is None:
                return Response(
                    status=429,
                    text="too many failed or pending logins; try again later\n",
                    headers={"Retry-After": f"{AUTH_FAILURES_WINDOW_S:.0f}"},
                )
            if not verdict:
                return Response(
                    status=401,
                    text="Unauthorized\n",
                    headers={"WWW-Authenticate": 'Basic realm="gpuwatch"'},
                )
        response = await handler(request)
        response.headers.update(config.headers)
        return response

    async def _authorized(self, request: Request) -> bool | None:
        """True or False; None when the client has failed too often or too many checks wait."""
        given = basic_credentials(request.headers.get("Authorization", ""))
        if given is None:
            return False
        login, password = given
        import bcrypt  # here, not at the top: a listener without users (most) never loads it

        key = (login, hashlib.sha256(password).digest())
        for known, cache in self._verdicts.items():
            if key in cache:  # a refused pair seen before costs nothing: not counted
                cache.move_to_end(key)
                return known
        client = request.remote or ""
        # Checks still running count as failures to come: a burst is cut short at once.
        if self._recent_failures(client) + self._checking[client] >= AUTH_FAILURES_LIMIT:
            return None
        if len(password) > BCRYPT_MAX_BYTES:
            verdict = False
        else:
            if self._checking.total() >= AUTH_QUEUE_LIMIT:
                return None
            hashed = self.config.users.get(login, _DUMMY_HASH)
            self._checking[client] += 1
            try:  # ~60 ms of CPU: off the event loop, and off the rules' threads
                loop = asyncio.get_running_loop()
                verdict = await loop.run_in_executor(
                    self._checkers, bcrypt.checkpw, password, hashed
                )
            finally:
                self._checking[client] -= 1
                if not self._checking[client]:
                    del self._checking[client]
            verdict = verdict and login in self.config.users
        cache = self._verdicts[verdict]
        cache[key] = None
        if len(cache) > AUTH_CACHE_SIZE:
            cache.popitem(last=False)
        if not verdict:
            self._failed(client)
            log.warning("basic auth refused for user %r from %s", login, client)
        return verdict

    def _recent_failures(self, client: str) -> int:
        times = self._failures.get(client)
        if times is None:
            return 0
        while times and times[0] <= self._now() - AUTH_FAILURES_WINDOW_S:
            times.popleft()
        return len(times)

    def _failed(self, client: str) -> None:
        times = self._failures.pop(client, None) or deque(maxlen=AUTH_FAILURES_LIMIT)
        times.append(self._now())
        self._failures[client] = times  # the most recent last; the oldest client forgotten
        if len(self._failures) > AUTH_CACHE_SIZE:
            self._failures.popitem(last=False)


def basic_credentials(header: str) -> tuple[str, bytes] | None:
    """(user, password) from an Authorization header of the Basic scheme; None for any
    other header, or one that is not base64 of "user:password"."""
    scheme, _, encoded = header.strip().partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        decoded = base64.b64decode(encoded.strip(), validate=True)
    except ValueError:
        return None
    login, colon, password = decoded.partition(b":")
    if not colon:
        return None
    # The password's bytes as sent: bcrypt checks bytes, and a web-config file's hashes are of
    # UTF-8 text. A user name in anything else matches no user of the file.
    return login.decode("utf-8", "replace"), password


def _san_allowed(request: Request, allowed: tuple[str, ...]) -> bool:
    transport = request.transport
    peer = transport.get_extra_info("peercert") if transport is not None else None
    if not peer:
        return False
    names = {value for _, value in peer.get("subjectAltName", ())}
    return bool(names & set(allowed))
