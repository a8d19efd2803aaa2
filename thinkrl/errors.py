"""The one exception type a user should ever see.

Anything raised as `UserError` is printed by the CLI as a single line (no traceback unless `--debug`)
and exits with status 2. Its message must name the bad value and say how to fix it; `short` echoes a value
with a length cap, and the CLI prints at most MAX_MESSAGE_CHARS of a message (`capped`).
"""


class UserError(Exception):
    """Bad input from the user: config, data, model path, method name, plugin."""


MAX_MESSAGE_CHARS = 2000  # what the CLI prints of one error; the rest is counted, not printed
MAX_VALUE_CHARS = 120  # a value echoed in a message


def short(value: object, limit: int = MAX_VALUE_CHARS) -> str:
    """repr(value) for a message, cut to `limit` characters: a bad value may be a whole file's worth (a list that
    nested YAML aliases expanded, a grader's return value), and the message must stay one readable line."""
    import reprlib

    r = reprlib.Repr()
    r.maxlevel, r.maxlist, r.maxtuple, r.maxdict, r.maxset, r.maxstring, r.maxother = 3, 8, 8, 8, 8, limit, limit
    r.maxlong = 40  # a 10**400 prints as its first and last digits
    try:
        text = r.repr(value)
    except Exception:  # an int past Python's 4,300-digit conversion limit, a repr that raises
        text = f"<a {type(value).__name__}>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def capped(message: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    """`message` cut to `limit` characters, saying how many more there were."""
    if len(message) <= limit:
        return message
    return f"{message[:limit]}... ({len(message) - limit} more characters)"
