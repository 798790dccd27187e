"""Drives the node's console in a real browser (Debian's headless Chromium through
chromedriver and Selenium): an obligation to a stopped agent shows as pending, then — with the
agent started, and without reloading the page — as applied; with the agent stopped again, an
obligation escalates and the console shows the safe action it applied. Screenshots go to the
directory given.

argv: <abhyasa binary> <work dir> <console url> <token file> <principal admin socket>
      <agent config> <screenshot dir> <chromium> <chromedriver>
"""
import json
import subprocess
import sys
import time

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

binary, work, url, token_file, admin, agent_cfg, shots, chromium, driver_path = sys.argv[1:10]
token = open(token_file).read().strip()


def issue(*args):
    out = subprocess.run(
        [binary, "issue", "--admin", admin, "--target", "agent-1", *args],
        capture_output=True,
        check=True,
    )
    reply = json.loads(out.stdout)
    assert reply["ok"], reply
    return reply["id"]


def start_agent():
    return subprocess.Popen(
        [binary, "node", "--config", agent_cfg],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def stop(p):
    p.terminate()
    p.wait(timeout=30)


options = webdriver.ChromeOptions()
options.binary_location = chromium
for a in ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"]:
    options.add_argument(a)
browser = webdriver.Chrome(service=Service(driver_path), options=options)
wait = WebDriverWait(browser, 60, poll_frequency=0.1)


def row(section, oid, state):
    return browser.find_elements(
        By.CSS_SELECTOR, f'#{section} tr[data-id="{oid}"][data-state="{state}"]'
    )


try:
    # A phone-sized window: the console must read there too.
    browser.set_window_size(390, 844)
    # Without the key: refused.
    browser.get(url)
    assert "abhyasa node" not in browser.page_source, "served without the key"
    # With it (HTTP Basic, the key as the password): the page, then its live updates.
    host = url.split("://", 1)[1]
    browser.get(f"http://operator:{token}@{host}")
    wait.until(lambda b: b.find_element(By.ID, "conn").text == "live")
    loads = browser.execute_script("return performance.getEntriesByType('navigation').length")

    # 1. Pending while the agent is down, then applied once it comes up.
    revoke = issue("--kind", "anumati.consent", "--decision", "revoke",
                   "--scope", "calendar.read", "--deadline-ms", "120000")
    wait.until(lambda b: row("pending", revoke, "pending"))
    attempts_seen = int(row("pending", revoke, "pending")[0]
                        .find_element(By.CSS_SELECTOR, "td[data-attempts]").text)
    browser.save_screenshot(f"{shots}/console-pending.png")
    agent = start_agent()
    wait.until(lambda b: row("recent", revoke, "applied"))
    assert not row("pending", revoke, "pending"), "still listed as pending"
    applied_text = row("recent", revoke, "applied")[0].text
    assert "applied after" in applied_text, applied_text
    browser.set_window_size(1200, 900)
    browser.save_screenshot(f"{shots}/console-applied.png")

    # 2. The agent stops; an obligation escalates at its deadline with its safe action.
    stop(agent)
    stuck = issue("--kind", "anumati.consent", "--decision", "revoke",
                  "--scope", "files.read", "--deadline-ms", "3000")
    wait.until(lambda b: row("pending", stuck, "pending"))
    wait.until(lambda b: row("escalations", stuck, "escalated"))
    escalation = row("escalations", stuck, "escalated")[0]
    safe = escalation.find_element(By.CSS_SELECTOR, "td.safe-action").text
    assert safe == "withheld files.read for agent-1", safe
    withheld = browser.find_elements(
        By.CSS_SELECTOR, '#decisions tr[data-agent="agent-1"][data-scope="files.read"]')
    assert withheld and "withheld" in withheld[0].text, [w.text for w in withheld]
    browser.save_screenshot(f"{shots}/console-escalated.png")
    browser.set_window_size(390, 844)
    browser.save_screenshot(f"{shots}/console-phone.png")

    # Everything above came over server-sent events: the page was never loaded again.
    again = browser.execute_script("return performance.getEntriesByType('navigation').length")
    assert again == loads, (loads, again)
    print(f"console: pending (attempt {attempts_seen}) then applied live; escalated with "
          f"'{safe}'; {browser.capabilities.get('browserVersion')} headless; "
          f"4 screenshots")
finally:
    browser.quit()
