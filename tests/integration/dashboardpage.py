"""The dashboard as a person sees it: the page that ``trellis up`` serves, loaded in a real
browser (Debian's ``chromium``, headless, driven through ``chromium-driver`` by Selenium),
its script run, its figures read off the rendered page.

The whole-mesh test calls :func:`check_dashboard` while its demo runs, rather than starting
a mesh of its own for it: the demo's edges are what the page must show. bookbuyer reaches
both bookstore versions (the 80/20 split) over mTLS; bookthief is refused by policy, at its
own sidecar, which had no route for it.
"""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass

from selenium import webdriver
from selenium.common.exceptions import TimeoutException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

BUYER = "bookbuyer/bookbuyer"
THIEF = "bookthief/bookthief"
V1, V2 = "bookstore/bookstore-v1", "bookstore/bookstore-v2"
DENIED = "(denied: no route)"


@dataclass(frozen=True)
class Row:
    """One row of the page's edge table, as rendered."""

    source: str
    destination: str
    rps: float
    denied_rps: float
    mtls: bool


def dashboard_url(up_output: str) -> str:
    """The URL ``trellis up`` printed for its dashboard."""
    found = re.search(r"dashboard: (http://127\.0\.0\.1:\d+/)", up_output)
    assert found, f"trellis up printed no dashboard URL:\n{up_output}"
    return found.group(1)


def browser() -> WebDriver:
    driver = shutil.which("chromedriver")
    assert driver, (
        "chromedriver is missing: apt-get install chromium chromium-driver (make bootstrap)"
    )
    options = webdriver.ChromeOptions()
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        options.add_argument(flag)
    options.add_argument("--window-size=1400,1200")
    # the driver is named, so Selenium Manager never looks for one on the network; Debian's
    # chromedriver starts Debian's chromium (/usr/bin/chromium) by itself
    return webdriver.Chrome(options=options, service=Service(executable_path=driver))


#: The page's edge rows, read in one script: the page redraws its table every two seconds,
#: so elements found one call earlier may be gone by the next (a stale element), while a
#: script runs between two redraws and sees one table whole.
_ROWS = """
return Array.from(document.querySelectorAll("#edges tbody tr"), (row) => ({
  source: row.dataset.source || "", destination: row.dataset.destination || "",
  rps: row.dataset.rps || "", denied: row.dataset.deniedRps || "", mtls: row.dataset.mtls || ""
}));
"""

#: The drawn nodes and each service card's text, read in one script for the same reason.
_PICTURE = """
return {
  drawn: Array.from(document.querySelectorAll("#topology g.node"), (g) => g.dataset.service),
  cards: Object.fromEntries(Array.from(document.querySelectorAll(".card[data-service]"),
                                       (card) => [card.dataset.service, card.innerText])),
};
"""


def rows(page: WebDriver) -> dict[tuple[str, str], Row]:
    found = {}
    for row in page.execute_script(_ROWS):
        source, destination = str(row["source"]), str(row["destination"])
        found[(source, destination)] = Row(
            source=source,
            destination=destination,
            rps=float(row["rps"] or 0),
            denied_rps=float(row["denied"] or 0),
            mtls=row["mtls"] == "true",
        )
    return found


def _demo_edges_live(page: WebDriver) -> bool:
    seen = rows(page)
    wanted = [(BUYER, V1), (BUYER, V2)]
    return all(key in seen and seen[key].rps > 0 for key in wanted) and (
        (THIEF, DENIED) in seen and seen[(THIEF, DENIED)].denied_rps > 0
    )


def check_dashboard(url: str, timeout: float = 60) -> dict[tuple[str, str], Row]:
    """Load the page; once the demo's edges are live, check what it shows. Returns the
    edge table as rendered."""
    page = browser()
    try:
        page.get(url)
        try:
            WebDriverWait(page, timeout, poll_frequency=0.5).until(_demo_edges_live)
        except TimeoutException:
            raise AssertionError(
                f"the dashboard at {url} did not show the demo's edges within {timeout}s: "
                f"{rows(page)}; errors: {page.find_element(By.ID, 'errors').text!r}"
            ) from None
        seen = rows(page)
        assert seen[(BUYER, V1)].mtls, seen
        assert seen[(BUYER, V2)].mtls, seen
        assert seen[(BUYER, V1)].denied_rps == 0, seen
        # the topology draws each end of each edge, and the split shows on the apex
        picture = page.execute_script(_PICTURE)
        drawn = set(picture["drawn"])
        assert {BUYER, THIEF, V1, V2, DENIED} <= drawn, drawn
        apex = picture["cards"]["bookstore/bookstore"]
        assert "bookstore/bookstore-v1 80" in apex, apex
        store = picture["cards"][V1]
        assert "bookbuyer/bookbuyer by bookstore/bookbuyer-access-bookstore" in store, store
        return seen
    finally:
        page.quit()
