"""One verification step's tree, drawn as SVG: what the drafter proposed, what the target accepted, where it stopped.

Layout is a tidy tree laid out left to right: depth is the column, and each leaf gets its own row, a parent sitting
at the middle of its children, so a 64-node REST tree is a readable grid rather than a nested list.
"""
from __future__ import annotations

import html
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the drawing reads a tree's fields only; rendering stays free of torch
    from specdemo.tree import DraftTree

COL_W, ROW_H, BOX_W, BOX_H, PAD = 118, 26, 104, 20, 8
MAX_LABEL = 10  # characters of a token shown in its box (the tooltip has all of it)


def visible(text: str) -> str:
    """A token as a label: whitespace made visible."""
    return text.replace(" ", "␣").replace("\n", "↵").replace("\t", "⇥") or "∅"


@dataclass
class Layout:
    """Where every node sits: `kids` per parent (-1 the root; the pseudo node `own`, the target's own token, first
    among its siblings), each node's depth (its column) and row."""

    kids: dict[int, list[int]]
    depth: dict[int, int]
    row: dict[int, float]
    rows: int
    own: int


def layout(tree: DraftTree, stop_at: int, own: int | None) -> Layout:
    """A tidy tree: each leaf its own row, a parent at the middle of its children."""
    own_node = len(tree)
    kids: dict[int, list[int]] = {}
    for i, p in enumerate(tree.parents):
        kids.setdefault(p, []).append(i)
    if own is not None:
        kids.setdefault(stop_at, []).insert(0, own_node)
    depth = {-1: 0}
    for i, p in enumerate(tree.parents):
        depth[i] = depth[p] + 1
    depth[own_node] = depth[stop_at] + 1
    row: dict[int, float] = {}
    next_row = 0

    def place(node: int) -> float:
        nonlocal next_row
        children = kids.get(node, []) if node != own_node else []
        if not children:
            row[node] = next_row
            next_row += 1
        else:
            rows = [place(c) for c in children]
            row[node] = (rows[0] + rows[-1]) / 2
        return row[node]

    place(-1)
    return Layout(kids, depth, row, max(next_row, 1), own_node)


def _node_kind(tree: DraftTree, node: int, accepted: set[int], stop_at: int, own: int | None) -> str:
    if tree.is_probe(node):
        return "sd-t-probe"
    if node in accepted:
        return "sd-t-acc"
    return "sd-t-rej" if tree.parents[node] == stop_at and own is not None else "sd-t-other"


def _box(x: float, y: float, node, cls: str, text: str, tip: str, score: float | None, src: str | None) -> str:
    label = text if len(text) <= MAX_LABEL else text[:MAX_LABEL - 1] + "…"
    title = html.escape(f"{text} · {tip}", quote=False)
    score_txt = ("" if score is None else
                 f'<text class="sd-t-score" x="{x + BOX_W - 3}" y="{y + BOX_H - 5}">{score:.2f}</text>')
    src_attr = f' data-src="{html.escape(src)}"' if src else ""
    return (f'<g class="sd-t {cls}" data-node="{node}"{src_attr}><title>{title}</title>'
            f'<rect x="{x}" y="{y}" width="{BOX_W}" height="{BOX_H}" rx="4"/>'
            f'<text x="{x + 5}" y="{y + BOX_H - 6}">{html.escape(label, quote=False)}</text>{score_txt}</g>')


def tree_svg(tree: DraftTree, accepted: list[int], own: int | None, root: int | None,
             token_text: dict[int, str]) -> str:
    """The tree as an inline SVG.  `accepted` are the accepted node indices (a path from the root), `own` is the
    token the target chose where the walk stopped (None when the last committed token was a draft), `root` the
    committed token the tree hangs off."""
    stop_at = accepted[-1] if accepted else -1
    lay = layout(tree, stop_at, own)
    acc = set(accepted)
    width = PAD * 2 + COL_W * max(lay.depth.values()) + BOX_W
    height = PAD * 2 + ROW_H * lay.rows
    xy = {k: (PAD + COL_W * lay.depth[k], PAD + ROW_H * r) for k, r in lay.row.items()}
    edges, boxes = [], []
    for node, children in lay.kids.items():
        x0, y0 = xy[node]
        for c in children:
            x1, y1 = xy[c]
            cls = "sd-e-acc" if (c in acc or c == lay.own) else "sd-e"
            edges.append(f'<path class="{cls}" d="M{x0 + BOX_W},{y0 + BOX_H / 2} C{x0 + BOX_W + 8},{y0 + BOX_H / 2} '
                         f'{x1 - 8},{y1 + BOX_H / 2} {x1},{y1 + BOX_H / 2}"/>')
    label = lambda tok: visible(token_text.get(tok, f"#{tok}") if tok is not None else "")  # noqa: E731
    for node, (x, y) in xy.items():
        if node == -1:
            boxes.append(_box(x, y, "root", "sd-t-root", label(root),
                              "the newest committed token: the tree hangs off it", None, None))
        elif node == lay.own:
            boxes.append(_box(x, y, "own", "sd-t-own", "★ " + label(own), "the token the target chose here", None,
                              None))
        else:
            src = tree.sources[node] if tree.sources else None
            score = tree.scores[node] if tree.scores else None
            tip = (f"node {node} · depth {lay.depth[node]} · source: {src or 'draft'}"
                   + (f" · drafter's estimate {score:.2f}" if score is not None else "")
                   + (" · probe" if tree.is_probe(node) else ""))
            boxes.append(_box(x, y, node, _node_kind(tree, node, acc, stop_at, own), label(tree.tokens[node]), tip,
                              score, src))
    return (f'<svg class="sd-tree-svg" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" role="img" aria-label="draft tree, {len(tree)} nodes">'
            f'{"".join(edges)}{"".join(boxes)}</svg>')
