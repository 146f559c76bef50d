"""The web dashboard as a feature: ``limitd web`` (``limitd.web.commands``)."""

from limitd.plugins import Feature
from limitd.web.commands import add_web_command

WEB = Feature(name="web", add_commands=add_web_command)
