"""The part the ``redis+sentinel://`` and ``redis+cluster://`` URLs share: a password,
then a comma-separated list of ``host:port``, then a path."""

from __future__ import annotations

from urllib.parse import unquote, urlsplit


def split_hosts(
    url: str, scheme: str, what: str
) -> tuple[tuple[tuple[str, int], ...], str | None, str]:
    """The hosts, the password and the path of ``url``; ValueError naming what is wrong
    (``what``: "sentinel", "node")."""
    if not url.startswith(scheme):
        raise ValueError(f"a {what} URL starts with {scheme}, got {url!r}")
    parts = urlsplit("http://" + url[len(scheme) :])
    password = unquote(parts.password) if parts.password else None
    listed = parts.netloc.rpartition("@")[2]
    hosts = tuple(_address(item, url, what) for item in listed.split(",") if item)
    if not hosts:
        raise ValueError(f"{url!r}: name at least one {what} as host:port")
    return hosts, password, parts.path


def _address(item: str, url: str, what: str) -> tuple[str, int]:
    host, colon, port = item.rpartition(":")
    if not colon or not host or not port.isdigit():
        raise ValueError(f"{url!r}: expected host:port for each {what}, got {item!r}")
    return host, int(port)
