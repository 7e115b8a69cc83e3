"""The errors that end a command with one line for the user, not a traceback.

Each module raises its own kind (ConfigError, DataError, WorkdirError,
WriteError, TrainingError), all of them `UserError`, which main.py turns
into `error: <message>` and exit status 1.
"""


class UserError(Exception):
  """What the user can put right; the message is one line that says how."""
