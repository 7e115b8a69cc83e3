"""Tests of web/index.html in a real browser: headless Chromium, Selenium.

The page is served as README.md serves it (Python's http.server, over HTTP),
or opened as a file, and asks tools/serving_standin.py, started with the
flags README.md gives TF Serving (read from README.md), on a model trained
for one short epoch by the fixtures (conftest.py's reading_export), which
reads MNIST's digits well. Digits are drawn as a hand draws them, pointer
down, moves, up, with a mouse, a pen and a finger, ten of them at each of
four heights, anywhere on the pad; the test reads the digit the page shows.
Other stand-ins, without CORS support or without XLA, closed ports and bad
addresses give the page's one-line messages; a phone's viewport, its layout.

Chromium and its driver are Debian's (`apt-get install -y chromium
chromium-driver`); where they are missing the tests are skipped, saying so,
except in CI (CI=true), where they fail. Selenium runs offline: it is handed
the driver and the browser, and downloads nothing.

DRAW_SCREENSHOT=docs/draw.png writes the screenshot of README.md: the page,
answering a digit drawn here; and, beside it, draw_phone.png: the page in a
phone's viewport.
"""

import functools
import http.server
import json
import math
import os
import re
import shutil
import socket
import tempfile
import threading
import time
import urllib.error
import urllib.request

import predict_test
import pytest

os.environ.setdefault('SE_OFFLINE', 'true')  # Selenium Manager: no downloads.

# pylint: disable=g-import-not-at-top,wrong-import-position
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.actions import interaction
from selenium.webdriver.common.actions.action_builder import ActionBuilder
from selenium.webdriver.common.actions.pointer_input import PointerInput
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import WebDriverWait

# Not in the quick tier (pytest -m "not slow"): a browser and servers.
pytestmark = pytest.mark.slow

WEB = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(WEB)
CHROMIUM = '/usr/bin/chromium'
CHROMEDRIVER = '/usr/bin/chromedriver'
INSTALL = 'apt-get install -y chromium chromium-driver'
CORS_FLAG = '--rest_api_enable_cors_support=true'
XLA_FLAG = '--xla_cpu_compilation_enabled=true'
PAD = 280  # The drawing canvas's pixels, as the page sets them.


@pytest.fixture(scope='module')
def servers(reading_export, tmp_path_factory) -> dict[str, str]:
  """Stand-ins started together: name -> address (http://HOST:PORT).

  'readme' as README.md starts TF Serving; 'no_cors' without CORS support;
  'no_xla' without XLA, and without warm-up (which would fail the load), so
  that it answers every request with TensorFlow's error.
  """
  readme = predict_test.readme_server_flags(os.path.dirname(reading_export))
  variants = {
      'readme': readme,
      'no_cors': [f for f in readme if f != CORS_FLAG],
      'no_xla': [f for f in readme if f != XLA_FLAG]
      + ['--enable_model_warmup=false'],
  }
  logs = tmp_path_factory.mktemp('standins')
  started = {
      name: predict_test.StandIn(server_flags, str(logs / name))
      for name, server_flags in variants.items()
  }
  try:
    for server in started.values():
      server.wait_until_served()
    yield {name: f'http://{server.rest}' for name, server in started.items()}
  finally:
    for server in started.values():
      server.stop()


class _Quiet(http.server.SimpleHTTPRequestHandler):

  def log_message(self, *args):
    del args


@pytest.fixture(scope='module')
def page() -> str:
  """web/ served over HTTP, as README.md serves it: the page's address."""
  server = http.server.ThreadingHTTPServer(
      ('127.0.0.1', 0), functools.partial(_Quiet, directory=WEB)
  )
  thread = threading.Thread(target=server.serve_forever, daemon=True)
  thread.start()
  yield f'http://127.0.0.1:{server.server_address[1]}/'
  server.shutdown()
  server.server_close()


@pytest.fixture(scope='module')
def browser():
  """Headless Chromium, driven by Debian's chromedriver; skipped if missing.

  In CI (CI=true) a missing browser fails the tests instead.
  """
  missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not shutil.which(p)]
  if missing:
    why = f'{" and ".join(missing)} missing: {INSTALL}'
    if os.environ.get('CI') == 'true':
      pytest.fail(why, pytrace=False)
    pytest.skip(why)
  profile = tempfile.mkdtemp(prefix='page-test-chromium-')
  options = webdriver.ChromeOptions()
  options.binary_location = CHROMIUM
  for argument in (
      '--headless=new',
      '--no-sandbox',
      '--disable-gpu',
      '--disable-dev-shm-usage',
      '--disable-quic',
      '--no-first-run',
      '--disable-background-networking',
      '--disable-component-update',
      '--disable-sync',
      # Input is taken as fast as it comes, not a frame at a time: a
      # drawing's hundreds of moves in a fraction of a second.
      '--disable-frame-rate-limit',
      '--window-size=800,720',
      f'--user-data-dir={profile}',
  ):
    options.add_argument(argument)
  driver = webdriver.Chrome(
      service=Service(executable_path=CHROMEDRIVER), options=options
  )
  try:
    yield driver
  finally:
    driver.quit()
    shutil.rmtree(profile, ignore_errors=True)


def _message(driver) -> tuple[str, str]:
  """Waits for the page's answer: its message line's state and text."""
  element = driver.find_element('id', 'message')
  WebDriverWait(driver, 30, poll_frequency=0.05).until(
      lambda _: element.get_attribute('data-state') in ('ok', 'error', 'idle')
  )
  return element.get_attribute('data-state'), element.text


def _type_address(driver, address: str) -> None:
  """Types `address` over the page's server field: the page asks again.

  As a user types over it: all selected, then replaced (Selenium's clear()
  would tell the page of an empty field first).
  """
  field = driver.find_element('id', 'address')
  field.send_keys(Keys.CONTROL, 'a')
  field.send_keys(address or Keys.BACKSPACE, Keys.TAB)
  driver.execute_script('document.activeElement.blur();')


def _open(driver, page: str, address: str) -> None:
  """Opens the page and types `address` into its server field."""
  driver.get(page)
  _type_address(driver, address)


def _marked_invalid(driver) -> bool:
  return driver.execute_script(
      "return document.getElementById('address').matches(':invalid');"
  )


def _opacity(driver, element_id: str) -> float:
  return float(
      driver.execute_script(
          'return getComputedStyle(document.getElementById(arguments[0]))'
          '.opacity;',
          element_id,
      )
  )


# Digits as a hand draws them: strokes of points in a unit box, x right and
# y down, drawn at a size and place on the pad, with points every few pixels.


def _ellipse(points: int = 40) -> list[tuple[float, float]]:
  return [
      (0.5 - 0.5 * math.sin(a), 0.5 - 0.5 * math.cos(a))
      for a in (2.1 * math.pi * i / points for i in range(points + 1))
  ]


DIGITS = {
    0: [_ellipse()],
    1: [[(0.6, 0.0), (0.4, 1.0)]],
    4: [[(0.15, 0.0), (0.0, 0.6), (1.0, 0.6)], [(0.7, 0.1), (0.7, 1.0)]],
    7: [[(0.0, 0.05), (1.0, 0.0), (0.35, 1.0)]],
}


def _rounded(points, per: int = 6) -> list[tuple[float, float]]:
  """A smooth curve through `points`, as a hand rounds them (Catmull-Rom)."""
  ends = [points[0], *points, points[-1]]
  curve = [points[0]]
  for p0, p1, p2, p3 in zip(ends, ends[1:], ends[2:], ends[3:]):
    for t in (i / per for i in range(1, per + 1)):
      curve.append(
          tuple(
              b
              + 0.5 * (c - a) * t
              + (a - 2.5 * b + 2 * c - 0.5 * d) * t**2
              + 0.5 * (3 * b - a - 3 * c + d) * t**3
              for a, b, c, d in zip(p0, p1, p2, p3)
          )
      )
  return curve


def _stroke(text: str) -> list[tuple[float, float]]:
  """A stroke written as 'x,y x,y ...', in hundredths of the unit box.

  Its pieces, split by '|', follow each other without a lift; a piece after
  '~' is rounded through its points, the others are straight lines.
  """
  points = []
  for piece in text.split('|'):
    piece = piece.strip()
    corners = [
        tuple(int(v) / 100 for v in xy.split(','))
        for xy in piece.lstrip('~').split()
    ]
    line = _rounded(corners) if piece.startswith('~') else corners
    points += line[1:] if points and line[0] == points[-1] else line
  return points


# Ten digits as people write them, each stroke in the order and direction a
# hand draws it: width / height, and the strokes. The page is to read at
# least 9 of the 10 at each of HEIGHTS, as MNIST was made from writing of
# every size.
TEN_DIGITS = {
    0: (0.7, ['~55,0 20,10 2,45 12,85 45,100 85,85 100,45 85,10 50,0 35,6']),
    1: (0.25, ['90,0 10,100']),
    2: (0.65, ['~5,25 30,3 65,2 90,20 80,48 45,75 3,100 | 55,97 100,98']),
    3: (0.6, ['~8,10 45,0 85,12 80,35 40,47 85,60 95,82 60,100 5,90']),
    4: (0.75, ['50,0 0,65 100,63', '72,25 70,100']),
    5: (
        0.62,
        [
            '22,2 15,45 | ~15,45 50,37 88,50 95,75 70,97 35,100 5,88',
            '22,2 95,0',
        ],
    ),
    6: (0.65, ['~80,0 40,20 12,50 8,80 35,100 75,95 92,72 70,52 35,55 12,72']),
    7: (0.65, ['0,5 100,0 35,100']),
    8: (
        0.6,
        [
            '~85,12 50,0 13,14 20,33 50,47 85,64 88,88 50,100 12,88 15,64 '
            '50,47 80,32 85,12'
        ],
    ),
    9: (0.6, ['~90,15 55,0 15,8 8,30 35,45 75,38 92,15 | ~92,15 88,60 78,100']),
}
HEIGHTS = (240, 160, 100, 70)  # Pad pixels, of a pad of 280.


def _along(stroke, step: float) -> list[tuple[float, float]]:
  """The points a pointer reports along the stroke: about `step` apart.

  Its ends and the corners between straight lines are among them.
  """
  points = [stroke[0]]
  for i, (x1, y1) in enumerate(stroke[1:], 2):
    x0, y0 = points[-1]
    gap = math.hypot(x1 - x0, y1 - y0)
    if gap < step and i < len(stroke):
      continue  # A curve's next point, too close to report.
    n = max(1, math.ceil(gap / step))
    points += [
        (x0 + (x1 - x0) * j / n, y0 + (y1 - y0) * j / n)
        for j in range(1, n + 1)
    ]
  return points


def draw(driver, strokes, left, top, width, height, kind='mouse') -> None:
  """Draws unit-box `strokes` in the pad's box (left, top, width, height).

  Pointer down, a move every 12 pixels or so (a quick stroke, as a mouse
  reports it 60 times a second), up, for each stroke: with a mouse, a pen or
  a finger (`kind`).
  """
  pad = driver.find_element('id', 'pad')
  pointer = PointerInput(
      {
          'mouse': interaction.POINTER_MOUSE,
          'pen': interaction.POINTER_PEN,
          'touch': interaction.POINTER_TOUCH,
      }[kind],
      kind,
  )
  actions = ActionBuilder(driver, mouse=pointer, duration=0)
  # The drawing area's CSS pixels per pad pixel, inside the border.
  scale = driver.execute_script('return arguments[0].clientWidth;', pad) / PAD
  for stroke in strokes:
    unit = 12 / max(width, height, 1)
    for i, (x, y) in enumerate(_along(stroke, unit)):
      # Offsets from the pad's centre, in CSS pixels.
      dx = round((left + x * width - PAD / 2) * scale)
      dy = round((top + y * height - PAD / 2) * scale)
      actions.pointer_action.move_to(pad, dx, dy)
      if i == 0:
        actions.pointer_action.pointer_down()
    actions.pointer_action.pointer_up()
  actions.perform()


def clear(driver) -> None:
  driver.find_element('id', 'clear').click()


def shown_digit(driver) -> str:
  return driver.find_element('id', 'digit').text.strip()


@pytest.fixture
def drawing_page(browser, page, servers):
  """The page, asking the stand-in started as README.md starts TF Serving."""
  _open(browser, page, servers['readme'])
  return browser


@pytest.mark.parametrize(
    'digit, box, kind',
    [
        (0, (60, 30, 150, 220), 'mouse'),
        (1, (170, 60, 60, 180), 'pen'),
        (4, (20, 20, 240, 240), 'touch'),
        (7, (30, 130, 110, 130), 'mouse'),
        (7, (100, 20, 160, 200), 'pen'),
        (0, (150, 150, 90, 110), 'touch'),
    ],
)
def test_a_drawn_digit_is_answered(drawing_page, digit, box, kind):
  draw(drawing_page, DIGITS[digit], *box, kind=kind)
  state, text = _message(drawing_page)
  assert state == 'ok', text
  assert shown_digit(drawing_page) == str(digit)
  assert _opacity(drawing_page, 'digit') == 1  # Not shown as old.
  bars = drawing_page.find_elements('css selector', '#bars li')
  assert len(bars) == 10
  (top,) = drawing_page.find_elements('css selector', '#bars li.top')
  assert top.text.startswith(str(digit))
  clear(drawing_page)
  assert shown_digit(drawing_page) == ''


@pytest.mark.parametrize('height', HEIGHTS)
def test_ten_digits_of_a_height_are_read(drawing_page, height):
  """Each of the ten, `height` pixels tall, somewhere on the pad: 9 read right.

  They sit at different places, corners included; a mouse, a pen and a
  finger take turns.
  """
  answers = {}
  for digit, (aspect, texts) in TEN_DIGITS.items():
    width = aspect * height
    # A fraction of the room left on each axis.
    across, down = (digit * 0.37) % 1, (digit * 0.61 + 0.2) % 1
    left, top = across * (PAD - width), down * (PAD - height)
    kind = ('mouse', 'pen', 'touch')[(digit + height) % 3]
    strokes = [_stroke(text) for text in texts]
    draw(drawing_page, strokes, left, top, width, height, kind=kind)
    state, text = _message(drawing_page)
    assert state == 'ok', text
    answers[digit] = shown_digit(drawing_page)
    clear(drawing_page)
  wrong = {d: int(a) for d, a in answers.items() if a != str(d)}
  print(f'{height} px: {10 - len(wrong)} of 10 read right; misread: {wrong}')
  assert len(wrong) <= 1, f'{height} px: digits misread, as {wrong}'


def test_screenshot(drawing_page):
  """Writes the page answering a drawn 4 to $DRAW_SCREENSHOT, if set."""
  path = os.environ.get('DRAW_SCREENSHOT')
  if not path:
    pytest.skip('DRAW_SCREENSHOT names no file to write')
  draw(drawing_page, DIGITS[4], 50, 40, 170, 210, kind='pen')
  assert _message(drawing_page)[0] == 'ok'
  assert drawing_page.save_screenshot(os.path.join(ROOT, path))


def test_the_page_sends_what_mnist_was_prepared_as(drawing_page):
  """The 28x28 image shown: the digit's box in 20x20, centred by its mass."""
  draw(drawing_page, DIGITS[1], 200, 10, 40, 120)
  _message(drawing_page)
  pixels = drawing_page.execute_script(
      "const c = document.getElementById('seen').getContext('2d');"
      'return Array.from(c.getImageData(0, 0, 28, 28).data)'
      '.filter((_, i) => i % 4 == 0);'
  )
  rows = [pixels[28 * y : 28 * y + 28] for y in range(28)]
  ys = [y for y in range(28) if any(rows[y])]
  xs = [x for x in range(28) if any(r[x] for r in rows)]
  assert len(ys) == 20 and len(xs) < 20  # The longer side fills 20.
  mass = sum(pixels)
  centre_x = sum(v * (i % 28 + 0.5) for i, v in enumerate(pixels)) / mass
  centre_y = sum(v * (i // 28 + 0.5) for i, v in enumerate(pixels)) / mass
  # In the pixel (14, 14), as in MNIST's images, moved by whole pixels.
  assert 14 <= centre_x < 15 and 14 <= centre_y < 15
  clear(drawing_page)


def _ink(driver, canvas: str, x: int, y: int) -> int:
  """The red of the pixel (x, y) of a canvas of the page: 255 is white."""
  return driver.execute_script(
      'return document.getElementById(arguments[0]).getContext("2d")'
      '.getImageData(arguments[1], arguments[2], 1, 1).data[0];',
      canvas,
      x,
      y,
  )


@pytest.mark.parametrize('kind', ['touch', 'pen', 'mouse'])
def test_a_tap_leaves_a_dot(drawing_page, kind):
  """Down and up in one place: a dot on the pad, and the model is asked."""
  draw(drawing_page, [[(0, 0)]], 90, 150, 0, 0, kind=kind)
  assert _ink(drawing_page, 'pad', 90, 150) == 255
  assert _ink(drawing_page, 'pad', 90, 170) == 0
  state, text = _message(drawing_page)
  assert state == 'ok', text
  assert _ink(drawing_page, 'seen', 14, 14) > 0
  clear(drawing_page)


def test_a_scribble_is_answered(drawing_page):
  zigzag = [[(i / 8, (i % 2) * 0.9 + 0.05 * i / 8) for i in range(9)]]
  draw(drawing_page, zigzag, 40, 60, 200, 160)
  state, text = _message(drawing_page)
  assert state == 'ok', text
  assert shown_digit(drawing_page) in list('0123456789')
  clear(drawing_page)


def test_an_empty_canvas_sends_nothing(drawing_page, servers):
  _open(drawing_page, drawing_page.current_url, servers['readme'] + '/')
  assert _message(drawing_page) == (
      'idle',
      'the canvas is empty: draw a digit first',
  )


def test_the_address_is_remembered(browser, page, servers):
  _open(browser, page, servers['no_cors'])
  browser.refresh()
  assert browser.find_element('id', 'address').get_attribute('value') == (
      servers['no_cors']
  )
  _open(browser, page, servers['readme'])


def test_the_page_opened_as_a_file(browser, servers):
  """Double-clicked, file://: a page of origin null, answered all the same."""
  _open(browser, f'file://{WEB}/index.html', servers['readme'])
  aspect, texts = TEN_DIGITS[7]
  draw(browser, [_stroke(t) for t in texts], 60, 40, aspect * 160, 160)
  state, text = _message(browser)
  assert state == 'ok', text
  assert shown_digit(browser) == '7'
  _open(browser, f'file://{WEB}/index.html', servers['no_cors'])
  draw(browser, [_stroke(t) for t in texts], 60, 40, aspect * 160, 160)
  assert _message(browser) == (
      'error',
      f'the server at {servers["no_cors"]} refused the page: start TF '
      f'Serving with {CORS_FLAG}',
  )


# What goes wrong: one line each.


def test_a_model_the_server_lacks(drawing_page, servers):
  """A change of the model's name asks again, about the same drawing."""
  draw(drawing_page, DIGITS[1], 100, 40, 60, 200)
  assert _message(drawing_page)[0] == 'ok'
  field = drawing_page.find_element('id', 'model')
  field.clear()
  field.send_keys('mnst', Keys.TAB)
  assert _message(drawing_page) == (
      'error',
      f'the server at {servers["readme"]} answered 404: Servable not found '
      'for request: Latest(mnst)',
  )
  field.clear()
  field.send_keys('mnist', Keys.TAB)
  assert _message(drawing_page)[0] == 'ok'


def test_no_server(browser, page):
  address = f'http://127.0.0.1:{predict_test._free_port()}'
  _open(browser, page, address)
  draw(browser, DIGITS[1], 100, 40, 60, 200)
  assert _message(browser) == (
      'error',
      f'no server answers at {address}: is TF Serving running?',
  )


def test_a_server_without_cors_support(browser, page, servers):
  _open(browser, page, servers['no_cors'])
  draw(browser, DIGITS[1], 100, 40, 60, 200)
  assert _message(browser) == (
      'error',
      f'the server at {servers["no_cors"]} refused the page: start TF '
      f'Serving with {CORS_FLAG}',
  )


def test_a_server_without_xla(browser, page, servers):
  _open(browser, page, servers['no_xla'])
  draw(browser, DIGITS[7], 60, 40, 160, 200)
  # The server's own error, for the page's own request.
  png = browser.execute_script(
      "return document.getElementById('seen').toDataURL('image/png')"
      ".split(',')[1];"
  )
  request = urllib.request.Request(
      f'{servers["no_xla"]}/v1/models/mnist:predict',
      json.dumps(
          {'signature_name': 'serving_bytes', 'instances': [{'b64': png}]}
      ).encode(),
  )
  with pytest.raises(urllib.error.HTTPError) as error:
    urllib.request.urlopen(request, timeout=30)
  assert error.value.code == 500
  cause = json.loads(error.value.read())['error'].splitlines()[0]
  assert cause == 'XLA compilation disabled'
  assert _message(browser) == (
      'error',
      f'the server at {servers["no_xla"]} answered 500: {cause}: start TF '
      f'Serving with {XLA_FLAG} (--xla_gpu_compilation_enabled=true on its '
      'GPU image)',
  )


def test_a_server_that_never_answers(browser, page, servers):
  """A port that takes connections and answers nothing: 10 s, then a line.

  Meanwhile the answer to the drawing before shows as old.
  """
  _open(browser, page, servers['readme'])
  draw(browser, DIGITS[1], 100, 40, 60, 200)
  assert _message(browser)[0] == 'ok'
  with socket.socket() as listener:
    listener.bind(('127.0.0.1', 0))
    listener.listen()
    address = f'http://127.0.0.1:{listener.getsockname()[1]}'
    _type_address(browser, address)  # The same drawing, asked again.
    started = time.monotonic()
    assert browser.find_element('id', 'message').text == (
        f'asking {address} ...'
    )
    assert shown_digit(browser) == '1'
    assert _opacity(browser, 'digit') < 0.5
    assert _opacity(browser, 'bars') < 0.5
    assert _message(browser) == (
        'error',
        f'the server at {address} did not answer within 10 s',
    )
    assert time.monotonic() - started < 15
    assert shown_digit(browser) == ''


# The server's address.


def test_an_address_without_a_scheme_is_http(browser, page, servers):
  host_port = servers['readme'].removeprefix('http://')
  _open(browser, page, host_port)
  assert not _marked_invalid(browser)
  draw(browser, DIGITS[1], 100, 40, 60, 200)
  state, text = _message(browser)
  assert state == 'ok', text
  assert text.startswith(f'answered by http://{host_port} (model mnist')


@pytest.mark.parametrize(
    'address, why',
    [
        ('', 'no server address'),
        ('localhost:85 01', 'localhost:85 01 is not a server address'),
        (
            'ftp://localhost:8501',
            'the page asks a server over http or https, not ftp',
        ),
    ],
)
def test_an_address_the_page_cannot_ask(browser, page, address, why):
  """Said as it is typed, before anything is drawn; the field is marked."""
  _open(browser, page, address)
  assert _message(browser) == (
      'error',
      f'{why}: write it as host:port, e.g. localhost:8501',
  )
  assert _marked_invalid(browser)
  if address:  # Remembered, and marked as the page opens again.
    browser.refresh()
    assert _marked_invalid(browser)


def test_https_to_a_plain_http_server(browser, page, servers):
  """TF Serving's REST API is plain HTTP: https:// to it is said so."""
  plain = servers['readme']
  secure = plain.replace('http://', 'https://')
  _open(browser, page, secure)
  draw(browser, DIGITS[1], 100, 40, 60, 200)
  assert _message(browser) == (
      'error',
      f'the server at {secure} speaks plain HTTP, not HTTPS (as TF '
      f"Serving's REST API does): use {plain}",
  )
  assert not _marked_invalid(browser)


# On a phone.


def _on_screen(driver, width: int, height: int) -> None:
  """Asserts that the pad, the answer's digit and the message line are seen.

  All within the viewport, `width` x `height`, the page not scrolled.
  """
  assert driver.execute_script('return [scrollX, scrollY];') == [0, 0]
  for element_id in ('pad', 'digit', 'message'):
    box = driver.execute_script(
        'return document.getElementById(arguments[0])'
        '.getBoundingClientRect().toJSON();',
        element_id,
    )
    assert 0 <= box['left'] and box['right'] <= width, (element_id, box)
    assert 0 <= box['top'] and box['bottom'] <= height, (element_id, box)


def test_on_a_phone_the_pad_answer_and_message_are_seen(browser, page, servers):
  """A 400x657 viewport: the pad, the digit and the message line at once.

  With an answer, and with the longest line, an error. DRAW_SCREENSHOT (as
  docs/draw.png) also writes the first as draw_phone.png beside it.
  """
  size = browser.get_window_size()
  chrome = browser.execute_script('return outerHeight - innerHeight;')
  browser.set_window_size(400, 657 + chrome)
  try:
    viewport = browser.execute_script('return [innerWidth, innerHeight];')
    assert viewport == [400, 657]
    _open(browser, page, servers['readme'])
    aspect, texts = TEN_DIGITS[3]
    strokes = [_stroke(text) for text in texts]
    draw(browser, strokes, 90, 50, aspect * 180, 180, kind='touch')
    assert _message(browser)[0] == 'ok'
    assert shown_digit(browser) == '3'
    _on_screen(browser, *viewport)
    if path := os.environ.get('DRAW_SCREENSHOT'):
      phone = os.path.join(os.path.dirname(path), 'draw_phone.png')
      assert browser.save_screenshot(os.path.join(ROOT, phone))
    _type_address(browser, servers['no_xla'])
    assert _message(browser)[0] == 'error'
    _on_screen(browser, *viewport)
  finally:
    browser.set_window_size(size['width'], size['height'])


# The stand-in's CORS, as TF Serving's REST server answers.


def _ask(
    url: str, method: str, headers: dict, data: bytes | None = None
) -> tuple[int, dict, bytes]:
  request = urllib.request.Request(
      url, data=data, method=method, headers=headers
  )
  try:
    with urllib.request.urlopen(request, timeout=30) as answer:
      return answer.status, dict(answer.headers), answer.read()
  except urllib.error.HTTPError as e:
    return e.code, dict(e.headers), e.read()


CORS_HEADERS = {
    'Access-Control-Allow-Origin': '*',
    'Access-Control-Allow-Methods': 'POST, GET',
    'Access-Control-Allow-Headers': 'Content-Type',
}


def _cors(headers: dict) -> dict:
  """The CORS headers among `headers`."""
  return {k: headers[k] for k in CORS_HEADERS if k in headers}


@pytest.mark.parametrize(
    'variant, cors', [('readme', True), ('no_cors', False)]
)
def test_the_standin_answers_cors_as_tf_serving(servers, variant, cors):
  address = servers[variant]
  predict = f'{address}/v1/models/mnist:predict'
  preflight = {
      'Origin': 'http://127.0.0.1:8000',
      'Access-Control-Request-Method': 'POST',
      'Access-Control-Request-Headers': 'content-type',
  }
  expected = CORS_HEADERS if cors else {}
  # A preflight from a page over HTTP(S): 200, empty. TF Serving looks for
  # http:// or https:// anywhere in the Origin header.
  for origin in ('http://127.0.0.1:8000', 'https://example.com', 'x-http://'):
    status, headers, body = _ask(
        predict, 'OPTIONS', {**preflight, 'Origin': origin}
    )
    assert (status, body, _cors(headers)) == (200, b'', expected)
  # From a file:// page (Origin: null) or none: 400, empty.
  for origin in ({'Origin': 'null'}, {}):
    status, headers, body = _ask(predict, 'OPTIONS', origin)
    assert (status, body, _cors(headers)) == (400, b'', expected)
  # The page's POST: its JSON as text/plain, the type that a browser sends
  # without a preflight, from a file:// page. Answered as JSON is.
  image = [[[0.0]] * 28] * 28
  status, headers, body = _ask(
      predict,
      'POST',
      {'Content-Type': 'text/plain;charset=UTF-8', 'Origin': 'null'},
      json.dumps({'instances': [image]}).encode(),
  )
  assert (status, _cors(headers)) == (200, expected)
  assert len(json.loads(body)['predictions'][0]['probabilities']) == 10
  # The headers on every answer of the API, errors included.
  for url in (f'{address}/v1/models/mnist', f'{address}/v1/models/absent'):
    assert _cors(_ask(url, 'GET', {})[1]) == expected
  # Outside /v1/, no handler: 404, without them.
  status, headers, _ = _ask(f'{address}/', 'OPTIONS', preflight)
  assert (status, _cors(headers)) == (404, {})


def test_the_page_fetches_nothing_else():
  """One file, its script and style inline: nothing from another address."""
  with open(os.path.join(WEB, 'index.html')) as f:
    html = f.read()
  assert not re.search(r'<(script|link|img|iframe)[^>]*(src|href)=', html)
  assert re.findall(r'https?://[^\s\'"<]+', html) == ['http://localhost:8501']
