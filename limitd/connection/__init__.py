"""The Redis plumbing every layer above stands on: connecting (plain, Sentinel, Cluster,
an embedded server for development), Lua scripts, the packed-command fast path, pipelines
and failover handling. Nothing here knows about jobs.

The names most modules need are importable from here; the topology modules
(``sentinel``, ``cluster``, ``replication``), the job's own client (``pinned``) and the
embedded server (``embedded``) are imported by name.
"""

from limitd.connection.connect import (
    DEFAULT_URL,
    TWIN_WAIT,
    URL_ENV_VARS,
    async_twin,
    connect,
    loop_twin,
    masked,
    unreachable,
)
from limitd.connection.failover import is_failover_error, retry_on_failover
from limitd.connection.functions import LuaFunction
from limitd.connection.pipelines import (
    apipeline,
    decode_name,
    each_pipelined,
    pipeline,
    set_members,
)
from limitd.connection.scripts import (
    LuaScript,
    MergedCall,
    ScriptCall,
    merge_calls,
    run_calls,
    send_calls_then,
)
from limitd.connection.wire import (
    BULK,
    Conn,
    OwnConnection,
    bulk,
    client_of,
    command_from,
    own_connection,
    pack_command,
    send_packed,
)

__all__ = [
    "BULK",
    "DEFAULT_URL",
    "TWIN_WAIT",
    "URL_ENV_VARS",
    "Conn",
    "LuaFunction",
    "LuaScript",
    "MergedCall",
    "OwnConnection",
    "ScriptCall",
    "apipeline",
    "async_twin",
    "bulk",
    "client_of",
    "command_from",
    "connect",
    "decode_name",
    "each_pipelined",
    "is_failover_error",
    "loop_twin",
    "masked",
    "merge_calls",
    "own_connection",
    "pack_command",
    "pipeline",
    "retry_on_failover",
    "run_calls",
    "send_calls_then",
    "send_packed",
    "set_members",
    "unreachable",
]
