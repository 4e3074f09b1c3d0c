"""The dashboard in a real browser (Debian's headless Chromium driven by chromedriver).

The page must load, show an event published during the test, and show a function going from
zero instances to one and back to zero as the event is delivered and the instance idles.
"""

from __future__ import annotations

import shutil
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from selenium import webdriver
from selenium.common.exceptions import WebDriverException
from selenium.webdriver.common.by import By

from cascade.stores.sqlite import SqliteStore
from tests.helpers.platform import Running, cascade_up
from tests.helpers.waiting import eventually, holds

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
FUNC_YAML = """name: sleepy
module: handler
triggers:
- name: sleepy
  filters:
  - exact: {type: io.cascade.dataset.uploaded.v1}
  - data: data.dataset == "dashboard"
annotations:
  autoscaling.knative.dev/initial-scale: "0"
  autoscaling.knative.dev/window: "2s"
"""
HANDLER = """import time


def handle(event):
    time.sleep(1.5)
"""


@pytest.fixture
def browser() -> Iterator[webdriver.Chrome]:
    if not (shutil.which(CHROMIUM) and shutil.which(CHROMEDRIVER)):
        pytest.fail("Chromium is missing: apt-get install -y chromium chromium-driver (scripts/test.sh does)")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--disable-background-networking", "--disable-extensions", "--window-size=1400,1000"):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(CHROMEDRIVER))
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def platform(tmp_path: Path) -> Iterator[Running]:
    function = tmp_path / "home" / "functions" / "sleepy"
    function.mkdir(parents=True)
    (function / "func.yaml").write_text(FUNC_YAML)
    (function / "handler.py").write_text(HANDLER)
    with cascade_up(tmp_path / "home") as running:
        yield running


def text(driver: webdriver.Chrome, css: str) -> str:
    try:
        return str(driver.find_element(By.CSS_SELECTOR, css).text)
    except WebDriverException:
        return ""


def test_page_shows_a_live_event_and_a_function_scaling_from_zero_and_back(
        platform: Running, browser: webdriver.Chrome) -> None:
    browser.get(platform.dashboard + "/")  # no token: the page holds no data and asks for one
    eventually(lambda: "enter a token" in text(browser, "#status"), 30, "the page asking for a token")
    admin = platform.admin["authorization"].removeprefix("Bearer ")
    browser.get(f"{platform.dashboard}/#token={admin}")  # the platform sees every project and the platform's parts
    deadline = time.monotonic() + 30
    while text(browser, 'tr[data-service="sleepy"] td.instances') != "0":
        assert time.monotonic() < deadline, browser.page_source[-3000:]
        time.sleep(0.1)
    assert browser.title == "Cascade" and "live" in text(browser, "#status")
    event_id = f"dash-{uuid.uuid4().hex[:8]}"
    token = (Path(platform.env["CASCADE_HOME"]) / "token").read_text().strip()
    reply = httpx.post(f"{platform.gateway}/events", headers={
        "authorization": f"Bearer {token}", "ce-specversion": "1.0", "ce-id": event_id, "ce-source": "/test/dashboard",
        "ce-type": "io.cascade.dataset.uploaded.v1", "content-type": "application/json"},
        json={"dataset": "dashboard", "uri": "file:///tmp/dashboard/a.csv", "size": 1, "origin": "api"})
    assert reply.status_code == 202, reply.text
    seen = ["0"]  # instance counts as the page showed them, each change once
    deadline = time.monotonic() + 60
    while "1" not in seen or seen[-1] != "0":
        count = text(browser, 'tr[data-service="sleepy"] td.instances')
        if count and seen[-1] != count:
            seen.append(count)
        assert time.monotonic() < deadline, f"instance counts seen: {seen}"
        time.sleep(0.05)
    assert seen == ["0", "1", "0"]
    assert text(browser, f'#events tr[data-id="{event_id}"]'), "the published event is not on the page"
    assert "io.cascade.dataset.uploaded.v1" in text(browser, f'#events tr[data-id="{event_id}"]')
    assert text(browser, 'tr[data-service="sleepy"] td.history').endswith("0 → 1 → 0")
    deadline = time.monotonic() + 10
    while text(browser, 'tr[data-trigger="sleepy"] td:nth-child(3)') != "1":
        assert time.monotonic() < deadline, text(browser, 'tr[data-trigger="sleepy"]')
        time.sleep(0.2)


def test_values_from_the_platform_are_text_never_markup_or_script(platform: Running, browser: webdriver.Chrome) -> None:
    hostile = "job-x');document.title='pwned';//\"><img src=x onerror=\"document.title='pwned'\">"
    store = SqliteStore(Path(platform.env["CASCADE_HOME"]) / "state.db")
    store.put_record("job", hostile, {"id": hostile, "kind": "training", "project": "default", "status": "failed",
                                      "reason": "<b>bold</b>", "submitted": "2026-11-30T00:00:00Z", "spec": {}})
    browser.get(f"{platform.dashboard}/#token={platform.token}")  # a project token sees its own project's jobs
    rows = "[...document.querySelectorAll('#jobs tbody tr')].filter(r => r.dataset.job === arguments[0])"

    def first_cells() -> list[str]:  # read in the page: rows are redrawn every 300 ms, so no element handles
        return list(browser.execute_script(f"return {rows}.map(r => r.cells[0].textContent)", hostile))

    eventually(lambda: bool(first_cells()), 30, "the hostile job's row")
    assert first_cells() == [hostile], "shown as text"
    assert not browser.find_elements(By.CSS_SELECTOR, "#jobs img"), "no markup from data"
    browser.execute_script(f"{rows}[0].click()", hostile)
    assert not browser.find_elements(By.CSS_SELECTOR, "#functions tbody tr"), \
        "a project token sees none of the platform's services"
    holds(lambda: browser.title == "Cascade", 1.0, "the page keeping its title (a script from data would rename it)")


def test_an_experiment_is_plotted_per_trial_with_its_best_so_far(platform: Running, browser: webdriver.Chrome) -> None:
    from cascade.events.envelope import new_event
    from cascade.functions.experiments.controller import Experiments

    store = SqliteStore(Path(platform.env["CASCADE_HOME"]) / "state.db")
    clock = [100.0]
    controller = Experiments(store, lambda job, why: None, clock=lambda: clock[0])
    spec = {"name": "plotted", "trial": {"framework": "pytorch", "entrypoint": {"script": "t.py"}},
            "searchSpace": {"lr": {"type": "uniform", "low": 0.01, "high": 0.1}}, "objective": {"metric": "loss"},
            "algorithm": {"name": "random"}, "trials": 3, "parallel": 3}
    controller.submitted(new_event("experiment.submitted", {"experimentId": "exp-plot", "project": "default",
                                                            "spec": spec}, source="/t"))
    for n, loss in enumerate([0.5, 0.8, 0.2]):  # the second is worse: the best-so-far line stays flat there
        clock[0] += 10
        controller.ended(new_event("job.succeeded", {"jobId": f"exp-plot-t{n}", "artifactUri": "file:///x",
                                                     "metrics": {"loss": loss}}, source="/t"))
    browser.get(f"{platform.dashboard}/#token={platform.token}")
    row = '#experiments tr[data-experiment="exp-plot"]'
    eventually(lambda: len(browser.find_elements(By.CSS_SELECTOR, f"{row} svg circle.trial")) == 3, 30,
               "three trial dots")
    assert "succeeded" in text(browser, row) and "loss 0.2000 (exp-plot-t2)" in text(browser, row)
    line = browser.find_element(By.CSS_SELECTOR, f"{row} svg polyline.best").get_attribute("points")
    ys = [float(p.split(",")[1]) for p in str(line).split()]
    assert len(ys) == 3 and ys[0] == ys[1] < ys[2], ys  # flat over the worse trial, then lower (SVG y grows downwards)
