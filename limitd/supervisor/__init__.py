"""The server side: capsules of processor threads, the poller and the heartbeat."""

from limitd.supervisor.capsule import Capsule, CapsuleConfig

__all__ = ["Capsule", "CapsuleConfig"]
