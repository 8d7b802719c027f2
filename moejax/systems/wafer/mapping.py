"""Parallelism mappings on a wafer mesh and their Full Token Domains (001 §IV). Host NumPy.

Built once per configuration (static geometry, no JAX). A mapping places the attention TP
groups on the mesh and, through them, fixes where tokens sit before the MoE all-to-all:

- baseline: each TP group is a compact block of the mesh ("TP groups are spaced apart, each
  located in a separate corner", 001 §IV-B1, Fig. 8(b)); its all-reduce ring has one hop.
- ER-Mapping (001 §IV-B, Fig. 8(c)(d), Fig. 10(a)): the mesh is tiled into compact Full Token
  Domains of G = D / TP devices, position s of every tile belongs to TP group s, and group s's
  ring visits its members tile by tile (the "entwined rings", each step as long as a tile).
  This is the general algorithm of Fig. 10(a): inputs mesh size and TP, outputs the device
  sets of the FTDs (all-to-all domains) and of the TP groups (all-reduce domains).
- HER-Mapping (001 §IV-B4, Fig. 10(c)): ER-Mapping inside each wafer of a multi-wafer mesh;
  the all-reduce is an intra-wafer reduce-scatter followed by an inter-wafer all-gather among
  the devices at the same wafer position, after which every wafer holds every token and the
  all-to-all stays inside each wafer.

A Full Token Domain (001 §IV-A) is a minimal set of devices holding tokens of every TP group;
`ftd_average_hops` is the paper's hop estimate: inside an FTD each device fetches from each
of the other G - 1 members with probability 1 / (G - 1).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from moejax.errors import ConfigError

MAPPINGS = ("baseline", "er", "her")


@dataclasses.dataclass(frozen=True, eq=False)
class Mapping:
    """Device sets of one mapping (device id = row * cols + col on the whole mesh).

    groups [G, g]: attention TP groups, members in ring order (the all-reduce rings).
    ftds [F, G]: Full Token Domains, ftds[f, s] = the member of TP group s in FTD f.
    holders [H, D] 0/1: holder sets (devices that hold a token after attention's all-reduce);
      a token of holder set h can be fetched from any device with holders[h, d] = 1.
    token_holder(n) -> holder set of token slot n (see `token_holder_sets`).
    wafer_peers [P, W]: HER only, device at wafer position p on each wafer (inter-wafer rings);
      empty [0, 0] otherwise.
    """

    name: str
    rows: int
    cols: int
    tp: int
    groups: np.ndarray
    ftds: np.ndarray
    holders: np.ndarray
    retain_allgather: bool
    wafer_peers: np.ndarray

    @property
    def num_devices(self) -> int:
        return self.rows * self.cols

    @property
    def num_groups(self) -> int:
        return int(self.groups.shape[0])


# --- tiles and rings -----------------------------------------------------------------------


def tile_shape(rows: int, cols: int, size: int) -> tuple[int, int]:
    """(h, w) with h * w = size, h | rows, w | cols, most square (then fewer rows)."""
    best = None
    for h in range(1, size + 1):
        if size % h or rows % h or cols % (size // h):
            continue
        w = size // h
        key = (abs(h - w), h)
        if best is None or key < best[0]:
            best = (key, (h, w))
    if best is None:
        raise ConfigError(
            f"tp_size: cannot tile a {rows}x{cols} mesh into blocks of {size} devices; "
            "choose a tp_size whose blocks (and D / tp_size FTDs) divide the mesh"
        )
    return best[1]


def ring_order(h: int, w: int) -> list[tuple[int, int]]:
    """Cells of an h x w grid in a closed ring of unit steps where one exists.

    Hamiltonian cycle: row 0 from column 0 rightwards, snake over columns 1..w-1 down the
    rows, return up column 0 (needs h even; w even is handled by transposing). With h and w
    both odd (or a 1 x w line) no unit-step cycle exists and the snake's closing step is longer.
    """
    if h == 1 or w == 1:
        return [(r, c) for r in range(h) for c in range(w)]
    if h % 2 and w % 2 == 0:
        return [(r, c) for c, r in ring_order(w, h)]
    if h % 2:  # both odd: a snake
        return [(r, c if r % 2 == 0 else w - 1 - c) for r in range(h) for c in range(w)]
    order = [(0, 0)]
    for r in range(h):
        cs = range(1, w) if r % 2 == 0 else range(w - 1, 0, -1)
        order += [(r, c) for c in cs]
    order += [(r, 0) for r in range(h - 1, 0, -1)]
    return order


def _tiles(rows, cols, th, tw):
    """Tile origins [T, 2] in ring order over the tile grid, and cell offsets [th*tw, 2]."""
    grid = ring_order(rows // th, cols // tw)
    origins = np.array([(r * th, c * tw) for r, c in grid])
    offsets = np.array([(r, c) for r in range(th) for c in range(tw)])
    return origins, offsets


def _ids(rc, cols):
    return rc[..., 0] * cols + rc[..., 1]


# --- the mappings --------------------------------------------------------------------------


def baseline_groups(rows: int, cols: int, tp: int) -> tuple[np.ndarray, np.ndarray]:
    """(groups [G, g], ftds [g, G]) of the baseline mapping: each TP group a compact block.

    FTD f takes the member at raster offset f of every block (001 §IV-A Fig. 8(a)(b): in the
    4x4, TP = 4 example, {D11^1, D13^2, D31^3, D33^4} spans a 3x3 area).
    """
    th, tw = tile_shape(rows, cols, tp)
    origins, offsets = _tiles(rows, cols, th, tw)
    ring = np.array(ring_order(th, tw))
    groups = _ids(origins[:, None, :] + ring[None, :, :], cols)
    ftds = _ids(origins[None, :, :] + offsets[:, None, :], cols)  # [g, G]
    return groups, ftds


def er_groups(rows: int, cols: int, tp: int) -> tuple[np.ndarray, np.ndarray]:
    """(groups [G, g], ftds [g, G]) of ER-Mapping (001 §IV-B, Fig. 8(c)(d), Fig. 10(a)).

    The mesh is tiled into g = TP compact FTDs of G = D / TP devices; TP group s is the device
    at raster position s of every FTD, its ring visiting the FTDs in ring order over the tiles.
    """
    d = rows * cols
    if tp < 1 or d % tp:
        raise ConfigError(f"tp_size = {tp} must divide the {d} devices")
    fh, fw = tile_shape(rows, cols, d // tp)
    origins, offsets = _tiles(rows, cols, fh, fw)  # origins [g], offsets [G]
    ftds = _ids(origins[:, None, :] + offsets[None, :, :], cols)  # [g, G]
    return ftds.T.copy(), ftds


def token_holder_sets(mapping: Mapping, num_tokens: int) -> np.ndarray:
    """int [N]: the holder set of token slot n.

    Tokens are dealt round-robin to the TP groups (n mod G); inside a group, member
    (n // G) mod g holds the token's reduce-scatter shard (same rule as `ep.token_owner`).
    With the all-gather retained every member holds it (holder set = the group); without
    it only the shard holder does (holder set = that device); under HER the shard holder's
    wafer position (every wafer holds it after the inter-wafer all-gather).
    """
    n = np.arange(num_tokens)
    g_count, g = mapping.groups.shape
    group, member = n % g_count, (n // g_count) % g
    if mapping.name == "her":
        dev = mapping.groups[group, member]
        pos_of = np.full(mapping.num_devices, -1)
        pos_of[mapping.wafer_peers] = np.arange(mapping.wafer_peers.shape[0])[:, None]
        return pos_of[dev]
    if mapping.retain_allgather:
        return group
    return mapping.groups[group, member]


def holder_shares(mapping: Mapping) -> np.ndarray:
    """float [H]: share of tokens in each holder set when tokens spread evenly (counts-only)."""
    h = mapping.holders.shape[0]
    return np.full(h, 1.0 / h)


def build_mapping(name: str, rows: int, cols: int, tp: int, *, retain_allgather: bool = True,
                  wafer_rows: int = 1, wafer_cols: int = 1) -> Mapping:
    """The Mapping `name` (baseline | er | her) on a rows x cols mesh with TP = tp.

    For a multi-wafer mesh, rows / cols are the whole mesh and wafer_rows / wafer_cols the
    wafer grid (HER needs more than one wafer).
    """
    if name not in MAPPINGS:
        raise ConfigError(f"mapping = {name!r}; allowed: {', '.join(MAPPINGS)}")
    if tp < 1 or (rows * cols) % tp:
        raise ConfigError(f"tp_size = {tp} must divide the {rows * cols} devices")
    d = rows * cols
    peers = np.zeros((0, 0), np.int64)
    if name == "her":
        w = wafer_rows * wafer_cols
        if w < 2:
            raise ConfigError("mapping = 'her' needs a multi-wafer platform (wafers > 1)")
        if rows % wafer_rows or cols % wafer_cols:
            raise ConfigError(f"mesh {rows}x{cols} does not split into {wafer_rows}x{wafer_cols} "
                              "wafers")
        wr, wc = rows // wafer_rows, cols // wafer_cols
        g_local, f_local = er_groups(wr, wc, tp)
        worig = np.array([(r * wr, c * wc) for r, c in ring_order(wafer_rows, wafer_cols)])
        loc = np.stack(np.divmod(np.arange(wr * wc), wc), -1)  # [Dw, 2] local (r, c)

        def glob(local_ids, wo):
            rc = np.stack(np.divmod(local_ids, wc), -1) + wo
            return _ids(rc, cols)

        groups = np.concatenate([glob(g_local, wo) for wo in worig])  # [W * Gw, g]
        ftds = np.concatenate([glob(f_local, wo) for wo in worig])  # [W * g, Gw]
        peers = _ids(loc[:, None, :] + worig[None, :, :], cols)  # [Dw, W]
        holders = np.zeros((peers.shape[0], d), np.float32)
        holders[np.arange(peers.shape[0])[:, None], peers] = 1.0
        return Mapping(name, rows, cols, tp, groups, ftds, holders, True, peers)
    maker = baseline_groups if name == "baseline" else er_groups
    groups, ftds = maker(rows, cols, tp)
    if retain_allgather:
        holders = np.zeros((groups.shape[0], d), np.float32)
        holders[np.arange(groups.shape[0])[:, None], groups] = 1.0
    else:
        holders = np.eye(d, dtype=np.float32)
    return Mapping(name, rows, cols, tp, groups, ftds, holders, retain_allgather, peers)


def contiguous_mapping(num_devices: int, tp: int, *, retain_allgather: bool = True) -> Mapping:
    """Baseline mapping on a non-mesh platform (GPU node, NVL72): contiguous TP groups."""
    if tp < 1 or num_devices % tp:
        raise ConfigError(f"tp_size = {tp} must divide the {num_devices} devices")
    groups = np.arange(num_devices).reshape(-1, tp)
    holders = np.zeros((groups.shape[0], num_devices), np.float32)
    holders[np.arange(groups.shape[0])[:, None], groups] = 1.0
    if not retain_allgather:
        holders = np.eye(num_devices, dtype=np.float32)
    return Mapping("baseline", 1, num_devices, tp, groups, groups.T.copy(), holders,
                   retain_allgather, np.zeros((0, 0), np.int64))


# --- FTD geometry (001 §IV-A) --------------------------------------------------------------


def mesh_hops(rows: int, cols: int) -> np.ndarray:
    """int [D, D]: Manhattan (XY-route) hop count between devices."""
    r, c = np.divmod(np.arange(rows * cols), cols)
    return np.abs(r[:, None] - r[None, :]) + np.abs(c[:, None] - c[None, :])


def ftd_average_hops(mapping: Mapping) -> float:
    """001 §IV-A "Hops": mean over FTDs and members of the mean hops to the other members.

    Each FTD device fetches tokens from each of the other G - 1 members with probability
    1 / (G - 1); the 4x4, TP = 4 example gives 8/3 = 2.7 (baseline) and 4/3 (ER).
    """
    hops = mesh_hops(mapping.rows, mapping.cols)
    f = mapping.ftds
    if f.shape[1] < 2:
        return 0.0
    h = hops[f[:, :, None], f[:, None, :]]  # [F, G, G]
    return float(h.sum() / (f.shape[0] * f.shape[1] * (f.shape[1] - 1)))


def nearest_holder_hops(mapping: Mapping) -> float:
    """Mean over devices and over the other TP groups of the hops to that group's nearest member.

    The variant where each device fetches from the nearest holder of each group (the
    routing the traffic model uses) rather than from fixed FTD partners.
    """
    hops = mesh_hops(mapping.rows, mapping.cols)
    g = mapping.groups
    dist = hops[:, g].min(-1)  # [D, G]
    own = np.zeros_like(dist, bool)
    own[g.reshape(-1), np.repeat(np.arange(g.shape[0]), g.shape[1])] = True
    if g.shape[0] < 2:
        return 0.0
    return float(np.where(own, 0, dist).sum() / (dist.shape[0] * (g.shape[0] - 1)))


def ftd_bounding_boxes(mapping: Mapping) -> np.ndarray:
    """int [F, 4]: (row_min, row_max, col_min, col_max) of each FTD."""
    r, c = np.divmod(mapping.ftds, mapping.cols)
    return np.stack([r.min(1), r.max(1), c.min(1), c.max(1)], -1)


def ftd_overlaps(mapping: Mapping) -> dict[str, float]:
    """001 §IV-A "Congestion": how FTD areas (bounding boxes) intersect.

    Returns the mean FTD area (devices in the bounding box), the number of devices covered by
    two or more FTD areas, and the largest number of FTD areas covering one device.
    """
    boxes = ftd_bounding_boxes(mapping)
    r, c = np.divmod(np.arange(mapping.num_devices), mapping.cols)
    inside = ((r[None] >= boxes[:, :1]) & (r[None] <= boxes[:, 1:2])
              & (c[None] >= boxes[:, 2:3]) & (c[None] <= boxes[:, 3:4]))  # [F, D]
    cover = inside.sum(0)
    area = (boxes[:, 1] - boxes[:, 0] + 1) * (boxes[:, 3] - boxes[:, 2] + 1)
    return {"mean_area": float(area.mean()), "shared_devices": int((cover >= 2).sum()),
            "max_cover": int(cover.max())}


def source_split(holders: np.ndarray, cost: np.ndarray) -> np.ndarray:
    """float [H, D(dst), D(src)]: share of holder set h's tokens that dst d fetches from src s.

    001 §IV-A: a device fetches a token from the nearest device holding it (lowest `cost`
    [D, D], hops on a mesh, path latency elsewhere); equally near holders split the fetches
    evenly (the path diversity the retained all-gather gives, Fig. 9).
    """
    big = np.where(holders[:, None, :] > 0, cost.T[None, :, :], np.inf)  # [H, dst, src]
    best = big.min(-1, keepdims=True)
    near = (big <= best + 1e-15) & np.isfinite(big)
    return (near / near.sum(-1, keepdims=True)).astype(np.float32)


def ftd_source_split(mapping: Mapping) -> np.ndarray:
    """float [G, D(dst), D(src)]: dst d fetches TP group s's tokens from its own FTD's member.

    001 §IV-A: "Within an FTD, any device can access all required tokens, confining
    communication to this domain": device d in FTD f takes group s's tokens from ftds[f, s]
    (itself when d is that member). Used when the all-gather is retained (flat mappings).
    """
    g, d = mapping.num_groups, mapping.num_devices
    ftd_of = np.empty(d, np.int64)
    ftd_of[mapping.ftds] = np.arange(mapping.ftds.shape[0])[:, None]
    split = np.zeros((g, d, d), np.float32)
    src = mapping.ftds[ftd_of]  # [D(dst), G]
    split[np.arange(g)[None, :], np.arange(d)[:, None], src] = 1.0
    return split


def her_source_split(mapping: Mapping) -> np.ndarray:
    """float [P, D(dst), D(src)]: under HER dst d fetches from the holder on its own wafer.

    001 §IV-B4: after the inter-wafer all-gather "each WSC contains tokens from all wafers,
    confining subsequent all-to-all exchanges within individual WSCs".
    """
    peers = mapping.wafer_peers  # [P, W]
    p, w = peers.shape
    d = mapping.num_devices
    wafer_of = np.empty(d, np.int64)
    wafer_of[peers] = np.arange(w)[None, :]
    split = np.zeros((p, d, d), np.float32)
    split[np.arange(p)[None, :], np.arange(d)[:, None], peers[:, wafer_of].T] = 1.0
    return split


# --- ESP: Expert Sharding Parallelism (001 §VI-B5, Fig. 14(a)) ------------------------------


def esp_groups(rows: int, cols: int, shards: int) -> np.ndarray:
    """int [X, S]: the EP groups of ESP, compact tiles of S = `shards` devices, ring order.

    001 §VI-B5: large experts are sliced over the devices of an EP group. On a mesh the
    groups are compact tiles (the same tiling as ER-Mapping's FTDs, so with S = D / TP under
    ER every EP group is an FTD); members are in ring order (the partial-sum rings). A
    non-mesh platform is passed as a 1 x D line: contiguous blocks of S devices (a DGX node
    when S = 8).
    """
    d = rows * cols
    if shards < 2 or d % shards:
        raise ConfigError(f"expert_shards = {shards} must be 0 (off) or an integer >= 2 "
                          f"dividing the {d} devices")
    try:
        th, tw = tile_shape(rows, cols, shards)
    except ConfigError:
        raise ConfigError(f"expert_shards = {shards}: cannot tile the {rows}x{cols} mesh into "
                          f"compact EP groups of {shards} devices; choose a divisor whose "
                          "blocks tile the mesh") from None
    origins, _ = _tiles(rows, cols, th, tw)
    ring = np.array(ring_order(th, tw))
    return _ids(origins[:, None, :] + ring[None, :, :], cols)


def esp_landing(holders: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """float [H, X, D]: where a token of holder set h enters EP group x (shares sum to 1).

    001 §VI-B5: ESP first gathers every token into the EP group of its expert. A token whose
    holder set has members inside the group is already there (split evenly over those
    members, no traffic: "all tokens across TP groups reside within each FTD" under ER); any
    other token lands once on the group's member at position h mod S, fetched from its
    nearest holder (`source_split`), and is then all-gathered inside the group.
    """
    h_count, d = holders.shape
    x_count, s = groups.shape
    inside = (holders[:, groups] > 0).astype(np.float64)  # [H, X, S]
    n_in = inside.sum(-1, keepdims=True)
    fallback = np.zeros((h_count, 1, s))
    fallback[np.arange(h_count), 0, np.arange(h_count) % s] = 1.0
    share = np.where(n_in > 0, inside / np.maximum(n_in, 1.0), fallback)  # [H, X, S]
    land = np.zeros((h_count, x_count, d), np.float32)
    land[:, np.arange(x_count)[:, None], groups] = share
    return land
