"""Expert placement with redundant slots: DeepSeek's EPLB, slot layouts, migration.

- `eplb`: the Expert Parallelism Load Balancer (deepseek-ai/EPLB `eplb.py`), hierarchical and
  global, as a pure jit / vmap-able function of load statistics `[L, E]`;
  `eplb_reference` is its plain-Python transcription for tests.
- `slots`: a slot layout (`phy2log [L, S]`, slot s on device s // slots_per_device) as the
  `[L, E, D]` replica counts and token shares systems take as placement Params; the weight
  memory redundant slots cost per device, and its bound.
- `migration`: the weight bytes a re-plan moves and their time over the platform's links.
- `wafer`: an EPLB plan as the wafer system's `WaferParams` (native + shadow experts).
"""
