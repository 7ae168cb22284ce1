"""One verification step's tree, drawn as SVG: what the drafter proposed, what the target accepted, where it stopped.

Layout is a tidy tree laid out left to right: depth is the column, and each leaf gets its own row, a parent sitting
at the middle of its children, so a 64-node REST tree is a readable grid rather than a nested list.
"""
from __future__ import annotations

import html

from specdemo.tree import DraftTree

COL_W, ROW_H, BOX_W, BOX_H, PAD = 118, 26, 104, 20, 8
MAX_LABEL = 10  # characters of a token shown in its box (the tooltip has all of it)


def visible(text: str) -> str:
    """A token as a label: whitespace made visible."""
    return text.replace(" ", "␣").replace("\n", "↵").replace("\t", "⇥") or "∅"


def source_kind(source: str | None) -> str:
    """Where a token came from, as the page's colour classes name it: prompt, datastore, head1..head4 (deeper heads
    share head4's colour), adaptive, probe, draft, or own (the target's own token)."""
    if source is None:
        return "own"
    if source == "context":
        return "prompt"
    if source.startswith("head") and source[4:].isdigit():
        return f"head{min(int(source[4:]), 4)}"
    return source if source in ("datastore", "adaptive", "probe") else "draft"


def tree_svg(tree: DraftTree, accepted: list[int], own: int | None, root: int | None,
             token_text: dict[int, str]) -> str:
    """The tree as an inline SVG.  `accepted` are the accepted node indices (a path from the root), `own` is the
    token the target chose where the walk stopped (None when the last committed token was a draft), `root` the
    committed token the tree hangs off."""
    n = len(tree)
    stop_at = accepted[-1] if accepted else -1
    kids: dict[int, list[int]] = {}
    for i, p in enumerate(tree.parents):
        kids.setdefault(p, []).append(i)
    OWN = n  # a pseudo node for the target's own token, first among its siblings
    if own is not None:
        kids.setdefault(stop_at, []).insert(0, OWN)
    depth = {-1: 0}
    for i, p in enumerate(tree.parents):
        depth[i] = depth[p] + 1
    depth[OWN] = depth[stop_at] + 1
    row: dict[int, float] = {}
    next_row = 0

    def place(node: int) -> float:
        nonlocal next_row
        children = kids.get(node, []) if node != OWN else []
        if not children:
            row[node] = next_row
            next_row += 1
        else:
            rows = [place(c) for c in children]
            row[node] = (rows[0] + rows[-1]) / 2
        return row[node]

    place(-1)
    acc = set(accepted)
    width = PAD * 2 + COL_W * max(depth.values()) + BOX_W
    height = PAD * 2 + ROW_H * max(next_row, 1)
    xy = {k: (PAD + COL_W * depth[k], PAD + ROW_H * r) for k, r in row.items()}
    edges, boxes = [], []
    for node, children in kids.items():
        x0, y0 = xy[node]
        for c in children:
            x1, y1 = xy[c]
            cls = "sd-e-acc" if (c in acc or c == OWN) else "sd-e"
            edges.append(f'<path class="{cls}" d="M{x0 + BOX_W},{y0 + BOX_H / 2} C{x0 + BOX_W + 8},{y0 + BOX_H / 2} '
                         f'{x1 - 8},{y1 + BOX_H / 2} {x1},{y1 + BOX_H / 2}"/>')
    for node, (x, y) in xy.items():
        score = None
        if node == -1:
            tok, cls, tip = root, "sd-t-root", "the newest committed token: the tree hangs off it"
        elif node == OWN:
            tok, cls, tip = own, "sd-t-own", "the token the target chose here"
        else:
            tok = tree.tokens[node]
            src = tree.sources[node] if tree.sources else None
            probe = tree.is_probe(node)
            cls = ("sd-t-probe" if probe else "sd-t-acc" if node in acc
                   else "sd-t-rej" if tree.parents[node] == stop_at and own is not None else "sd-t-other")
            score = tree.scores[node] if tree.scores else None
            tip = (f"node {node} · depth {depth[node]} · source: {src or 'draft'}"
                   + (f" · drafter's estimate {score:.2f}" if score is not None else "")
                   + (" · probe" if probe else ""))
            cls += f" sd-k-{source_kind(src or 'draft')}"
        text = visible(token_text.get(tok, f"#{tok}") if tok is not None else "")
        label = text if len(text) <= MAX_LABEL else text[:MAX_LABEL - 1] + "…"
        title = html.escape(f"{text} · {tip}", quote=False)
        star = "★ " if node == OWN else ""
        score_txt = ("" if score is None else
                     f'<text class="sd-t-score" x="{x + BOX_W - 3}" y="{y + BOX_H - 5}">{score:.2f}</text>')
        name = "root" if node == -1 else "own" if node == OWN else node
        boxes.append(f'<g class="sd-t {cls}" data-node="{name}">'
                     f'<title>{title}</title><rect x="{x}" y="{y}" width="{BOX_W}" height="{BOX_H}" rx="4"/>'
                     f'<text x="{x + 5}" y="{y + BOX_H - 6}">{html.escape(star + label, quote=False)}</text>'
                     f'{score_txt}</g>')
    return (f'<svg class="sd-tree-svg" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" role="img" aria-label="draft tree, {n} nodes">'
            f'{"".join(edges)}{"".join(boxes)}</svg>')
