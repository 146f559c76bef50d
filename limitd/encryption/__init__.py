"""Encrypted job arguments (``encrypt=True``): the arguments leave the client sealed
with AES-256-GCM and are opened only around ``perform``, so Redis, the retry and dead
sets, the logs, the dashboard and the command line only ever hold the ciphertext.

- ``cipher``: the keyring (versioned keys) and the sealed form of the arguments;
- ``middleware``: the client middleware that seals, the server middleware that opens;
- ``section``: the ``encryption:`` config section and ``LIMITD_ENCRYPTION_*`` variables;
- ``plug``: the feature as ``limitd.features`` registers it.
"""

# The ``encryption:`` section's keys: here, so that the plug names them without loading
# the section's reader (and the docs test finds them beside the reader it registers).
SECTION_KEYS = frozenset({"keys", "current"})
