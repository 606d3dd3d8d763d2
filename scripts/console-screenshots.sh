#!/usr/bin/env bash
# Regenerates the console's screenshots in docs/console/ (overview, deletions, a failed deletion,
# a deletion's confirmation page, an evidence report): the browser-test stack, headless Chromium
# at a 1280×800 viewport, device scale 1, DejaVu fonts (Debian's fonts-dejavu-core). The broker
# has no frozen clock, so dates and ids change at each run; the layout does not.
# Usage: scripts/console-screenshots.sh   (then look at docs/console/*.png and commit them)
set -euo pipefail
cd "$(dirname "$0")/.."
export SCREENSHOT_DIR=$PWD/docs/console
export CONSOLE_BROWSER_TESTS=Tests/ConsoleBrowser/screenshots.py
exec scripts/console-browser.sh "$@"
