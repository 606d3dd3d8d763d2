"""Screenshots of five key console pages for docs/console.md, at a 1280×800 viewport with device
scale 1 and DejaVu fonts. Not a test file of the suite (no test_ prefix): scripts/console-screenshots.sh
runs it alone and writes the PNGs into $SCREENSHOT_DIR (docs/console)."""
import os
from selenium.webdriver.common.keys import Keys
from conftest import (sign_in_by_link, CONSOLE, api_deletion, deletion, faults, new_user, wait_for)

OUT = os.environ.get("SCREENSHOT_DIR", "docs/console")
APPS = ("com.example.app", "com.example.other")




def shoot(browser, name):
    os.makedirs(OUT, exist_ok=True)
    browser.execute_script("window.scrollTo(0, 0)")
    assert browser.save_screenshot(os.path.join(OUT, name + ".png"))


def test_screenshots(browser):
    # Fixture data: one deletion done, one failed while Apple refused every revoke.
    done_user, _ = new_user(client_ids=APPS)
    done = api_deletion(done_user, "Erasure request (Art. 17)")
    wait_for(lambda: deletion(done)["state"] == "done", what="the done deletion")
    faults(error_rate=1.0, error_statuses=[500], endpoints=["revoke"])
    try:
        failed_user, _ = new_user(client_ids=APPS)
        failed = api_deletion(failed_user, "Account closed in the app")
        wait_for(lambda: deletion(failed)["state"] == "failed", timeout=90, what="the failed deletion")
    finally:
        faults()
    target, _ = new_user(client_ids=APPS)

    sign_in_by_link(browser, "compliance", "dpo@example.com")
    shoot(browser, "overview")
    browser.get(CONSOLE + "/deletions")
    shoot(browser, "deletions")
    browser.get(f"{CONSOLE}/deletions/{failed}")
    shoot(browser, "deletion-failed")
    browser.get(CONSOLE + "/deletions/new")
    browser.find_element("id", "value").send_keys(target, Keys.ENTER)
    wait_for(lambda: "Confirm" in browser.title, what="the confirmation page")
    browser.find_element("id", "reason").send_keys("Erasure request (Art. 17)")
    browser.find_element("id", "ticket").send_keys("DSAR-1042")
    shoot(browser, "deletion-confirm")
    browser.get(f"{CONSOLE}/deletions/{done}/report")
    shoot(browser, "evidence-report")
