"""Downloads a data set's original files, each checked, for TFDS to prepare.

TFDS' own download retries an address that does not answer for minutes
(urllib3's ten retries, doubling back-off) and has no setting for it. Here
each file is fetched once, with a timeout, and kept only if whole.
"""

import contextlib
import hashlib
import os
import urllib.parse
import urllib.request

import requests
from run import errors
import urllib3

TIMEOUT_SECS = 10  # To connect, and between two reads.


class DownloadError(Exception):
  """A file could not be fetched whole; the message is one line."""


@contextlib.contextmanager
def whole_file(path: str):
  """A binary file to write that appears at `path` only if written whole:
  removed if the block raises (SystemExit too), no later run reads half of it.
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


def _open(url: str):
  """`url`'s bytes as sent; a file:// URL's by urllib (requests cannot)."""
  if url.startswith('file://'):
    return urllib.request.urlopen(url)
  response = requests.get(url, stream=True, timeout=TIMEOUT_SECS)
  if not response.ok:
    response.close()
    raise OSError(f'HTTP Error {response.status_code}: {response.reason}')
  return response.raw


def fetch(url_infos: dict, directory: str, mirror: str = '') -> None:
  """Fetches TFDS' `url_infos` (address -> UrlInfo) into `directory`, from
  the addresses or from `mirror`, a directory of the same file names; a file
  already there and whole is kept.
  """
  os.makedirs(directory, exist_ok=True)
  for url, info in sorted(url_infos.items()):
    path = os.path.join(directory, info.filename)
    if mirror:
      name = os.path.basename(urllib.parse.urlparse(url).path)
      url = mirror.rstrip('/') + '/' + name
    if _is_whole(path, info):
      continue
    try:
      with _open(url) as source, whole_file(path) as f:
        size = int(info.size)
        # At most one byte more than the file: a server cannot fill the disk.
        data = source.read(size + 1)
        f.write(data)
        f.flush()
        if not _is_whole(f.name, info):
          sent = len(data) if len(data) <= size else f'over {size}'
          raise DownloadError(
              f'{url} sent {sent} bytes that are not the file TFDS '
              f'registers ({size} bytes, SHA-256 '
              f'{info.checksum[:12]}...)'
          )
    except (OSError, urllib3.exceptions.HTTPError) as e:
      cause = errors.innermost(e)
      cause = errors.one_line(cause) or type(cause).__name__
      raise DownloadError(f'cannot download {url} ({cause})') from None
