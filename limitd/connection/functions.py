"""A Lua script that Redis 7 runs as a function (FCALL), where it can.

EVALSHA runs a script's whole file at every call: each ``local function`` in it is made
again (a closure, its upvalues looked up), and a script built of small functions pays
for that before it does any work. For the fetch script that was about a quarter of what
Redis ran for a plain call of a few jobs (bench/fetch_call.py --callgrind). A function
library is run once, when it is loaded; a call only runs the function it names.

So a :class:`LuaFunction` is a :class:`~limitd.connection.scripts.LuaScript` whose file
ends by defining its entry, ``local function <entry>(keys, args)``, and keeps every
piece of state a call needs in locals that the entry sets afresh. The same text serves
both ways:

- as a library (``FUNCTION LOAD``), with a ``redis.register_function`` of the entry
  appended: called with FCALL, the same keys and arguments as EVALSHA;
- as a script, with a call of the entry on KEYS and ARGV around it: for servers without
  functions (Redis 6, the embedded server), in a pipeline, and from asyncio, which go
  through the script as before. On a cluster the function is loaded on every primary
  and each FCALL goes to its keys' shard.

The library and the function are named after the script's SHA-1, so two versions of
limitd (a rolling restart) each call their own, and a server that lost its functions
(a restart without persistence, ``FUNCTION FLUSH``) is given the library again on the
first call that misses it, as a script is on NOSCRIPT. A server that has no functions,
or whose ACL refuses them, is remembered (per connection pool) and sent EVALSHA.

The function is flagged ``allow-oom``: Redis refuses a function without flags as a
whole while it is out of memory, where the script ran until its first write that could
grow memory. A fetch moves jobs from list to list and settles finished ones (which frees
memory); refusing it would stop acknowledgements too.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Sequence
from typing import Any

from redis.cluster import ClusterPipeline
from redis.exceptions import NoPermissionError, NoScriptError, ResponseError

from limitd.connection.scripts import LuaScript
from limitd.connection.wire import Conn, bulk, client_of, command_from, pack_command, send_packed

log = logging.getLogger("limitd.connection")

FCALL = b"FCALL"


class LuaFunction(LuaScript):
    """One ``.lua`` file (with its prelude) called with FCALL where the server has
    functions, else with EVALSHA; ``entry`` names its entry function."""

    def __init__(
        self,
        package: str,
        filename: str,
        prelude: Sequence[str | tuple[str, str]] = (),
        *,
        entry: str,
    ) -> None:
        super().__init__(package, filename, prelude)
        body = self.source
        # (The file declares locals named KEYS and ARGV, which the entry sets.)
        eval_prefix = b"local eval_keys, eval_args = KEYS, ARGV\n"
        self.set_source(
            eval_prefix + body + b"\nreturn %s(eval_keys, eval_args)\n" % entry.encode()
        )
        self.function = f"limitd_{entry}_{self.sha[:16]}"
        self.library = (
            b"#!lua name=%s\n%s\nredis.register_function{function_name='%s', "
            % (
                self.function.encode(),
                body,
                self.function.encode(),
            )
            + b"callback=%s, flags={'allow-oom'}}\n" % entry.encode()
        )
        self._fcall = bulk(FCALL) + bulk(self.function)
        # The connection pools of servers that have no functions (or may not use them).
        self._without: weakref.WeakSet[Any] = weakref.WeakSet()

    def packed(self, keys: Sequence[Any], args: Sequence[Any]) -> bytes:
        return pack_command(FCALL, self.function, len(keys), *keys, *args)

    def packed_from(
        self, keys: int, key_parts: list[bytes], args: int, arg_parts: list[bytes]
    ) -> bytes:
        return command_from(3 + keys + args, [self._fcall, bulk(keys), *key_parts, *arg_parts])

    def send(self, conn: Any, command: bytes) -> Any:
        """Send a call packed by ``packed`` or ``packed_from`` (an FCALL) on ``conn``:
        as EVALSHA to a server without functions; loading the library first if the
        server lacks it."""
        if self._scripted(conn):
            return super().send(conn, self.as_script(command))
        try:
            return send_packed(conn, command)
        except ResponseError as exc:
            return self.recover(conn, command, exc)

    def fitted(self, conn: Conn, command: bytes) -> bytes:
        """``command`` as ``send`` would send it on ``conn`` (for a caller that sends it
        with other commands)."""
        return self.as_script(command) if self._scripted(conn) else command

    def _scripted(self, conn: Conn) -> bool:
        """Whether ``conn``'s server was found to have no functions (or to refuse them)."""
        return bool(self._without) and client_of(conn).connection_pool in self._without

    def recover(self, conn: Conn, command: bytes, error: Exception) -> Any:
        """The reply to ``command`` (an FCALL that failed with ``error``) once what it
        lacked is there: the library loaded, or the call made as a script. Any other
        error (the function's own, a connection's) is raised as it came."""
        if isinstance(error, NoScriptError):  # a call already sent as EVALSHA
            return super().send(conn, self.as_script(command))
        if not isinstance(error, ResponseError):
            raise error
        if _lacks_library(error) and self._load(conn):
            return send_packed(conn, command)
        if _refused(error) or _lacks_library(error):  # (the load was refused)
            self._give_up_functions(client_of(conn).connection_pool, error)
            return super().send(conn, self.as_script(command))
        raise error

    def is_missing(self, error: Exception) -> bool:
        """Whether ``error``, the reply to one of this function's calls, says the
        server lacks the library or functions altogether (``recover`` mends both)."""
        return isinstance(error, NoScriptError) or (
            isinstance(error, ResponseError) and (_lacks_library(error) or _refused(error))
        )

    def _on_cluster(self, conn: Any, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        """On a cluster, an FCALL routed by its keys' slot, the library loaded on every
        primary when the shard lacks it; a cluster pipeline, or a cluster without
        functions, calls the script."""
        if isinstance(conn, ClusterPipeline) or conn in self._without:
            return super()._on_cluster(conn, keys, args)
        try:
            return conn.fcall(self.function, len(keys), *keys, *args)
        except ResponseError as exc:
            if _refused(exc):
                self._give_up_functions(conn, exc)
                return super()._on_cluster(conn, keys, args)
            if not _lacks_library(exc):
                raise
        # REPLACE: some primaries may hold it already (a shard added since, a failover).
        conn.function_load(self.library, replace=True)
        return conn.fcall(self.function, len(keys), *keys, *args)

    def as_script(self, command: bytes) -> bytes:
        """An FCALL packed by this object as the same call by EVALSHA."""
        return command.replace(self._fcall, self._evalsha, 1)

    def _load(self, conn: Conn) -> bool:
        """Load the library; False if the server refuses it (no functions, ACL)."""
        try:
            client_of(conn).execute_command("FUNCTION", "LOAD", self.library)
        except ResponseError as exc:
            if "already exists" in str(exc):  # another process loaded it meanwhile
                return True
            if _refused(exc):
                return False
            raise
        return True

    def _give_up_functions(self, server: Any, error: Exception) -> None:
        """Call the script from now on where ``server`` (a connection pool, or a
        cluster client) is concerned, and say so once."""
        if server in self._without:
            return
        self._without.add(server)
        # (Redis's unknown-command error echoes the call's first arguments: left out.)
        reason = str(error).split(", with args beginning with", 1)[0]
        log.info("%s: this Redis runs no functions (%s): called by EVALSHA", self.name, reason)


def _lacks_library(error: Exception) -> bool:
    """The server has functions but not this library (restarted, flushed)."""
    return "Function not found" in str(error)


def _refused(error: Exception) -> bool:
    """A server without functions (before 7.0) or an ACL that does not allow them."""
    text = str(error).lower()
    names_functions = any(
        name in text for name in ("'fcall'", "'function", "`fcall`", "`function`")
    )
    if isinstance(error, NoPermissionError):  # (a command the function calls: ERR)
        return names_functions
    return "unknown command" in text and names_functions
