"""Engine and upstream URLs: checked once at start, and shown without what they must not show (user:password)."""

from __future__ import annotations

from urllib.parse import unquote, urlsplit, urlunsplit

from rooflight.agent.errors import ConfigError


def target_name(url: str) -> str:
    """host:port of an engine URL, never its user:password (the name is a label and appears in logs)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    shown = f"[{host}]" if ":" in host else host
    try:
        port = parts.port
    except ValueError:
        port = None
    return f"{shown}:{port}" if port is not None else shown


def public_url(url: str) -> str:
    """The URL as the agent may show it: scheme://host:port/path, never user:password, query or fragment.

    Only for URLs check_engine_url accepted (their userinfo cannot spill into the path)."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{target_name(url)}{parts.path}" if parts.scheme else target_name(url)


def check_engine_url(url: str) -> None:
    """Refuse an engine URL the agent would read or fetch wrongly (exit 2), saying what to write instead.

    In `http://admin:p/ss@host` the unescaped `/` ends the authority early: urlsplit reads the host as
    `admin`, the password as part of the path, and a label or a log line made from the host or the
    path would carry the secret. A query or a fragment has no place in an API base the metrics path is
    appended to (`/?token=abc` would be fetched as `/?token=abc/metrics`). No message shows the URL's
    user:password, query or fragment (shown_url): each may hold a secret."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.lower() not in ("http", "https"):
        raise ConfigError(f"engine URL {shown_url(url)!r}: write it as http://HOST:PORT (the engine's API base)")
    authority_end = min((i for i in (rest.find(c) for c in "/?#") if i >= 0), default=len(rest))
    if "@" in rest[authority_end:]:
        raise ConfigError(
            "engine URL: its user:password part holds an unescaped '/', '?' or '#' (or the path holds '@'):"
            " percent-encode them in the password (/ -> %2F, ? -> %3F, # -> %23, @ -> %40)"
        )
    try:
        parts = urlsplit(url)
    except ValueError:  # "Invalid IPv6 URL": an unclosed '[' or a ']' out of place
        raise ConfigError(f"engine URL {shown_url(url)!r}: not a valid URL; an IPv6 address goes in brackets,"
                          " e.g. http://[::1]:8000") from None
    try:
        parts.port
    except ValueError:
        raise ConfigError(f"engine URL {shown_url(url)!r}: the port is not a number 0-65535") from None
    if not parts.hostname:
        raise ConfigError(f"engine URL {shown_url(url)!r}: write it as http://HOST:PORT (the engine's API base)")
    if "?" in rest[authority_end:] or "#" in rest[authority_end:]:
        raise ConfigError(f"engine URL {shown_url(url)!r}: give the engine's API base without ?query or #fragment"
                          " (the metrics path is appended to it; a credential goes in user:password@HOST)")


def redacted_url(url: str) -> str:
    """A malformed URL as an error message may show it: any user:password replaced by ***."""
    scheme, sep, rest = url.partition("://")
    head, at, tail = rest.rpartition("@") if sep else url.rpartition("@")
    shown = f"***@{tail}" if at else (rest if sep else url)
    return f"{scheme}{sep}{shown}" if sep else shown


def parse_upstream(url: str | None, what: str = "--upstream") -> str:
    if not url:
        raise ConfigError(f"{what} is required: the OpenAI-compatible server's URL, e.g. http://127.0.0.1:8000")
    rest = url.strip().partition("://")[2]
    if "@" in rest[min((i for i in map(rest.find, "/?#") if i >= 0), default=len(rest)):]:
        raise ConfigError(f"{what}: its user:password part holds an unescaped '/', '?' or '#' (or the path holds '@'):"
                          " percent-encode them in the password (/ -> %2F, ? -> %3F, # -> %23, @ -> %40)")
    try:
        parts = urlsplit(url.strip())
    except ValueError:  # "Invalid IPv6 URL": an unclosed '[' or a ']' out of place
        raise ConfigError(f"{what} '{shown_url(url)}': not a valid URL; an IPv6 address goes in brackets,"
                          " e.g. http://[::1]:8000") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"{what} '{shown_url(url)}': write http://HOST:PORT (or https://), e.g. http://127.0.0.1:8000")
    if parts.query or parts.fragment:
        raise ConfigError(f"{what} '{shown_url(url)}': give the base URL only, without ?query or #fragment")
    try:
        parts.port  # noqa: B018 (raises on a bad port)
    except ValueError:
        raise ConfigError(f"{what} '{shown_url(url)}': the port is not a number between 0 and 65535") from None
    if "@" in parts.netloc:
        parts = parts._replace(netloc=parts.netloc.rpartition("@")[2])  # never in the URL requests are sent to
    return urlunsplit(parts).rstrip("/")


def shown_url(url: str) -> str:
    """The upstream URL as a message or log line may show it: no user:password, query or fragment (a
    `?token=` is a secret too), and no raw control character (an escape sequence would reach a terminal)."""
    shown = redacted_url(url.strip())
    scheme, sep, rest = shown.partition("://")
    cut = min((i for i in map(rest.find, "?#") if i >= 0), default=-1)
    if cut >= 0:
        rest = rest[:cut] + ("?..." if rest[cut] == "?" else "#...")
    return printable(f"{scheme}{sep}{rest}")


def printable(text: str) -> str:
    """`text` with every non-printable character written as a Python escape (\\x1b, \\u200b)."""
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode("ascii") for ch in text)


def credentials(url: str | None) -> tuple[str, str] | None:
    """The (user, password) of a URL's user:password part, percent-decoded; None when it has none."""
    if not url:
        return None
    parts = urlsplit(url.strip())
    if "@" not in parts.netloc:
        return None
    user, _, password = parts.netloc.rpartition("@")[0].partition(":")
    return unquote(user), unquote(password)


def endpoint(url: str) -> tuple[str, int | None]:
    """(host, port) with the scheme's default port filled in: http://vllm and http://vllm:80 are one engine."""
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        port = None
    default = {"http": 80, "https": 443}.get(parts.scheme)
    return (parts.hostname or "").lower(), port if port is not None else default

