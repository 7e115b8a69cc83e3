"""Tests of download.py against loopback HTTP servers of the original files."""

import contextlib
import functools
import http.server
import os
from run import errors
import shutil
import socket
import threading

from configs import default
from data import sources
from data import download
import input_pipeline
import pytest
import tensorflow_datasets as tfds


class _QuietHandler(http.server.SimpleHTTPRequestHandler):

  def log_message(self, *args):
    pass


@contextlib.contextmanager
def _serving(directory):
  """An HTTP server of `directory` on 127.0.0.1: its URL, ending in /."""
  handler = functools.partial(_QuietHandler, directory=str(directory))
  server = http.server.ThreadingHTTPServer(('127.0.0.1', 0), handler)
  server.daemon_threads = True
  threading.Thread(target=server.serve_forever, daemon=True).start()
  try:
    yield f'http://127.0.0.1:{server.server_address[1]}/'
  finally:
    server.shutdown()
    server.server_close()


@pytest.fixture(scope='module')
def url_infos():
  """TFDS' addresses, sizes and SHA-256 of MNIST's four files."""
  return tfds.builder('mnist').url_infos


@pytest.fixture
def mirror(mnist_files, tmp_path):
  """A writable copy of the four files, to serve as they are or damaged."""
  directory = tmp_path / 'mirror'
  shutil.copytree(mnist_files, directory)
  return directory


def _listing(directory) -> list[str]:
  return sorted(os.listdir(directory)) if os.path.isdir(directory) else []


def _fetch_error(url_infos, mirror, target) -> tuple[str, str]:
  """The mirror's URL, and the DownloadError that fetching from it raises."""
  with _serving(mirror) as url:
    with pytest.raises(download.DownloadError) as error:
      download.fetch(url_infos, str(target), url)
  return url, str(error.value)


def test_the_four_files_are_fetched_checked_and_kept(
    url_infos, mirror, tmp_path
):
  target = tmp_path / 'downloads'
  with _serving(mirror) as url:
    download.fetch(url_infos, str(target), url)
  names = sorted(info.filename for info in url_infos.values())
  assert _listing(target) == names
  for name in names:
    assert (target / name).read_bytes() == (mirror / name).read_bytes()
  # Whole files are not fetched again: a server with none of them does.
  with _serving(tmp_path / 'empty') as url:
    download.fetch(url_infos, str(target), url)


def test_a_file_url_is_read_as_a_mirror(url_infos, mirror, tmp_path):
  target = tmp_path / 'downloads'
  download.fetch(url_infos, str(target), mirror.as_uri())
  names = sorted(info.filename for info in url_infos.values())
  assert _listing(target) == names


def test_a_file_the_server_does_not_have(url_infos, mirror, tmp_path):
  (mirror / 'train-images-idx3-ubyte.gz').unlink()
  target = tmp_path / 'downloads'
  url, error = _fetch_error(url_infos, mirror, target)
  assert error == (
      f'cannot download {url}train-images-idx3-ubyte.gz (HTTP Error 404: '
      'File not found)'
  )
  # The files fetched before it are kept, whole; nothing of the missing one.
  assert _listing(target) == [
      't10k-images-idx3-ubyte.gz',
      't10k-labels-idx1-ubyte.gz',
  ]


def test_a_truncated_file_is_not_kept(url_infos, mirror, tmp_path):
  path = mirror / 't10k-images-idx3-ubyte.gz'
  path.write_bytes(path.read_bytes()[:100_000])
  target = tmp_path / 'downloads'
  url, error = _fetch_error(url_infos, mirror, target)
  assert error == (
      f'{url}t10k-images-idx3-ubyte.gz sent 100000 bytes that are not the '
      'file TFDS registers (1648877 bytes, SHA-256 8d422c7b0a1c...)'
  )
  assert _listing(target) == []


def test_a_file_longer_than_registered_is_read_no_further(
    url_infos, mirror, tmp_path
):
  path = mirror / 't10k-images-idx3-ubyte.gz'
  path.write_bytes(path.read_bytes() + bytes(50_000_000))
  target = tmp_path / 'downloads'
  url, error = _fetch_error(url_infos, mirror, target)
  assert error == (
      f'{url}t10k-images-idx3-ubyte.gz sent over 1648877 bytes that are not '
      'the file TFDS registers (1648877 bytes, SHA-256 8d422c7b0a1c...)'
  )
  assert _listing(target) == []


def test_a_server_that_does_not_answer(url_infos, tmp_path):
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    port = s.getsockname()[1]
  with pytest.raises(download.DownloadError) as error:
    download.fetch(url_infos, str(tmp_path), f'http://127.0.0.1:{port}/')
  assert str(error.value) == (
      f'cannot download http://127.0.0.1:{port}/t10k-images-idx3-ubyte.gz '
      '([Errno 111] Connection refused)'
  )


def test_an_address_that_does_not_parse_is_named(tmp_path, monkeypatch):
  """Its own cause, not the TFDS check that started the download."""
  monkeypatch.delenv(sources.MANUAL_DIR_ENV, raising=False)
  config = default.get_config()
  config.data_dir = str(tmp_path / 'tfds')
  config.download_url = 'http://127.0.0.1:99999/'
  with pytest.raises(errors.UserError) as error:
    input_pipeline.get_builder(config)
  assert str(error.value).startswith(
      'cannot download http://127.0.0.1:99999/t10k-images-idx3-ubyte.gz '
      '(Failed to parse: http://127.0.0.1:99999/t10k-images-idx3-ubyte.gz); '
  )


@pytest.mark.slow
def test_tfds_prepares_what_was_downloaded(
    url_infos, mirror, tmp_path, monkeypatch
):
  """The run's own path: no manual directory, the files from a mirror."""
  monkeypatch.delenv(sources.MANUAL_DIR_ENV, raising=False)
  config = default.get_config()
  config.data_dir = str(tmp_path / 'tfds')
  with _serving(mirror) as url:
    config.download_url = url
    builder = input_pipeline.get_builder(config)
  assert builder.is_prepared()
  assert _listing(tmp_path / 'tfds' / 'downloads' / 'mnist') == sorted(
      info.filename for info in url_infos.values()
  )


def test_an_error_names_the_way_out(mirror, tmp_path, monkeypatch):
  monkeypatch.delenv(sources.MANUAL_DIR_ENV, raising=False)
  (mirror / 't10k-labels-idx1-ubyte.gz').unlink()
  config = default.get_config()
  config.data_dir = str(tmp_path / 'tfds')
  with _serving(mirror) as url:
    config.download_url = url
    with pytest.raises(errors.UserError) as error:
      input_pipeline.get_builder(config)
  assert str(error.value) == (
      f'cannot download {url}t10k-labels-idx1-ubyte.gz (HTTP Error 404: File '
      'not found); offline, put the four original files '
      '(t10k-images-idx3-ubyte.gz, t10k-labels-idx1-ubyte.gz, '
      'train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz; published at '
      'https://storage.googleapis.com/cvdf-datasets/mnist/) in a directory '
      'and name it in config.manual_dir or $MNIST_MANUAL_DIR for TFDS to '
      "prepare, or read them from there with data_source='idx'"
  )
  assert not tfds.builder('mnist', data_dir=config.data_dir).is_prepared()
