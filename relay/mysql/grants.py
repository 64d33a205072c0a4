"""What an account's `SHOW GRANTS` lets it read: the relay's accounts on a primary need
replication (REPLICATION SLAVE, REPLICATION CLIENT) and metadata (REFERENCES shows every
table's definition in information_schema and reads none of its rows); an account that can
SELECT user tables is more than the relay needs, and a start-up warning says so.

Sans-I/O: the grant lines in, the readable targets out. Roles granted to the account are
not followed (their grants are not in the account's own SHOW GRANTS).
"""

from __future__ import annotations

import re

# `GRANT <privileges> ON <target> TO <account> ...`, as MariaDB and MySQL print them.
_GRANT = re.compile(r"^\s*GRANT\s+(?P<privs>.+?)\s+ON\s+(?:(?:TABLE|FUNCTION|PROCEDURE|"
                    r"PACKAGE(?:\s+BODY)?)\s+)?(?P<target>\S+)\s+TO\s", re.IGNORECASE)
_READS = re.compile(r"(?:^|,)\s*(?:ALL(?:\s+PRIVILEGES)?|SELECT)\s*(?:\(|,|$)",
                    re.IGNORECASE)
# Schemas whose tables hold no user data the relay's rules could be protecting.
_METADATA_SCHEMAS = {"information_schema", "performance_schema"}


def readable(grants: list[str]) -> list[str]:
    """The targets (`*.*`, `app.*`, `app.users`) the grant lines let the account SELECT
    from, beyond the metadata schemas."""
    found = []
    for line in grants:
        m = _GRANT.match(line)
        if m is None or not _READS.search(m["privs"]):
            continue
        target = m["target"]
        schema = target.split(".", 1)[0].strip("`").lower()
        if schema not in _METADATA_SCHEMAS:
            found.append(target.replace("`", ""))
    return found
