"""Reading a user's JSON file with one-line errors that name it (a missing file, unreadable bytes,
malformed JSON with its line and column), raised as the caller's UserError subclass."""
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
