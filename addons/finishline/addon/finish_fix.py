"""The finish_fix addon's script in the package: what `finish-fix` loads and `finish-fix --addon-path`
prints, for `mitmdump -s` or `mitmweb -s` wherever finishline is installed.

    mitmdump -s "$(finish-fix --addon-path)" --mode reverse:https://api.example.com

A script, not a module to import: mitmproxy executes it (again on a hot reload) and takes `addons`,
a new `FinishFix` each time. The addon itself is `finishline.addon.hooks`; a checkout's
`addons/finish_fix.py` is this same script for a mitmproxy that has not installed finishline.
"""

from finishline.addon.hooks import FinishFix

addons = [FinishFix()]
