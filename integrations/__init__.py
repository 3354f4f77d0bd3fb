# SPDX-License-Identifier: Apache-2.0
"""Integrations shipped with stepcache (``stepcache.integrations``).

They use only stepcache's public API; the core never imports them.
"""
