"""Client and server middleware: the chains, and one module per feature."""

from limitd.middleware.chain import Chain, ServerChain
from limitd.middleware.client_chain import ClientChain

__all__ = ["Chain", "ClientChain", "ServerChain"]
