"""004 DySHARP: in-switch multicast / reduction and token-centric fusion on NVLink switches,
with its baselines (DeepEP, NVLS, FasterMoE, Tutel, CCFuser, COMET, DualPipe) beside it."""
