# SPDX-License-Identifier: Apache-2.0
"""Integrations shipped with stepcache (``stepcache.integrations``), arranged by engine
and by model; they use only stepcache's public API, and the core never imports them.

* ``patching``: engine-neutral patching (wait for a module's import, check a target's
  shape, patch, undo, count, verify against the original), and ``plugin``: an
  engine's plugin declared (``EnginePlugin``: its switch, supported versions, patches
  and how each is wrapped) with the lifecycle written once.
* ``dsv4``: DeepSeek V4's step caches as a model's own code would use them:
  ``request_index`` (the per-token request index, once per step), ``sparse_index``
  (the FlashInfer sparse indices, once per layer kind), ``seed`` (the seed PR's own
  code, the benchmarks' baseline) and ``sim`` (an engine-free model of one DeepSeek
  V4 step).
* ``vllm``: the vLLM plugin (entry point ``vllm.general_plugins``) and its patches of
  vLLM's own code (``metadata``: ``CommonAttentionMetadata``; ``dsv4``: DeepSeek V4's).

An integration with another engine (SGLang, TensorRT-LLM) gets a subpackage of its own
beside ``vllm``: an ``EnginePlugin`` declaration built on ``patching``.
"""
