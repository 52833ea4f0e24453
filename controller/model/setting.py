"""What one configuration key is, written once, on its dataclass field.

``setting(default, doc=..., unit=..., ...)`` is ``dataclasses.field`` with a ``Setting``
in its metadata. ``controller.config`` decodes, bounds-checks, redacts and documents
every group from these fields alone (``dispatchctl config --defaults`` prints them), so
a key's default, unit, bounds and meaning have exactly one home. Pure data; no I/O.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, TypeVar

T = TypeVar("T")
SETTING: Final = "dispatch.setting"  # the metadata key
MASK: Final = "***"
_URL_RE = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<rest>.*)", re.DOTALL)
_QUERY_PASSWORD_RE = re.compile(r"([?&]password=)[^&#]*", re.IGNORECASE)

Check = Callable[[Any, str], Any]  # (decoded value, dotted key) -> value; raises ErrInvalid


@dataclass(frozen=True, slots=True)
class Setting:
    """The description of one key; the default lives in the field itself."""

    doc: str
    unit: str = ""  # "s", "1/s", ... (documentation only)
    minimum: float | None = None  # inclusive
    maximum: float | None = None  # inclusive
    positive: bool = False  # must be > 0
    secret: bool = False  # masked by ``Config.redacted()`` (a URL keeps all but its password)
    key: str = ""  # the TOML key when it is not the attribute name (``environment.pass``)
    check: Check | None = None  # further validation or normalisation of a decoded value

    def bounds(self) -> str:
        """The bounds as documentation text (``> 0``, ``1..65535``, ``>= 0``)."""
        if self.positive:
            return "> 0"
        if self.minimum is not None and self.maximum is not None:
            return f"{_number(self.minimum)}..{_number(self.maximum)}"
        if self.minimum is not None:
            return f">= {_number(self.minimum)}"
        return ""


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(value)


def setting(default: T, *, doc: str, unit: str = "", minimum: float | None = None,
            maximum: float | None = None, positive: bool = False, secret: bool = False,
            key: str = "", check: Check | None = None) -> T:
    """A dataclass field with ``default`` and its ``Setting`` (immutable defaults only)."""
    meta = Setting(doc=doc, unit=unit, minimum=minimum, maximum=maximum, positive=positive,
                   secret=secret, key=key, check=check)
    out: T = dataclasses.field(default=default, metadata={SETTING: meta})
    return out


def setting_of(f: dataclasses.Field[Any]) -> Setting | None:
    """The ``Setting`` of a dataclass field, or None for a field that is not a key."""
    meta = f.metadata.get(SETTING)
    return meta if isinstance(meta, Setting) else None


def redact_url(url: str) -> str:
    """``url`` with its password replaced by ``***``, for logs, metrics and errors.

    Never parses strictly, so no URL, however malformed, leaks its password: the user
    information ends at the *last* ``@`` (a password may hold ``@``, ``/``, ``?`` or
    ``#`` unencoded), everything after the user name's first ``:`` up to there is masked,
    and so is a ``password=`` query parameter. When in doubt it masks more, never less.
    """
    match = _URL_RE.fullmatch(url)
    if match is None:
        return url if "@" not in url else MASK
    scheme, rest = match["scheme"], match["rest"]
    userinfo, at, host = rest.rpartition("@")
    if at and ":" in userinfo:
        rest = f"{userinfo.partition(':')[0]}:{MASK}@{host}"
    return scheme + _QUERY_PASSWORD_RE.sub(rf"\g<1>{MASK}", rest)
