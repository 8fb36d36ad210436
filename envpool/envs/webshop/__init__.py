"""``webshop``: an own small web shop in headless Chromium, driven through Playwright.

``catalogue`` (products, goals, search, reward), ``server`` (the shop's HTTP server, one per env
instance), ``env`` (the ``WebShop`` env: browser, observations, actions, expert). Kept free of
imports so that naming the env costs nothing.
"""
