"""The error that main.py prints as one line, `error: <message>`, exit status 1."""


class UserError(Exception):
  """What the user can put right; the message is one line that says how."""
