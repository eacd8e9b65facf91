"""Tools that work a broker from outside, through the public client only.

- `ssb.tools.diagnose`: `ssb diagnose`, which finds what keeps messages from flowing
  between brokers.
"""
