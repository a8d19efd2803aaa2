"""The one exception type a user should ever see.

Anything raised as `UserError` is printed by the CLI as a single line (no traceback unless `--debug`)
and exits with status 2. Its message must name the bad value and say how to fix it.
"""


class UserError(Exception):
    """Bad input from the user: config, data, model path, method name, plugin."""
