# SPDX-License-Identifier: Apache-2.0
"""Integrations shipped with stepcache (``stepcache.integrations``).

They use only stepcache's public API; the core never imports them.

* ``request_index``: DeepSeek V4's per-token request index, once per step.
* ``sparse_index``: DeepSeek V4's FlashInfer sparse-index cache, once per layer kind.
* ``dsv4_sim``: an engine-free model of one DeepSeek V4 step, in three variants.
* ``vllm``: the vLLM plugin (entry point ``vllm.general_plugins``), with
  ``post_import`` (patch a module when it is imported) and the ``_vllm_*`` patches.
"""
