"""The dashboard's one user and password (HTTP Basic). Apart from the ASGI parts so the
command can check ``--auth`` without the web extra installed."""

from __future__ import annotations

import base64
import binascii
import secrets
from dataclasses import dataclass


@dataclass(frozen=True)
class Credentials:
    user: str
    password: str

    @classmethod
    def parse(cls, text: str, where: str) -> Credentials:
        """``user:password``; ``where`` names the flag or variable it came from."""
        user, colon, password = text.partition(":")
        if not colon or not user or not password:
            raise ValueError(f"{where}: expected USER:PASSWORD, both non-empty")
        return cls(user, password)

    def admits(self, header: str | None) -> bool:
        if not header or not header.lower().startswith("basic "):
            return False
        try:
            decoded = base64.b64decode(header[6:].strip(), validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            return False
        user, _, password = decoded.partition(":")
        # Both compared in full whatever the first gives, so timing tells nothing.
        same_user = secrets.compare_digest(user.encode(), self.user.encode())
        same_password = secrets.compare_digest(password.encode(), self.password.encode())
        return same_user and same_password
