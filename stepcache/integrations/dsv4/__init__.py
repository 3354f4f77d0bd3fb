# SPDX-License-Identifier: Apache-2.0
"""DeepSeek V4's per-step caches, engine-neutral: ``request_index``, ``sparse_index``
and ``sim``, an engine-free model of one step."""
