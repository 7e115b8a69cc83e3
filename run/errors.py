"""The error that main.py prints as one line, `error: <message>`, exit status 1."""


class UserError(Exception):
  """What the user can put right; the message is one line that says how."""


def one_line(text) -> str:
  return ' '.join(str(text).split())


def innermost(error: BaseException) -> BaseException:
  """Under requests', urllib3's and urllib's wrappers: a refusal, ..."""
  inner = error.__cause__ or error.__context__
  if inner and type(error).__module__.startswith(('requests.', 'urllib')):
    return innermost(inner)
  return error
