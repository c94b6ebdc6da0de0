"""The page of `edge-specdec serve` (edge_specdec/serve/static) in a real browser: headless Debian chromium driven
through chromedriver by selenium, against the server on a loopback port.

Opt-in, because it needs chromium and chromedriver installed and takes a minute:

    EDGE_SPECDEC_BROWSER_TESTS=1 pytest tests/test_serve_page.py

The completion test checks the pixels of its screenshot and writes it to $EDGE_SPECDEC_SCREENSHOT if set (the docs'
docs/images/serve-page.png is made that way), else to the test's temporary folder.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import struct
import time
import urllib.error
import urllib.request
import zlib
from pathlib import Path

import pytest

from serve_helpers import health, serve_in_thread

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
SCREENSHOT_ENV = "EDGE_SPECDEC_SCREENSHOT"
PROMPT = "def parse_args("
WAIT = 60  # seconds: the longest any one step may take on a busy 2-core machine

pytestmark = [
    pytest.mark.browser,  # drives a real browser: opt-in, see the skip reason
    pytest.mark.slow,  # and starts a server
    pytest.mark.skipif(os.environ.get("EDGE_SPECDEC_BROWSER_TESTS") != "1",
                       reason="opt-in browser test: set EDGE_SPECDEC_BROWSER_TESTS=1 to run it (needs "
                              f"{CHROMIUM}, {CHROMEDRIVER} and selenium)"),
]


# --- servers and the browser ------------------------------------------------------------------------------------

def without_chat_template(bundle: Path) -> Path:
    """A bundle made a plain text model: its target's chat template removed, from the folder and the manifest."""
    (bundle / "target" / "chat_template.jinja").unlink()
    manifest = json.loads((bundle / "manifest.json").read_text(encoding="utf-8"))
    del manifest["files"]["target/chat_template.jinja"]
    (bundle / "manifest.json").write_text(json.dumps(manifest, indent=2), encoding="utf-8")
    return bundle


@pytest.fixture(scope="module")
def demo_server(tmp_path_factory):
    """The demo without its chat template, so that the page is in completion mode."""
    from edge_specdec.demo import DEMO_BUNDLE
    from edge_specdec.serve import ServerSettings

    bundle = without_chat_template(Path(shutil.copytree(DEMO_BUNDLE, tmp_path_factory.mktemp("page") / "demo")))
    with serve_in_thread(ServerSettings(bundle=str(bundle))) as running:
        yield running


@pytest.fixture
def browser(tmp_path):
    """Headless chromium with a fresh profile; the flags keep it off the (closed) network: no component
    updates, sync or background requests, no QUIC."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    if not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)):
        pytest.skip(f"needs {CHROMIUM} and {CHROMEDRIVER} (Debian: apt install chromium chromium-driver)")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--window-size=1200,900", "--force-color-profile=srgb", f"--user-data-dir={tmp_path / 'profile'}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(WAIT)
    try:
        yield driver
    finally:
        driver.quit()


def post(url: str, body: dict, key: str | None = None) -> tuple[int, dict]:
    """POST JSON and read the JSON answer (an error's too): (status, body)."""
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    if key:
        request.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(request, timeout=WAIT) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=WAIT) as response:
        return json.loads(response.read())


# --- driving the page -------------------------------------------------------------------------------------------

def wait_for(driver, condition, what: str, timeout: float = WAIT):
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout, poll_frequency=0.05).until(lambda d: condition(d), message=what)


def page_state(driver) -> str:
    return driver.find_element("id", "status").get_attribute("data-state")


def wait_state(driver, *states: str, timeout: float = WAIT) -> str:
    wait_for(driver, lambda d: page_state(d) in states, f"the page's status to become one of {states}", timeout)
    return page_state(driver)


def open_page(driver, url: str) -> None:
    driver.get(url + "/")
    wait_state(driver, "ready")


def set_field(driver, element_id: str, value) -> None:
    field = driver.find_element("id", element_id)
    field.clear()
    field.send_keys(str(value))


def type_and_enter(driver, text: str) -> None:
    """Type into the prompt box and press Enter, the page's keyboard way to send."""
    from selenium.webdriver.common.keys import Keys

    driver.find_element("id", "prompt").send_keys(text, Keys.ENTER)


def token_spans(driver, scope: str = "#transcript") -> list[dict]:
    """The streamed spans below `scope`, in order: their source class, exact text (textContent, whitespace kept)
    and token count."""
    return driver.execute_script("""
        return [...document.querySelectorAll(arguments[0] + ' .tok')].map(s => ({
            source: ['draft', 'target', 'grammar'].find(c => s.classList.contains(c)) || '?',
            text: s.textContent, tokens: Number(s.dataset.tokens)}));""", scope)


def text_of(driver, element_id: str) -> str:
    return driver.execute_script("return document.getElementById(arguments[0]).textContent", element_id)


def summary(driver) -> dict:
    """The last chunk's edge_specdec object as the page received it (kept on #stats for scripts)."""
    raw = driver.find_element("id", "stats").get_attribute("data-summary")
    assert raw, "the page kept no statistics from the last chunk"
    return json.loads(raw)


# --- the PNG screenshot -----------------------------------------------------------------------------------------

def decode_png(data: bytes) -> tuple[int, int, int, bytes]:
    """(width, height, channels, pixel bytes) of a non-interlaced 8-bit RGB or RGBA PNG, as chromium writes its
    screenshots; anything else is a ValueError."""
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG")
    pos, idat, header = 8, [], None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        pos += 12 + length  # length, type, body, CRC
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat.append(body)
        elif kind == b"IEND":
            break
    if header is None:
        raise ValueError("no IHDR chunk")
    width, height, depth, colour, _, _, interlace = header
    if depth != 8 or colour not in (2, 6) or interlace:
        raise ValueError(f"unsupported PNG: depth {depth}, colour type {colour}, interlace {interlace}")
    bpp = 3 if colour == 2 else 4
    stride = width * bpp
    raw = zlib.decompress(b"".join(idat))
    if len(raw) != height * (stride + 1):
        raise ValueError("the image data has the wrong size")
    out = bytearray()
    previous = bytearray(stride)
    for y in range(height):  # undo each row's filter (PNG spec, section 9)
        start = y * (stride + 1)
        kind, line = raw[start], bytearray(raw[start + 1:start + 1 + stride])
        if kind == 1:  # Sub: plus the byte one pixel to the left
            for i in range(bpp, stride):
                line[i] = (line[i] + line[i - bpp]) & 0xFF
        elif kind == 2:  # Up: plus the byte above
            line = bytearray((a + b) & 0xFF for a, b in zip(line, previous))
        elif kind == 3:  # Average of left and above
            for i in range(stride):
                left = line[i - bpp] if i >= bpp else 0
                line[i] = (line[i] + ((left + previous[i]) >> 1)) & 0xFF
        elif kind == 4:  # Paeth: plus whichever of left, above, upper-left is nearest to left + above - upper-left
            for i in range(stride):
                a = line[i - bpp] if i >= bpp else 0
                b = previous[i]
                c = previous[i - bpp] if i >= bpp else 0
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 0xFF
        elif kind != 0:
            raise ValueError(f"unknown row filter {kind}")
        out += line
        previous = line
    return width, height, bpp, bytes(out)


def css_rgb(value: str) -> tuple[int, int, int]:
    """'rgb(207, 227, 255)' (a computed colour) -> (207, 227, 255)."""
    numbers = re.findall(r"[\d.]+", value)
    assert len(numbers) >= 3, f"not a colour: {value!r}"
    return tuple(round(float(n)) for n in numbers[:3])


def count_colour(image: tuple[int, int, int, bytes], box: tuple[int, int, int, int], colour: tuple[int, int, int],
                 tolerance: int = 2) -> int:
    """Pixels inside box (left, top, right, bottom, in image pixels) within `tolerance` of colour per channel."""
    width, height, bpp, pixels = image
    left, top, right, bottom = max(box[0], 0), max(box[1], 0), min(box[2], width), min(box[3], height)
    count = 0
    for y in range(top, bottom):
        row = pixels[(y * width + left) * bpp:(y * width + right) * bpp]
        for x in range(0, len(row), bpp):
            if all(abs(row[x + k] - colour[k]) <= tolerance for k in range(3)):
                count += 1
    return count


# --- the tests --------------------------------------------------------------------------------------------------

def test_completion_mode_shows_drafted_and_target_text(demo_server, browser, tmp_path):
    """On a model without a chat template the page continues a prompt, streaming runs of text coloured by source;
    the text is the server's own greedy completion and the statistics line repeats the last chunk's."""
    card = get_json(demo_server.api + "/models")["data"][0]
    open_page(browser, demo_server.url)
    assert browser.find_element("id", "mode").get_attribute("data-mode") == "completion"
    options = [o.get_attribute("value") for o in browser.find_elements("css selector", "#algorithm option")]
    assert options == card["edge_specdec"]["algorithms"]  # the select is filled from the model card
    assert browser.find_element("id", "max-tokens").get_attribute("value") == "128"  # the page's defaults
    assert float(browser.find_element("id", "temperature").get_attribute("value")) == 0.0

    set_field(browser, "max-tokens", 64)
    type_and_enter(browser, PROMPT)
    assert wait_state(browser, "done", "error") == "done", text_of(browser, "error")

    spans = token_spans(browser)
    assert {s["source"] for s in spans} == {"draft", "target"}, spans
    status, reference = post(demo_server.api + "/completions",
                             {"prompt": PROMPT, "max_tokens": 64, "temperature": 0})
    assert status == 200, reference
    shown = "".join(s["text"] for s in spans)
    assert shown == reference["choices"][0]["text"]  # greedy decoding is deterministic: the same text
    assert browser.find_element("css selector", "#transcript .turn .prompt").get_attribute("textContent") == PROMPT
    assert browser.find_element("id", "prompt").get_attribute("value") == ""  # sent, so cleared

    # The statistics: the last chunk's, checked against the spans the stream brought.
    stats = summary(browser)
    tokens = sum(s["tokens"] for s in spans)
    drafted = sum(s["tokens"] for s in spans if s["source"] == "draft")
    assert tokens == reference["usage"]["completion_tokens"]
    # every drafted span is a token the target accepted, drafted by the model or copied (free drafts)
    assert stats["draft_tokens_accepted"] + stats["suffix_tokens_accepted"] + stats["pool_tokens_accepted"] == drafted
    assert stats["algorithm"] == reference["edge_specdec"]["algorithm"]
    final = text_of(browser, "final-stats")
    accepted, proposed = map(int, re.search(r"acceptance (\d+)/(\d+)", final).groups())
    assert (accepted, proposed) == (stats["draft_tokens_accepted"], stats["draft_tokens_proposed"])
    per_pass = float(re.search(r"([\d.]+) tokens per target pass", final).group(1))
    assert per_pass == pytest.approx(tokens / stats["target_passes"], abs=0.006)
    assert re.search(r"algorithm (\S+)", final).group(1) == stats["algorithm"]
    live = text_of(browser, "live-stats")  # the live counters, at their final values
    assert int(re.search(r"(\d+) tokens ·", live).group(1)) == tokens
    assert int(re.search(r"(\d+)% drafted", live).group(1)) == round(100 * drafted / tokens)
    assert re.search(r"[\d.]+ tokens/s", live)

    # The screenshot for the docs, and its pixels: both span colours fill a fair area of the transcript.
    browser.execute_script("document.activeElement.blur()")  # no focus ring or caret in the picture
    png = browser.get_screenshot_as_png()
    screenshot = Path(os.environ.get(SCREENSHOT_ENV) or tmp_path / "serve-page.png")
    screenshot.parent.mkdir(parents=True, exist_ok=True)
    screenshot.write_bytes(png)
    image = decode_png(png)
    ratio = browser.execute_script("return window.devicePixelRatio")
    assert image[0] == round(browser.execute_script("return window.innerWidth") * ratio)
    rect = browser.execute_script(
        "const r = document.getElementById('transcript').getBoundingClientRect();"
        "return [r.left, r.top, r.right, r.bottom];")
    box = tuple(round(v * ratio) for v in rect)
    colours = browser.execute_script("""
        const colour = (sel) => getComputedStyle(document.querySelector(sel)).backgroundColor;
        return [colour('#transcript .tok.draft'), colour('#transcript .tok.target'), colour('#transcript')];""")
    draft, target, background = (css_rgb(c) for c in colours)
    assert len({draft, target, background}) == 3, colours  # two sources, two colours, neither the background
    # (how much the demo drafts depends on the machine, through the drafting guard: the area is counted per
    # character of each source's text on screen, at a third of a 12-pixel cell or more)
    for name, source, colour in (("drafted", "draft", draft), ("target", "target", target)):
        pixels = count_colour(image, box, colour)
        characters = sum(len(s["text"].replace("\n", "")) for s in spans if s["source"] == source)
        least = 12 * 12 * ratio * ratio / 3 * characters
        assert pixels > least > 0, (f"{name} text's background {colour} covers only {pixels} pixels of the "
                                    f"transcript for its {characters} characters")


def test_stop_aborts_and_the_server_cancels(demo_server, browser):
    """Stop aborts the fetch; the page says so, and the server cancels the generation and frees its slot."""
    server = demo_server.server
    cancelled = server.metrics.value("requests_total", endpoint="completion", outcome="cancelled")
    open_page(browser, demo_server.url)
    set_field(browser, "max-tokens", 1000)
    type_and_enter(browser, PROMPT)
    wait_for(browser, lambda d: token_spans(d), "the first streamed text")
    browser.find_element("id", "stop").click()
    assert wait_state(browser, "stopped", "done", "error", timeout=10) == "stopped"
    shown = sum(s["tokens"] for s in token_spans(browser))
    assert 0 < shown < 1000  # it stopped before the end
    assert text_of(browser, "final-stats") == ""  # no last chunk came
    assert browser.find_element("id", "send").is_enabled() and not browser.find_element("id", "stop").is_enabled()
    deadline = time.monotonic() + 5
    while health(demo_server.url)[1].get("busy") != 0 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert health(demo_server.url)[1]["busy"] == 0
    # The generation ended as cancelled (by the disconnect), not as a finished 1000-token run.
    while server.metrics.value("requests_total", endpoint="completion", outcome="cancelled") == cancelled \
            and time.monotonic() < deadline:
        time.sleep(0.1)
    assert server.metrics.value("requests_total", endpoint="completion", outcome="cancelled") == cancelled + 1


def test_a_long_prompt_shows_how_far_its_prefill_got(demo_server, browser):
    """The page asks for return_progress: while a long prompt is prefilled (slowed down here to a second a call)
    the status says how many of its tokens were read, then the text streams as before."""
    sessions = list(demo_server.server.slots.free)  # (the server is idle: every slot is free)

    def slowed(real):
        def slow(*args, on_prefill=None, **kwargs):
            assert on_prefill is not None, "the page did not ask for the prefill's progress"
            return real(*args, on_prefill=lambda progress: (on_prefill(progress), time.sleep(1.0)), **kwargs)
        return slow
    for session in sessions:
        session.generate = slowed(session.generate)
    try:
        open_page(browser, demo_server.url)
        set_field(browser, "max-tokens", 8)
        type_and_enter(browser, "values = [1, 2, 3]; total = sum(values); " * 20)  # 361 tokens: 2 calls or more
        wait_for(browser, lambda d: re.fullmatch(r"reading the prompt: \d+ of \d+ tokens", text_of(d, "status")),
                 "the prefill's progress in the status")
        assert wait_state(browser, "done", "error", "stopped") == "done"
        assert token_spans(browser) and text_of(browser, "status").startswith("done")
    finally:
        for session in sessions:
            del session.generate  # the class's method again


def test_a_chat_message_stopped_while_its_prompt_is_read_leaves_the_conversation(browser):
    """Stop while the server still reads a message's prompt (no reply yet): the message comes back to the box, marked
    failed, and the next request's conversation does not hold it."""
    from edge_specdec.serve import ServerSettings

    with serve_in_thread(ServerSettings()) as running:
        sessions, prompts = list(running.server.slots.free), []

        def slowed(real):
            def slow(prompt, *args, on_prefill=None, **kwargs):
                prompts.append(list(prompt))
                return real(prompt, *args, on_prefill=lambda progress: (on_prefill(progress), time.sleep(1.0)),
                            **kwargs)
            return slow
        for session in sessions:
            session.generate = slowed(session.generate)
        open_page(browser, running.url)
        assert browser.find_element("id", "mode").get_attribute("data-mode") == "chat"
        set_field(browser, "max-tokens", 8)
        long_message = "values = [1, 2, 3]; total = sum(values); " * 20
        type_and_enter(browser, long_message)
        wait_for(browser, lambda d: re.fullmatch(r"reading the prompt: \d+ of \d+ tokens", text_of(d, "status")),
                 "the prefill's progress in the status")
        browser.find_element("id", "stop").click()
        assert wait_state(browser, "stopped", "done", "error", timeout=10) == "stopped"
        assert browser.find_element("id", "prompt").get_attribute("value") == long_message  # back in the box
        assert browser.find_elements("css selector", "#transcript .msg.user.failed")
        assert browser.execute_script("return state.history") == []
        browser.find_element("id", "prompt").clear()
        type_and_enter(browser, "import os")
        assert wait_state(browser, "done", "error", timeout=60) == "done", text_of(browser, "error")
        alone = running.server.engine.chat_prompt([{"role": "user", "content": "import os"}])
        assert prompts[-1] == alone  # the stopped message is not in the conversation the server was sent


def test_server_errors_are_shown(demo_server, browser):
    """A request the server refuses shows the server's own message."""
    limit = demo_server.server.settings.max_tokens
    status, answer = post(demo_server.api + "/completions", {"prompt": PROMPT, "max_tokens": limit + 1})
    assert status == 400
    open_page(browser, demo_server.url)
    set_field(browser, "max-tokens", limit + 1)
    type_and_enter(browser, PROMPT)
    assert wait_state(browser, "error", "done") == "error"
    error = browser.find_element("id", "error")
    assert error.is_displayed() and error.get_attribute("textContent") == answer["error"]["message"]
    assert token_spans(browser) == []


def test_api_key_is_asked_for_and_kept(browser):
    """A server started with --api-key answers 401: the page asks for the key, keeps it in sessionStorage and
    sends it as a Bearer token."""
    from edge_specdec.serve import ServerSettings

    with serve_in_thread(ServerSettings(api_key="s3cret")) as running:
        browser.get(running.url + "/")
        wait_state(browser, "auth")
        assert browser.find_element("id", "auth").is_displayed()
        assert browser.find_element("id", "send").get_attribute("disabled")
        key = browser.find_element("id", "api-key")
        key.send_keys("wrong")
        browser.find_element("id", "save-key").click()
        wait_for(browser, lambda d: d.execute_script("return sessionStorage.length") == 1, "the key to be kept")
        assert wait_state(browser, "auth", "ready") == "auth"  # a wrong key: asked again
        key.send_keys("s3cret")
        browser.find_element("id", "save-key").click()
        wait_state(browser, "ready")
        assert not browser.find_element("id", "auth").is_displayed()
        assert browser.execute_script("return Object.values(sessionStorage)") == ["s3cret"]
        set_field(browser, "max-tokens", 8)
        type_and_enter(browser, PROMPT)
        assert wait_state(browser, "done", "error") == "done", text_of(browser, "error")
        assert token_spans(browser)


def test_chat_mode(browser):
    """A bundle with a chat template, as the demo has, gets a chat: each reply is the server's greedy reply to the
    conversation so far, the earlier replies included."""
    from edge_specdec.serve import ServerSettings

    with serve_in_thread(ServerSettings()) as running:
        assert get_json(running.api + "/models")["data"][0]["edge_specdec"]["chat_template"] is True
        open_page(browser, running.url)
        assert browser.find_element("id", "mode").get_attribute("data-mode") == "chat"
        set_field(browser, "max-tokens", 24)
        # Shift+Enter is a new line in the message, not a send.
        from selenium.webdriver.common.keys import Keys

        browser.find_element("id", "prompt").send_keys("x", Keys.SHIFT + Keys.ENTER)
        assert browser.find_element("id", "prompt").get_attribute("value") == "x\n"
        assert page_state(browser) == "ready" and not browser.find_elements("css selector", "#transcript .msg")
        browser.find_element("id", "prompt").clear()
        history = []
        for message in ("def parse_args(", "import os"):
            type_and_enter(browser, message)
            assert wait_state(browser, "done", "error") == "done", text_of(browser, "error")
            assert browser.find_element("id", "prompt").get_attribute("value") == ""  # sent, so cleared
            replies = browser.find_elements("css selector", "#transcript .msg.assistant")
            spans = token_spans(browser, f"#transcript .msg.assistant:nth-of-type({2 * len(replies)})")
            history.append({"role": "user", "content": message})
            status, reference = post(running.api + "/chat/completions",
                                     {"messages": history, "max_tokens": 24, "temperature": 0})
            assert status == 200, reference
            expected = reference["choices"][0]["message"]["content"]
            assert spans and "".join(s["text"] for s in spans) == expected
            history.append({"role": "assistant", "content": expected})
            # the stats line says how many prompt tokens the server reused (the usage chunk's cached_tokens): from
            # the second turn on, the conversation so far
            wait_for(browser, lambda d: "prompt tokens reused" in text_of(d, "final-stats"), "the usage in the stats")
            cached, prompt = map(int, re.search(r"(\d+) of (\d+) prompt tokens reused",
                                                text_of(browser, "final-stats")).groups())
            usage = json.loads(browser.find_element("id", "stats").get_attribute("data-usage"))
            assert (cached, prompt) == (usage["prompt_tokens_details"]["cached_tokens"], usage["prompt_tokens"])
            assert cached > 0 if len(history) > 2 else cached < prompt
        users = browser.find_elements("css selector", "#transcript .msg.user .body")
        assert [u.get_attribute("textContent") for u in users] == ["def parse_args(", "import os"]


def test_the_options_send_a_system_message_a_schema_top_p_and_a_seed(browser):
    """The Options: a system message and a JSON schema go into the chat request as OpenAI's messages and
    response_format, top-p and a seed beside them; the reply is the server's own to that request, its forced
    tokens shown in the grammar's colour. A schema that is not JSON is refused on the page, before anything is sent."""
    from edge_specdec.serve import ServerSettings

    schema = {"type": "object", "properties": {"answer": {"enum": ["yes", "no"]}}, "required": ["answer"]}
    with serve_in_thread(ServerSettings()) as running:
        open_page(browser, running.url)
        assert browser.find_element("id", "system").is_displayed() is False  # folded away until wanted
        browser.find_element("css selector", "#options summary").click()
        browser.find_element("id", "system").send_keys("You answer in JSON.")
        browser.find_element("id", "schema").send_keys("{not json")
        type_and_enter(browser, "yes or no?")
        assert "not JSON" in text_of(browser, "error")
        assert not browser.find_elements("css selector", "#transcript .msg")  # nothing was sent
        assert browser.find_element("id", "prompt").get_attribute("value") == "yes or no?"
        browser.find_element("id", "prompt").clear()
        browser.find_element("id", "schema").clear()
        browser.find_element("id", "schema").send_keys(json.dumps(schema))
        set_field(browser, "max-tokens", 24)
        set_field(browser, "temperature", 0.8)
        set_field(browser, "top-p", 0.9)
        set_field(browser, "seed", 7)
        type_and_enter(browser, "yes or no?")
        assert wait_state(browser, "done", "error") == "done", text_of(browser, "error")
        spans = token_spans(browser)
        status, reference = post(running.api + "/chat/completions", {
            "messages": [{"role": "system", "content": "You answer in JSON."},
                         {"role": "user", "content": "yes or no?"}],
            "max_tokens": 24, "temperature": 0.8, "top_p": 0.9, "seed": 7,
            "response_format": {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}})
        assert status == 200, reference
        shown = "".join(s["text"] for s in spans)
        assert shown == reference["choices"][0]["message"]["content"]  # the seed makes the sample repeat
        assert json.loads(shown)["answer"] in ("yes", "no")
        assert "grammar" in {s["source"] for s in spans}  # the schema's forced tokens, in their colour
