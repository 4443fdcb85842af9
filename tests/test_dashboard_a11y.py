"""The dashboard for people, in a real browser: every page (found from the header's
links, so a page added later is covered) in light and dark (prefers-color-scheme, as the
system would ask), at 1280 x 800 and 390 x 844: axe-core finds no serious or critical
violation, the console stays free of errors, the page never scrolls sideways, and every
link, button and field can be reached with the Tab key. One browser for the whole module.

axe-core is the unmodified npm release committed under tests/vendor/axe-core/ (MPL-2.0):
nothing is downloaded at test time. UPDATE_SCREENSHOTS=1 writes the 4 shots of each page
to docs/screenshots/ (the README's Dashboard section shows them)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import dramatiq
import pytest

import supervisor
from supervisor.broker import PostgresBroker
from tests.browser_helpers import Browser
from tests.conftest import ROOT, scalar, wait_for
from tests.http_helpers import Dash, dashboard
from tests.supervisor_helpers import enqueue, role

pytestmark = pytest.mark.xdist_group("dashboard-browser")

TOKEN = "a11y-secret"
AXE = ROOT / "tests" / "vendor" / "axe-core" / "axe.min.js"
SIZES = {"wide": (1280, 800), "narrow": (390, 844)}
SCHEMES = ("light", "dark")

# A key for an element that survives the live refresh replacing it with an equal one.
KEY_JS = """
function kbKey(e) {
  return [e.tagName, e.id, e.getAttribute('href') || '', e.getAttribute('name') || '', e.className,
          e.getAttribute('value') || '', e.getAttribute('data-post') || '',
          (e.textContent || '').trim().slice(0, 40)].join('|');
}
"""


@pytest.fixture(scope="module")
def dash(database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dash]:
    """A supervisor running the tests' actors and the failing ones (for the Errors page),
    with the tracker in use, a schedule and a token: every page has something to show."""
    roles = {"w": role(processes=1, threads=2, queues=("tests",)),
             "e": role(processes=1, threads=4, queues=("errors",), actors=("tests.error_actors",))}
    with dashboard(database_url, tmp_path_factory.mktemp("a11y"), roles, http={"token": TOKEN}, apps=["actors"],
                   schedules={"nightly": {"cron": "0 3 * * *", "actor": "noop", "queue": "tests"}}) as found:
        db = found.db
        enqueue(db, 12)
        for actor, n in (("parse_feed", 2), ("refuse", 2), ("fine", 2)):
            db.execute("INSERT INTO jobs (queue, actor, args) SELECT 'errors', %s, jsonb_build_array(g)"
                       " FROM generate_series(1, %s) g", (actor, n))
        db.execute("INSERT INTO jobs (queue, actor, run_at) SELECT 'tests', 'noop', now() + interval '1 hour' "
                   "FROM generate_series(1, 3)")
        db.execute("SELECT * FROM rate_limit_take('source:demo', 1, 5, 1, 100)")
        src = scalar(db, "INSERT INTO sources (name, search_url, failure_streak, paused_until) VALUES "
                         "('flaky-shop', 'http://127.0.0.1:9/s', 7, now() + interval '5 minutes') RETURNING id")
        db.execute("INSERT INTO watches (name, query, source_id, last_polled_at) VALUES ('gpu', 'rtx', %s, now())",
                   (src,))
        _workflow(found.url)
        wait_for(lambda: scalar(db, "SELECT count(*) FROM jobs WHERE status = 'succeeded' AND queue = 'tests'") == 14
                 and scalar(db, "SELECT count(*) FROM workflow_steps WHERE state = 'failed'") == 1
                 and scalar(db, "SELECT count(*) FROM jobs WHERE queue = 'errors' AND status = 'failed'") == 4,
                 60, message="the workload settled")
        yield found


def _workflow(url: str) -> None:
    """A workflow in every state of a step, for the Workflows pages: two that succeed, one
    that fails (the tests' flaky takes no parents' results), its child cancelled, one whose
    queue no worker serves (enqueued) and its child (blocked)."""
    broker = PostgresBroker(url)
    try:
        def act(name: str, queue: str = "tests") -> Any:
            return dramatiq.actor(broker=broker, queue_name=queue, actor_name=name, max_retries=0)(lambda *a: None)
        nap, flaky, idle = act("nap"), act("flaky"), act("idle", "nobody")
        wf = supervisor.workflow("nightly-report", broker=broker, on_failure="continue")
        root = wf.add(nap.message(1))
        wf.add(nap.message(), after=[root])
        wf.add(nap.message(), after=[wf.add(flaky.message(), after=[root])])
        wf.add(nap.message(), after=[wf.add(idle.message(), after=[root])])
        wf.send()
    finally:
        broker.close()


def _pages(b: Browser, dash: Dash) -> dict[str, str]:
    """name -> path: every page the header links to, and one job's page."""
    b.open(dash.base + "/")
    links = b.driver.execute_script(
        "return Array.from(document.querySelectorAll('header nav a')).map(a => a.getAttribute('href'));")
    pages = {("overview" if href == "/" else href.strip("/").split("/")[-1]): href for href in links}
    # a failed job with a traceback, for the Job page
    job = scalar(dash.db, "SELECT id FROM jobs WHERE status = 'failed' AND actor = 'parse_feed' LIMIT 1")
    pages["job"] = f"/jobs/{job}"
    pages["workflow"] = f"/workflows/{scalar(dash.db, 'SELECT id FROM workflows LIMIT 1')}"
    return pages


def _emulate(b: Browser, size: str, scheme: str) -> None:
    width, height = SIZES[size]
    b.driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {
        "width": width, "height": height, "deviceScaleFactor": 1, "mobile": size == "narrow"})
    b.driver.execute_cdp_cmd("Emulation.setEmulatedMedia", {
        "features": [{"name": "prefers-color-scheme", "value": scheme}]})


def _lightness(css_rgb: str) -> float:
    """0 (black) to 1 (white): the mean of an 'rgb(r, g, b)' colour's channels."""
    channels = [int(c) for c in css_rgb[css_rgb.index("(") + 1:css_rgb.index(")")].split(",")[:3]]
    return sum(channels) / (3 * 255)


def _axe(b: Browser) -> list[str]:
    """The serious and critical violations axe-core finds on the page, one line each."""
    if not b.driver.execute_script("return typeof window.axe === 'object'"):
        b.driver.execute_script(AXE.read_text())
    found = b.driver.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        "axe.run(document, {resultTypes: ['violations']})"
        "  .then(r => done(r.violations.filter(v => v.impact === 'serious' || v.impact === 'critical')"
        "    .map(v => v.impact + ' ' + v.id + ': ' + v.help + ' at '"
        "      + v.nodes.slice(0, 3).map(n => n.target.join(' ')).join(', '))))"
        "  .catch(e => done(['axe failed: ' + e]));")
    return [str(f) for f in found]


def test_every_page_light_and_dark_wide_and_narrow(dash: Dash, browser: Browser) -> None:
    browser.driver.set_script_timeout(60)
    pages = _pages(browser, dash)
    assert {"overview", "queues", "jobs", "errors", "actors", "workers", "schedules", "limits",
            "tracker", "job", "workflows", "workflow"} <= set(pages), pages
    browser.console_errors()  # drained: only what the pages below log counts
    problems: list[str] = []
    for size in SIZES:
        for scheme in SCHEMES:
            _emulate(browser, size, scheme)
            for name, path in pages.items():
                browser.open(dash.base + path)
                assert browser.css("main h1"), (path, browser.text("body")[:300])
                dark = browser.driver.execute_script("return matchMedia('(prefers-color-scheme: dark)').matches")
                bg = browser.driver.execute_script("return getComputedStyle(document.body).backgroundColor")
                assert dark == (scheme == "dark") and (_lightness(bg) < 0.2 if dark else _lightness(bg) > 0.8), \
                    (name, scheme, bg)
                where = f"{name} {size} {scheme}"
                problems += [f"{where}: {v}" for v in _axe(browser)]
                # The page itself never scrolls sideways; a wide table scrolls inside itself.
                over = browser.driver.execute_script(
                    "return document.documentElement.scrollWidth - document.documentElement.clientWidth")
                if over > 0:
                    problems.append(f"{where}: the page scrolls sideways by {over} px")
                problems += [f"{where}: console: {m}" for m in browser.console_errors()]
                browser.screenshot(f"{name}-{size}-{scheme}")
    assert not problems, "\n".join(problems)


def _tab_reaches_everything(b: Browser) -> list[str]:
    """Tab from the top of the page through to its end: which visible link, button, field
    or scrolling box was never focused (their keys, empty when all were)."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.keys import Keys

    wanted = b.driver.execute_script(KEY_JS + """
      window.kbSeen = new Set();
      document.addEventListener('focusin', (ev) => window.kbSeen.add(kbKey(ev.target)));
      document.activeElement.blur();
      const all = document.querySelectorAll('a[href], button, input, select, textarea, summary, [tabindex]');
      return Array.from(all).filter(e => e.checkVisibility() && !e.disabled && e.tabIndex >= 0).map(kbKey);
    """)
    missed = list(wanted)
    # A date field takes a Tab per part (day, month, year, ...): press in batches until
    # everything was focused or far more presses than fields were spent.
    for _ in range(0, 4 * len(wanted) + 20, 20):
        ActionChains(b.driver).send_keys(Keys.TAB * 20).perform()
        seen = set(b.driver.execute_script("return Array.from(window.kbSeen);"))
        missed = [k for k in wanted if k not in seen]
        if not missed:
            break
    return missed


def test_every_action_is_reachable_by_keyboard(dash: Dash, browser: Browser) -> None:
    pages = _pages(browser, dash)
    for size in SIZES:
        _emulate(browser, size, "light")
        for name, path in pages.items():
            browser.open(dash.base + path)
            missed = _tab_reaches_everything(browser)
            assert not missed, (name, size, missed)


def _tab_to(b: Browser, selector: str) -> None:
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.keys import Keys

    def there() -> bool:
        if b.driver.execute_script("return document.activeElement.matches(arguments[0])", selector):
            return True
        ActionChains(b.driver).send_keys(Keys.TAB).perform()
        return False
    wait_for(there, 20, interval=0, message=f"Tab reaches {selector}")


def test_an_action_by_keyboard_keeps_focus_through_the_refresh(dash: Dash, browser: Browser) -> None:
    """Token typed and an action sent with keys alone; after the action the page's content
    is replaced (refresh), and focus stays on the button, not back at the top."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.keys import Keys

    _emulate(browser, "narrow", "dark")
    browser.open(dash.base + "/schedules")
    _tab_to(browser, "#token")
    ActionChains(browser.driver).send_keys(TOKEN + Keys.ENTER).perform()
    browser.wait_text("#flash", lambda t: "token kept" in t)
    button = 'tr[data-schedule="nightly"] button.act'
    _tab_to(browser, button)
    before = browser.driver.execute_script("return document.body.dataset.refreshed || ''")
    ActionChains(browser.driver).send_keys(Keys.ENTER).perform()
    browser.wait_text("#flash", lambda t: "enqueued" in t)
    wait_for(lambda: browser.driver.execute_script("return document.body.dataset.refreshed || ''") != before, 10,
             message="the page refreshed after the action")
    wait_for(lambda: scalar(dash.db, "SELECT count(*) FROM job_runs WHERE job_name = 'nightly'") == 1, 10,
             message="the run recorded")
    assert browser.driver.execute_script("return document.activeElement.matches(arguments[0])", button), \
        browser.driver.execute_script("return document.activeElement.outerHTML.slice(0, 200)")


def test_a_line_charts_key_has_its_lines_colours(dash: Dash, browser: Browser) -> None:
    """The queue depth chart's key: each name's square is the colour of its line, light and dark."""
    for scheme in SCHEMES:
        _emulate(browser, "wide", scheme)
        browser.open(dash.base + "/")
        pairs = browser.driver.execute_script("""
          const svg = document.querySelectorAll('svg.chart')[1];
          return Array.from(svg.querySelectorAll('rect[x][y="4"]')).map((key, i) => {
            const line = document.createElementNS('http://www.w3.org/2000/svg', 'polyline');
            line.setAttribute('class', 'l' + i);
            svg.appendChild(line);
            const pair = [key.nextElementSibling.textContent, getComputedStyle(key).fill, getComputedStyle(line).stroke];
            line.remove();
            return pair;
          });""")
        assert [p[0] for p in pairs] == ["waiting", "running", "scheduled"], pairs
        assert all(fill == stroke for _, fill, stroke in pairs), (scheme, pairs)
        assert len({fill for _, fill, _ in pairs}) == 3, pairs
