"""Downloads a data set's original files, each checked, for TFDS to prepare.

TFDS' own download tries an address that does not answer for minutes
(urllib3's ten retries with doubling back-off): offline, a run waited 213 s,
then ended in a page of traceback. Here each file that TFDS registers for
the data set (its address, size and SHA-256) is fetched once, with a
timeout, checked against TFDS' size and SHA-256, and written under a
temporary name that is renamed when whole, so a later run never trusts a
half file; TFDS then prepares the data set from the directory, as from a
manual one. A file already there and whole is not fetched again.
"""

import contextlib
import hashlib
import http.client
import os
import urllib.error
import urllib.parse
import urllib.request

# Seconds to connect, and between two reads, before giving up on a server.
TIMEOUT_SECS = 10
_CHUNK = 1 << 20


class DownloadError(Exception):
  """A file could not be fetched whole; the message is one line."""


def source(url: str, mirror: str) -> str:
  """Where to fetch TFDS' `url` from: `mirror` + its file name, if a mirror."""
  if not mirror:
    return url
  name = os.path.basename(urllib.parse.urlparse(url).path)
  return mirror.rstrip('/') + '/' + name


@contextlib.contextmanager
def whole_file(path: str):
  """A binary file to write that appears at `path` only if written whole.

  It is written under a temporary name, renamed to `path` when the block
  ends, and removed if the block raises (a SystemExit included), so a later
  run never reads half of it.
  """
  incomplete = f'{path}.{os.getpid()}.incomplete'
  try:
    with open(incomplete, 'wb') as f:
      yield f
    os.replace(incomplete, path)
  finally:
    if os.path.exists(incomplete):
      os.remove(incomplete)


def _is_whole(path: str, info) -> bool:
  """Whether `path` has the size and SHA-256 of TFDS' UrlInfo `info`."""
  if not os.path.isfile(path) or os.path.getsize(path) != info.size:
    return False
  with open(path, 'rb') as f:
    return hashlib.file_digest(f, 'sha256').hexdigest() == info.checksum


def fetch(url_infos: dict, directory: str, mirror: str = '') -> None:
  """Fetches each of TFDS' `url_infos` (address -> UrlInfo) into `directory`.

  `mirror`: '' fetches from the addresses themselves, else from the
  directory at this address, which holds the same file names.

  Raises:
    DownloadError: naming the first file that could not be fetched whole.
  """
  os.makedirs(directory, exist_ok=True)
  for url, info in sorted(url_infos.items()):
    path = os.path.join(directory, info.filename)
    if not _is_whole(path, info):
      _fetch_one(source(url, mirror), path, info)


def _fetch_one(url: str, path: str, info) -> None:
  """`url` to `path`, kept only if it is the file that `info` describes."""
  digest, size = hashlib.sha256(), 0
  try:
    with urllib.request.urlopen(url, timeout=TIMEOUT_SECS) as response:
      with whole_file(path) as f:
        while chunk := response.read(_CHUNK):
          digest.update(chunk)
          size += len(chunk)
          f.write(chunk)
        if (size, digest.hexdigest()) != (info.size, info.checksum):
          raise DownloadError(
              f'{url} sent {size} bytes that are not the file TFDS registers '
              f'({int(info.size)} bytes, SHA-256 {info.checksum[:12]}...)'
          )
  except (OSError, http.client.HTTPException) as e:
    raise DownloadError(f'cannot download {url} ({_cause(e)})') from None


def _cause(error: Exception) -> str:
  """A failed fetch's cause in one line.

  A URLError's reason (a name that does not resolve, a timeout); an
  HTTPError's own text, which has the status ('HTTP Error 404: Not Found').
  """
  if isinstance(error, urllib.error.URLError) and not isinstance(
      error, urllib.error.HTTPError
  ):
    error = error.reason
  return ' '.join(str(error).split()) or type(error).__name__
