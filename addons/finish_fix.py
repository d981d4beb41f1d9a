"""finish_fix: make every OpenAI-compatible stream end the way its spec says, in four dialects.

    mitmdump -s addons/finish_fix.py --mode reverse:https://api.example.com

The script a checkout's mitmproxy loads: mitmproxy puts this folder on sys.path while it executes
the script, so the `finishline` package next to it is found with a stock mitmproxy and nothing
installed. The addon itself is `finishline.addon.hooks` (docs/architecture.md); an installed
finishline has this same script in the package (`finish-fix --addon-path`). A hot reload executes
this file again and a new `FinishFix` takes over; the package is imported once.
"""

from finishline.addon.hooks import FinishFix

addons = [FinishFix()]
