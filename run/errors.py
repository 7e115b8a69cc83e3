"""The error that ends a command with one line for the user, not a traceback.

Every module raises `UserError` for what the user can put right; main.py
turns it into `error: <message>` and exit status 1.
"""


class UserError(Exception):
  """What the user can put right; the message is one line that says how."""
