"""Reading a user's JSON or YAML file with one-line errors that name it (a missing file, unreadable
bytes, malformed content with where), raised as the caller's UserError subclass."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .errors import UserError


def read_json(path: str | Path, error: type[UserError], what: str = "file") -> Any:
    """The parsed content of `path`; `what` names the file in the message for a missing one."""
    p = Path(path)
    try:
        return json.loads(p.read_text())
    except FileNotFoundError:
        raise error(f"{p}: no such {what}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise error(f"{p}: unreadable ({e})") from None
    except json.JSONDecodeError as e:
        raise error(f"{p}: malformed JSON ({e.msg} at line {e.lineno} column {e.colno})") from None


def read_yaml(path: str | Path, error: type[UserError], what: str = "file") -> Any:
    """The parsed content of a YAML file (safe loader); `what` names the file in messages."""
    import yaml

    p = Path(path)
    try:
        return yaml.safe_load(p.read_text(encoding="utf-8"))
    except OSError as e:
        raise error(f"{p}: cannot read the {what} ({e.strerror or e})") from None
    except UnicodeDecodeError:
        raise error(f"{p}: not a text (UTF-8) {what}") from None
    except yaml.YAMLError as e:
        raise error(f"{p}: not valid YAML ({(str(e).splitlines() or [type(e).__name__])[0]})") from None
