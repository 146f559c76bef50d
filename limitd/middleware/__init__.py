"""Client and server middleware: the chains, and one module per feature."""

from limitd.middleware.chain import Chain, ClientChain, ServerChain

__all__ = ["Chain", "ClientChain", "ServerChain"]
