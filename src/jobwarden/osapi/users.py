"""Who a uid is, as the lists show it."""

from __future__ import annotations

import pwd


def user_name(uid: int | None) -> str:
    """The account's name; its number where the account is unknown here (a container's, a removed user's);
    '?' where the owner could not be read."""
    if uid is None:
        return "?"
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)
