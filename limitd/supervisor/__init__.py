"""The server side: capsules of processor threads, the poller, heartbeat and reaper."""

from limitd.config import CapsuleConfig
from limitd.supervisor.capsule import Capsule

__all__ = ["Capsule", "CapsuleConfig"]
